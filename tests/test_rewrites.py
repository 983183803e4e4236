"""Grappler's single-consumer rewrites (nddebug/data/rewrites.toml). A digest is one more
consumer of the output it reads, and grappler rewrites some patterns only where the
intermediate has one consumer: nddebug leaves such an intermediate undigested, records the
chain as one unit at the op that fuses with it, and the analysis and the risks see through
that unit to the kernels in it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug import analysis, risks
from nddebug.recording import Event, OpInfo, Recording
from nddebug.tracer import rewrites


def test_the_shipped_table_names_real_ops_and_says_why() -> None:
    table = rewrites.table()
    assert {"sum and product chains", "SqrtDivToRsqrtMul"} <= {r.name for r in table}
    for r in table:
        for op_type in {op for pair in r.pairs for op in pair}:
            assert hasattr(tf.raw_ops, op_type), f"{r.name}: {op_type} is not a TensorFlow op"
        assert r.bits and r.source, r.name


_GOOD = """schema = 1
[[rewrite]]
name = "x"
optimizer = "arithmetic"
producers = ["Sqrt"]
consumers = ["RealDiv"]
where = ["any"]
bits = "yes"
source = "here"
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("schema = 1", "schema = 9"), "schema must be 1"),
        (('where = ["any"]', 'where = ["tpu"]'), "where must be a list of"),
        (('producers = ["Sqrt"]', "producers = []"), "producers must be a non-empty list"),
        (('bits = "yes"', 'bits = "yes"\ncolour = "red"'), r"unknown fields \['colour'\]"),
        (('source = "here"', ""), r"missing \['source'\]"),
        (('where = ["any"]', 'where = ["any"]\ninput = -1'), "input must be a position"),
        (('consumers = ["RealDiv"]', 'consumers = ["RealDiv"]\npairs = [["A", "B"]]'), "either"),
        (('producers = ["Sqrt"]\nconsumers = ["RealDiv"]', 'pairs = [["Sqrt"]]'), "pairs must"),
        (('where = ["any"]', 'where = ["any"]\nstarts = [["Sqrt", "Mul"]]'), "starts must"),
    ],
)
def test_a_broken_table_is_refused_with_the_entry_named(change: tuple[str, str], message: str):
    assert rewrites.parse(_GOOD)[0].pairs == {("Sqrt", "RealDiv")}
    with pytest.raises(ValueError, match=message) as err:
        rewrites.parse(_GOOD.replace(*change), origin="t.toml")
    assert "t.toml" in str(err.value)


def _sqrt_div() -> Any:
    """Adadelta's and Adagrad's update shape: x / sqrt(y), which grappler turns into
    x * rsqrt(y) where the Sqrt has one consumer."""

    @tf.function
    def step(x, y):
        return x / tf.sqrt(y + 1.0)

    return step


def test_sqrt_div_keeps_the_rsqrt_rewrite_and_is_recorded_as_one_unit() -> None:
    rng = np.random.RandomState(0)
    x = tf.constant(rng.randn(1 << 16).astype("float32") * 100)
    y = tf.constant(rng.rand(1 << 16).astype("float32") * 1000)
    plain = _sqrt_div()(x, y).numpy().tobytes()
    before = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    try:
        assert _sqrt_div()(x, y).numpy().tobytes() != plain  # the rewrite changes the bits
    finally:
        tf.config.optimizer.set_experimental_options(
            {"arithmetic_optimization": before.get("arithmetic_optimization", True)}
        )
    step = _sqrt_div()
    with nddebug.trace() as rec:
        assert step(x, y).numpy().tobytes() == plain
    assert step(x, y).numpy().tobytes() == plain  # and after the block
    types = [rec.ops[e.op_id].op_type for e in rec.events]
    assert "Sqrt" not in types and types.count("RealDiv") == 1, types
    (div,) = [rec.ops[e.op_id] for e in rec.events if rec.ops[e.op_id].op_type == "RealDiv"]
    assert list(div.fused.values()) == ["Sqrt"], div.fused
    # Its record holds what the rewritten op reads: x, and y + 1 (the Sqrt's input).
    (event,) = [e for e in rec.events if e.op_id == div.op_id]
    (add,) = [e for e in rec.events if rec.ops[e.op_id].op_type == "AddV2"]
    assert event.inputs[1] == add.digests[0] and len(event.inputs) == 2


def test_a_second_reader_still_gets_the_intermediate_recorded() -> None:
    """Where something outside the pattern reads the intermediate too, grappler does not
    rewrite it, and nddebug records it."""

    @tf.function
    def step(x):
        s = tf.sqrt(x)
        return x / s, tf.reduce_sum(s)

    with nddebug.trace() as rec:
        step(tf.constant([1.0, 4.0, 9.0]))
    types = [rec.ops[e.op_id].op_type for e in rec.events]
    assert "Sqrt" in types and "RealDiv" in types, types


