"""Causality by digest: where a difference started is found by the values ops passed on, not by
the order their records arrived in (graph ops record on parallel threads).

Probe round 32, F1: a Keras ``fit`` on ``Dataset.from_generator`` whose generator varied from
batch 17 on named, in 3 of 6 ``nddebug run`` comparisons, a ``Relu`` as the op where the
difference entered TensorFlow, and in the other 3 the ``OptionalGetValue`` that handed out the
batch: whichever record arrived first. These recordings are built by hand, with the records in
the order that misled the analysis, so the passes are tested alone and deterministically.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nddebug.analysis import align, compare_recordings, digest_flow, downstream
from nddebug.recording import Event, OpInfo, Recording

_OPS = {
    # op id: (op type, resource it acts on)
    0: ("OptionalGetValue", ""),  # hands out the pipeline's element (its input: a variant)
    1: ("Relu", ""),  # reads the element (a fused MatMul + BiasAdd + Relu records its input)
    2: ("AssignVariableOp", "eager:7"),  # the update the element's gradient makes
    3: ("ReadVariableOp", "eager:7"),  # a later read of that variable
    4: ("MatMul", ""),  # an op the difference never reached
}


def _op(op_id: int, op_type: str, resource: str = "") -> OpInfo:
    """A graph op of function ``f`` with one float output."""
    return OpInfo(
        op_id=op_id,
        key=f"f/{op_type}",
        op_type=op_type,
        op_name=op_type,
        graph="f",
        device="/device:CPU:0",
        location="train.py:9 (main)",
        dtypes=["float32"],
        shapes=[[4]],
        digestible=[True],
        resource=resource,
    )


def _run(element: int, order: list[int]) -> Recording:
    """One run: the element differs between runs by ``element``; events arrive in ``order``."""
    rec = Recording(label=f"run {element}", digest_algorithm="x", kind="run")
    for op_id, (op_type, resource) in _OPS.items():
        rec.ops[op_id] = _op(op_id, op_type, resource)
    a, b, w = (10 + element, 1), (20 + element, 1), (30 + element, 1)
    made = {
        0: ([a], []),
        1: ([b], [a]),
        2: ([w], [b]),
        3: ([w], []),
        4: ([(5, 5)], [(4, 4)]),
    }
    for seq, op_id in enumerate(order):
        digests, inputs = made[op_id]
        rec.events.append(Event(seq, op_id, -1, digests, inputs))
    return rec


def test_the_value_flow_links_each_finding_to_what_it_read() -> None:
    order = [0, 1, 2, 3, 4]
    runs = [_run(0, order), _run(1, order)]
    findings = compare_recordings(runs).findings
    per_run_units, _ = align(runs)
    flow = digest_flow(findings, per_run_units)
    assert flow["f/Relu"] == {"f/OptionalGetValue"}
    assert flow["f/AssignVariableOp"] == {"f/Relu"}
    assert flow["f/OptionalGetValue"] == set()
    assert downstream("f/OptionalGetValue", flow) == {"f/Relu", "f/AssignVariableOp"}


def test_an_element_recorded_after_its_readers_is_still_where_the_difference_started() -> None:
    # The update and the read after it arrive first, the element last: arrival order named
    # the update as where the difference entered TensorFlow.
    late = [2, 3, 1, 0, 4]
    report = compare_recordings([_run(0, late), _run(1, late)])
    roles = {f.op.op_type: f.role for f in report.findings}
    assert roles["OptionalGetValue"] == "source", roles
    assert {roles["Relu"], roles["AssignVariableOp"], roles["ReadVariableOp"]} == {"propagated"}
    assert "MatMul" not in roles  # it did not differ
    # In arrival order as the analysis expected it, the same answer.
    early = [0, 1, 2, 3, 4]
    report = compare_recordings([_run(0, early), _run(1, early)])
    assert {f.op.op_type for f in report.findings if f.role == "source"} == {"OptionalGetValue"}


def test_with_no_source_the_entry_point_is_the_first_op_that_read_nothing_differing() -> None:
    # The element is a plain graph op here (no container, no source test can hold: its input
    # differs too, as a Python value fed in would): the entry point is the op the others read
    # from, not the update whose record came first.
    late = [2, 3, 1, 0, 4]
    runs = []
    for element in (0, 1):
        rec = _run(element, late)
        rec.ops[0].op_type = "Cast"
        rec.ops[0].key = "f/Cast"
        for ev in rec.events:
            if ev.op_id == 0:
                ev.inputs = [(99 + element, 1)]  # what came in from Python differed
        runs.append(rec)
    report = compare_recordings(runs)
    sources = [f for f in report.findings if f.role == "source"]
    assert [f.op.op_type for f in sources] == ["Cast"], [
        (f.op.op_type, f.role) for f in report.findings
    ]
    assert sources[0].entered


def test_a_value_equal_in_every_run_links_nothing() -> None:
    """A constant the source reads happens to have the digest of what a later op output in
    one run (a digest covers bytes only: every empty tensor is (0, 0), a 4-byte zero is int32
    0 and float32 0.0). Linked through it, the source looked downstream of that op, and the
    container in between was kept as a second source."""
    kinds = {0: "Sum", 1: "TensorListSetItem", 2: "TensorListGetItem", 3: "Relu"}
    runs = []
    for element in (0, 1):
        rec = Recording(label=f"run {element}", digest_algorithm="x", kind="run")
        for op_id, op_type in kinds.items():
            rec.ops[op_id] = _op(op_id, op_type)
        s, g = (40 + element, 1), (50 + element, 1)
        relu = (7, 7) if element == 0 else (9, 9)
        made = {0: ([s], [(7, 7)]), 1: ([], [s]), 2: ([g], []), 3: ([relu], [g])}
        for seq, op_id in enumerate([3, 2, 0, 1]):  # the reader's record first
            digests, inputs = made[op_id]
            rec.events.append(Event(seq, op_id, -1, digests, inputs))
        runs.append(rec)
    roles = {f.op.op_type: f.role for f in compare_recordings(runs).findings}
    assert roles["Sum"] == "source", roles
    assert roles["TensorListGetItem"] == "propagated", roles


def _program(spec: dict[int, tuple[str, str]], made: Any, order: list[int]) -> list[Recording]:
    """Two runs of one program: ``spec`` is op id -> (key, op type), ops numbered as they
    were made; ``made(run)`` gives op id -> (output digests, input digests) for that run;
    records arrive in ``order``."""
    runs = []
    for run in (0, 1):
        rec = Recording(label=f"run {run}", digest_algorithm="x", kind="run")
        for op_id, (key, op_type) in spec.items():
            rec.ops[op_id] = dataclasses.replace(_op(op_id, op_type), key=key, op_name=key)
        values = made(run)
        for seq, op_id in enumerate(order):
            digests, inputs = values[op_id]
            rec.events.append(Event(seq, op_id, -1, digests, inputs))
        runs.append(rec)
    return runs


def test_an_op_made_later_in_the_graph_did_not_feed_an_earlier_one() -> None:
    """Probe round 41, F2: ``loss * s`` with ``s`` a Python value. The gradient's ``1.0 * s``
    outputs the bits of ``s``; the forward ``mul``, which read ``s`` where it came in, was
    linked to it by digest and called propagated, and only the gradient op was named. An op
    made after another in the same graph cannot feed it."""
    spec = {0: ("f/mul", "Mul"), 1: ("f/grad/mul", "Mul"), 2: ("f/grad/Tile", "Tile")}

    def made(run: int) -> dict[int, tuple[list[Any], list[Any]]]:
        s, loss = (60 + run, 1), (70 + run, 1)
        mean, one = (5, 5), (1, 1)  # equal in both runs
        return {0: ([loss], [mean, s]), 1: ([s], [one, s]), 2: ([(80 + run, 1)], [s])}

    findings = compare_recordings(_program(spec, made, [1, 2, 0])).findings
    roles = {f.key: f.role for f in findings}
    assert roles == {"f/mul": "source", "f/grad/mul": "source", "f/grad/Tile": "propagated"}
    assert all(f.entered for f in findings if f.role == "source")


def test_an_op_made_later_in_a_loop_body_feeds_the_next_iteration() -> None:
    """The rule above within one execution of a graph only: a loop's body hands what an op
    made late in it output to the ops at its top in the next iteration (the loop's
    variables). Here ``next`` reads a value from outside in every iteration, and ``top``
    reads, from the second iteration on, what ``next`` output in the one before: it only
    carries the difference."""
    runs = []
    for run in (0, 1):
        rec = Recording(label=f"run {run}", digest_algorithm="x", kind="run")
        for op_id, op_type in ((0, "Tanh"), (1, "Mul")):
            rec.ops[op_id] = dataclasses.replace(
                _op(op_id, op_type), key=f"body/{op_type}", graph="body"
            )
        h, x = (5, 5), (60 + run, 1)  # the loop's start value is equal, x is not
        for it in range(3):
            top = (70 + 10 * it + run, 1) if it else (6, 6)
            rec.events.append(Event(2 * it, 0, -1, [top], [h]))
            h = (100 + 10 * it + run, 1)
            rec.events.append(Event(2 * it + 1, 1, -1, [h], [top, x]))
        runs.append(rec)
    roles = {f.key: f.role for f in compare_recordings(runs).findings}
    assert roles == {"body/Mul": "source", "body/Tanh": "propagated"}, roles


def test_every_op_that_read_a_value_from_outside_in_the_first_call_is_an_entry() -> None:
    """Probe round 41, F2b: a data order that changed made the features and the labels
    differ. Only the labels' ``Cast`` was named (one entry point per comparison); the
    model's input ``Cast`` was called propagated. An op that also reads a differing value
    from another finding (``Sub`` reads the prediction) is still where the labels came in;
    a loop whose compared inputs were equal, and the eager call whose ops are recorded, only
    carry it."""
    spec = {
        0: ("f/Cast", "Cast"),
        1: ("f/MatMul", "MatMul"),
        2: ("f/Cast_1", "Cast"),
        3: ("f/Sub", "Sub"),
        4: ("f/while", "While"),
        5: ("__inference_step_1", "__inference_step_1"),
    }

    def made(run: int) -> dict[int, tuple[list[Any], list[Any]]]:
        x, y = (10 + run, 1), (20 + run, 1)
        a, p, b, d = (30 + run, 1), (40 + run, 1), (50 + run, 1), (90 + run, 1)
        return {
            0: ([a], [x]),
            1: ([p], [a, (3, 3)]),
            2: ([b], [y]),
            3: ([d], [p, y]),  # the labels read directly, and the prediction
            4: ([(95 + run, 1)], [(4, 4)]),  # its list input is not compared
            5: ([d], [x, y]),
        }

    runs = _program(spec, made, [3, 1, 2, 0, 4, 5])
    for rec in runs:
        rec.ops[5] = dataclasses.replace(rec.ops[5], graph="", function="instrumented")
    roles = {f.key: f.role for f in compare_recordings(runs).findings}
    sources = {k for k, role in roles.items() if role == "source"}
    assert sources == {"f/Cast", "f/Cast_1", "f/Sub"}, roles


def test_a_python_scale_factor_is_named_at_each_op_that_read_it() -> None:
    """The same as the two tests above with real TensorFlow: two traced calls of a step whose
    loss is scaled by a Python value, 1.0 and then 1.5. Both ops that read the value where it
    came in are sources; the gradient ops after them only carry it."""
    import tensorflow as tf

    import nddebug

    w = tf.Variable(tf.random.stateless_normal([4, 1], seed=[1, 2]))
    start = w.numpy()
    x = tf.random.stateless_normal([8, 4], seed=[3, 4])
    y = tf.random.stateless_normal([8, 1], seed=[5, 6])

    @tf.function
    def step(x: Any, y: Any, s: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w - y) ** 2) * s
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    recs = []
    for s in (1.0, 1.5):
        w.assign(start)
        with nddebug.trace() as rec:
            step(x, y, tf.constant(s))
        recs.append(rec)
    findings = nddebug.compare(recs).comparison.findings
    sources = {f.op.op_name for f in findings if f.role == "source"}
    assert sources == {"mul", "gradient_tape/mul/Mul"}, [(f.op.op_name, f.role) for f in findings]
    assert any(f.op.op_type == "AssignSubVariableOp" and f.role == "propagated" for f in findings)


def test_a_read_of_what_an_xla_call_wrote_only_carries_its_difference() -> None:
    """Probe round 43, F1: a training loop that reads its weights after an XLA-compiled step
    (a hash, a checkpoint) had those reads named the sources, "changed outside the traced
    block", and the compiled call that read the differing batch called propagated. The call
    writes the variables it captures (their values after it are its outputs): a read of one
    after a divergent call only carries the difference."""
    import tensorflow as tf

    import nddebug

    w = tf.Variable(tf.random.stateless_normal([8, 3], seed=[1, 2]))
    start = w.numpy()

    @tf.function(jit_compile=True)
    def step(x: Any) -> Any:
        h = x @ w
        w.assign_sub(0.01 * tf.matmul(x, h, transpose_a=True))
        return tf.reduce_sum(h)

    x = tf.random.stateless_normal([4, 8], seed=[3, 4])
    step(x)  # compiled before the blocks, as a loop's first step is
    recs = []
    for scale in (1.0, 1.001):
        w.assign(start)
        with nddebug.trace() as rec:
            step(x * scale)
            w.numpy()  # the weights read after the step
        recs.append(rec)
    findings = nddebug.compare(recs).comparison.findings
    roles = {(f.op.op_type, f.role) for f in findings}
    reads = [f for f in findings if f.op.op_type == "ReadVariableOp"]
    assert reads and all(f.role == "propagated" for f in reads), roles
    sources = [f for f in findings if f.role == "source"]
    assert sources and all(f.op.op_type != "ReadVariableOp" for f in sources), roles


def test_a_source_between_runs_in_other_kernel_settings_is_not_called_non_deterministic() -> None:
    """Probe round 43, F2: `nddebug diff` of a MatMul recorded with 1 and with 2 intra-op
    threads said "the kernel itself is non-deterministic", though it gives the same bits
    every time at a fixed thread count (check() there said reproducible). The settings that
    differ are said; runs in one setting keep the kernel's explanation."""
    spec = {0: ("f/MatMul", "MatMul")}

    def made(run: int) -> dict[int, tuple[list[Any], list[Any]]]:
        return {0: ([(10 + run, 1)], [(1, 1), (2, 2)])}

    runs = _program(spec, made, [0])
    for threads, rec in zip((1, 2), runs, strict=True):
        rec.environment = {"threads": {"intra_op": threads}, "seeds": {"hash": str(threads)}}
    (finding,) = compare_recordings(runs).findings
    assert finding.role == "source" and "threads.intra_op: 1 -> 2" in finding.explanation
    assert "non-deterministic" not in finding.explanation, finding.explanation
    for rec in runs:  # the same settings (seeds apart): the kernel varies by itself
        rec.environment["threads"]["intra_op"] = 2
    (finding,) = compare_recordings(runs).findings
    assert "the kernel itself is non-deterministic" in finding.explanation, finding.explanation


def test_an_entry_recorded_with_the_kernels_fused_into_it_names_them() -> None:
    """Probe round 43, F3: a Dense layer's MatMul -> BiasAdd -> Relu, which grappler fuses and
    nddebug records as one unit, read a batch that differed between two blocks: the source
    was a bare Relu "that read Python values", with no word of the MatMul that read them."""
    import tensorflow as tf

    import nddebug

    w = tf.random.stateless_normal([8, 16], seed=[1, 2])
    b = tf.random.stateless_normal([16], seed=[3, 4])

    @tf.function
    def layer(x: Any) -> Any:
        return tf.reduce_sum(tf.nn.relu(tf.nn.bias_add(x @ w, b)))

    recs = []
    for scale in (1.0, 1.001):
        x = tf.random.stateless_normal([4, 8], seed=[5, 6]) * scale  # made before the block
        with nddebug.trace() as rec:
            layer(x)
        recs.append(rec)
    sources = [f for f in nddebug.compare(recs).comparison.findings if f.role == "source"]
    fused = [f for f in sources if f.op.fused]
    assert fused, [(f.op.op_type, f.op.fused) for f in sources]
    assert all("MatMul" in f.explanation and "one unit" in f.explanation for f in fused), [
        f.explanation for f in fused
    ]