def _op(op_id: int, key: str, op_type: str, device: str, fused: dict | None = None) -> OpInfo:
    return OpInfo(
        op_id,
        key,
        op_type,
        key,
        "f",
        device,
        "train.py:3",
        ["float32"],
        [[4]],
        [True],
        fused=fused or {},
    )


def _runs(ops: list[OpInfo], outputs: list[list[int]]) -> list[Recording]:
    """One recording per run: each op executes once with identical inputs; ``outputs`` gives
    each run's output per op."""
    runs = []
    for values in outputs:
        rec = Recording(digest_algorithm="test", environment={"devices": ["GPU:0"]})
        rec.ops[0] = _op(0, "eager:call", "__inference_f", "GPU:0")
        for seq, (op, value) in enumerate(zip(ops, values, strict=True)):
            rec.ops[op.op_id] = op
            rec.events.append(Event(seq, op.op_id, 10, [(value, 0)], [(7, 7)]))
        rec.events.append(Event(10, 0, 10, [(99, 0)], []))
        runs.append(rec)
    return runs


def test_a_unit_source_names_the_known_kernel_fused_into_it() -> None:
    relu = _op(1, "f/Relu", "Relu", "GPU:0", {"f/Conv2D": "Conv2D", "f/BiasAdd": "BiasAdd"})
    runs = _runs([relu], [[1], [2]])
    comparison = analysis.compare_recordings(runs)
    (source,) = [f for f in comparison.findings if f.role == "source"]
    assert source.key == "f/Relu"
    assert source.culprit is not None and "Conv2D" in source.culprit.op_types
    assert "Conv2D -> BiasAdd -> Relu" in source.explanation
    # The kernels recorded with an op are risks of their own, on the device they ran on.
    (risk,) = risks.known_risks(_runs([relu], [[1], [1]]), [])
    assert (risk.op_type, risk.key, risk.applies) == ("Conv2D", "f/Conv2D", True)


def test_a_unit_whose_member_was_recorded_and_differs_only_carries_it() -> None:
    sqrt = _op(1, "f/Sqrt", "Sqrt", "GPU:0")
    div = _op(2, "f/truediv", "RealDiv", "GPU:0", {"f/Sqrt": "Sqrt"})
    comparison = analysis.compare_recordings(_runs([sqrt, div], [[1, 5], [2, 6]]))
    roles = {f.key: f.role for f in comparison.findings}
    assert roles["f/Sqrt"] == "source" and roles["f/truediv"] == "propagated", roles
    # Without the member's own record, the unit is the source.
    comparison = analysis.compare_recordings(_runs([div], [[5], [6]]))
    assert [f.key for f in comparison.findings if f.role == "source"] == ["f/truediv"]


def test_an_intermediate_a_graph_returns_as_it_is_is_recorded_every_time() -> None:
    """A while loop's condition returns its comparison itself (Less may be rewritten with a
    LogicalNot that reads it, so it is left for its readers): it has none in the condition's
    graph, and is recorded when that graph is complete, on every evaluation."""

    @tf.function
    def loop(x):
        return tf.while_loop(lambda i, a: i < 6, lambda i, a: (i + 1, a * 0.5), [0, x])[1]

    with nddebug.trace() as rec:
        loop(tf.ones([4]))
    types = [rec.ops[e.op_id].op_type for e in rec.events]
    assert types.count("Less") == 7, types


def test_pairs_entries_are_exact_and_convolutions_in_a_row_are_both_recorded() -> None:
    """An entry lists its pairs where not every producer goes with every consumer: a
    convolution read by a convolution is no pattern, so both are recorded."""
    text = _GOOD.replace(
        'producers = ["Sqrt"]\nconsumers = ["RealDiv"]', 'pairs = [["A", "B"], ["B", "C"]]'
    )
    assert rewrites.parse(text)[0].pairs == {("A", "B"), ("B", "C")}
    assert not rewrites.fuses("Conv2D", "Conv2D", 0, "/device:CPU:0")
    k = tf.constant(np.full([3, 3, 2, 2], 0.1, np.float32))

    @tf.function
    def twice(x):
        return tf.nn.conv2d(tf.nn.conv2d(x, k, 1, "SAME"), k, 1, "SAME")

    with nddebug.trace() as rec:
        twice(tf.ones([1, 6, 6, 2]))
    assert [rec.ops[e.op_id].op_type for e in rec.events].count("Conv2D") == 2


def test_an_eager_tapes_backward_graph_records_what_it_returns() -> None:
    """The backward graph of an eager tape's gradient is filled by TensorFlow's gradient code,
    not by a Python function: its MatMuls are returned as they are, and are recorded when the
    graph becomes a function."""
    w = tf.Variable(tf.ones([4, 3]))

    @tf.function
    def forward(x):
        return tf.matmul(x, w)

    with nddebug.trace() as rec:
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(forward(tf.ones([2, 4])))
        tape.gradient(y, w)
    assert [rec.ops[e.op_id].op_type for e in rec.events].count("MatMul") == 3  # 1 + 2 grads


def test_what_a_python_function_reads_is_recorded() -> None:
    k = tf.constant(np.full([3, 3, 2, 2], 0.1, np.float32))

    @tf.function
    def step(x):
        return tf.numpy_function(lambda a: a * 2, [tf.nn.conv2d(x, k, 1, "SAME")], tf.float32)

    with nddebug.trace() as rec:
        step(tf.ones([1, 6, 6, 2]))
    assert "Conv2D" in [rec.ops[e.op_id].op_type for e in rec.events]


def test_no_ordering_edge_into_a_bias_add_with_an_unknown_batch() -> None:
    """A BiasAdd may reuse only its value input's buffer: the bias's digest gets no edge into
    it (an edge would stop grappler fusing it with its convolution)."""
    k = tf.constant(np.full([3, 3, 2, 4], 0.1, np.float32))
    b = tf.Variable(tf.ones([4]))

    @tf.function(input_signature=[tf.TensorSpec([None, 6, 6, 2], tf.float32)])
    def step(x):
        return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, k, 1, "SAME"), b))

    with nddebug.trace():
        graph = step.get_concrete_function().graph
        step(tf.ones([2, 6, 6, 2]))
    (bias_add,) = [op for op in graph.get_operations() if op.type == "BiasAdd"]
    assert bias_add.control_inputs == []


def test_a_unit_stays_a_source_where_no_member_execution_explains_it() -> None:
    """Sqrt and the division that fuses it run twice; the Sqrt differs only the first time,
    the division both times: the second difference is the division's own."""
    sqrt = _op(1, "f/Sqrt", "Sqrt", "GPU:0")
    div = _op(2, "f/truediv", "RealDiv", "GPU:0", {"f/Sqrt": "Sqrt"})
    runs = []
    for values in ([1, 5, 3, 8], [2, 6, 3, 9]):
        rec = Recording(digest_algorithm="test", environment={"devices": ["GPU:0"]})
        rec.ops[0] = _op(0, "eager:call", "__inference_f", "GPU:0")
        for seq, (op, value) in enumerate(zip([sqrt, div, sqrt, div], values, strict=True)):
            rec.ops[op.op_id] = op
            rec.events.append(Event(seq, op.op_id, 10, [(value, 0)], [(7, 7)]))
        rec.events.append(Event(10, 0, 10, [(99, 0)], []))
        runs.append(rec)
    roles = {f.key: f.role for f in analysis.compare_recordings(runs).findings}
    assert roles == {"f/Sqrt": "source", "f/truediv": "source"}, roles


def test_a_pair_that_cannot_begin_its_pattern_fuses_only_inside_it(monkeypatch) -> None:
    """Mish is Softplus -> Tanh -> Mul: a Tanh that reads anything but a Softplus is no part of
    it, so tanh(a) * b is recorded op by op, not lumped into one unit (on oneDNN machines a
    chain of Tanh and Mul became one record of 120 ops)."""
    text = _GOOD.replace(
        'producers = ["Sqrt"]\nconsumers = ["RealDiv"]',
        'pairs = [["A", "B"], ["B", "C"]]\nstarts = [["A", "B"]]',
    )
    assert rewrites.parse(text)[0].starts == {("A", "B")}
    # Where Mish fires (a CPU with oneDNN on), whatever this machine has.
    monkeypatch.setattr(rewrites, "_applies", lambda device: frozenset({"any", "cpu", "onednn"}))
    mish = "Mish (x * tanh(softplus(x)))"
    assert rewrites.fuses("Softplus", "Tanh", 0, "") == {mish}
    assert not rewrites.fuses("Tanh", "Mul", 0, "")
    assert rewrites.fuses("Tanh", "Mul", 0, "", frozenset({mish})) == {mish}
    # A Tanh may still begin other patterns (a composition of unary ops), not Mish.
    assert rewrites.may_fuse("Tanh", "") and rewrites.may_fuse("Tanh", "", frozenset({mish}))


def test_batch_norm_in_inference_stays_fusable_with_its_relu_and_shortcut(monkeypatch) -> None:
    """On a GPU the remapper makes FusedBatchNorm (inference) + Relu, or + a shortcut's Add +
    Relu, one _FusedBatchNormEx kernel only where the batch norm's output and the sum have no
    other reader; digested, they ran unfused and an H100 step was 2.4e-07 off plain. Checked
    here with the GPU's rules (the graph nddebug builds; the bits are the GPU tier's)."""
    monkeypatch.setattr(rewrites, "_applies", lambda device: frozenset({"any", "gpu"}))
    rng = np.random.RandomState(0)
    x = tf.constant(rng.randn(2, 6, 6, 4).astype("float32"))
    k = tf.constant(rng.randn(3, 3, 4, 4).astype("float32"))
    mean = tf.constant(rng.randn(4).astype("float32"))
    var = tf.constant(rng.rand(4).astype("float32") + 0.5)
    gamma = tf.Variable(tf.ones([4]))

    def batch_norm(y, training=False):
        return tf.compat.v1.nn.fused_batch_norm(
            y, gamma, tf.zeros([4]), *([] if training else [mean, var]), is_training=training
        )[0]

    @tf.function
    def step(x):
        a = tf.nn.relu(batch_norm(tf.nn.conv2d(x, k, 1, "SAME")))
        b = tf.nn.relu(batch_norm(tf.nn.conv2d(a, k, 1, "SAME")) + a)
        return b, tf.nn.relu(batch_norm(x, training=True))  # training: recorded as it is

    with nddebug.trace() as rec:
        graph = step.get_concrete_function(x).graph
        step(x)
    norms = [op for op in graph.get_operations() if op.type == "FusedBatchNormV3"]
    readers = [[c.type for c in op.outputs[0].consumers()] for op in norms]
    # Inference: read by the pattern alone. Training: by its Relu and nddebug's digest.
    inference, training = readers[:2], readers[2]
    assert inference == [["Relu"], ["AddV2"]] and len(training) == 2, readers
    (add,) = [op for op in graph.get_operations() if op.type == "AddV2" and op.name == "add"]
    assert [c.type for c in add.outputs[0].consumers()] == ["Relu"]
    assert all(not op.control_inputs for op in [*norms, add])
    fused = sorted(
        sorted(rec.ops[e.op_id].fused.values())
        for e in rec.events
        if rec.ops[e.op_id].op_type == "Relu"
    )
    assert fused == [[], ["AddV2", "FusedBatchNormV3"], ["FusedBatchNormV3"]], fused


def test_a_convolution_into_mish_stays_one_kernel_with_onednn(monkeypatch) -> None:
    """With oneDNN a second remapper pass folds Mish (x * tanh(softplus(x))) into the
    convolution and bias before it, only where the bias's output is read by the Mish alone:
    plain TF ran one _FusedConv2D, traced a convolution and a separate _MklFusedMish."""
    monkeypatch.setattr(rewrites, "_applies", lambda device: frozenset({"any", "cpu", "onednn"}))
    rng = np.random.RandomState(0)
    x = tf.constant(rng.randn(2, 8, 8, 4).astype("float32"))
    k = tf.constant(rng.randn(3, 3, 4, 8).astype("float32") * 0.3)
    b = tf.Variable(rng.randn(8).astype("float32"))

    @tf.function
    def step(x):
        y = tf.nn.bias_add(tf.nn.conv2d(x, k, 1, "SAME"), b)
        return y * tf.tanh(tf.math.softplus(y))

    with nddebug.trace() as rec:
        graph = step.get_concrete_function(x).graph
        step(x)
    (bias_add,) = [op for op in graph.get_operations() if op.type == "BiasAdd"]
    assert sorted(c.type for c in bias_add.outputs[0].consumers()) == ["Mul", "Softplus"]
    (unit,) = [rec.ops[e.op_id] for e in rec.events if rec.ops[e.op_id].op_type == "Mul"]
    assert set(unit.fused.values()) == {"Conv2D", "BiasAdd", "Softplus", "Tanh"}, unit.fused


def test_hashed_integer_ids_keep_their_one_kernel() -> None:
    """tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids)) is one _TensorToHashBucketFast
    kernel in plain TF only where the strings have no other reader: they are not digested."""

    @tf.function
    def step(ids):
        return tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids), 97)

    ids = tf.constant(np.arange(50, dtype=np.int64) * 7919)
    with nddebug.trace() as rec:
        graph = step.get_concrete_function(ids).graph
        hashed = step(ids)
    assert hashed.numpy().tolist() == step(ids).numpy().tolist()
    (as_string,) = [op for op in graph.get_operations() if op.type == "AsString"]
    assert [c.type for c in as_string.outputs[0].consumers()] == ["StringToHashBucketFast"]
    (unit,) = [rec.ops[e.op_id] for e in rec.events if "Hash" in rec.ops[e.op_id].op_type]
    assert list(unit.fused.values()) == ["AsString"]
