"""Rerun mode: every stateless op runs again on its own inputs, within one step.

The crop step is the real CPU race of test_culprit_crop_and_resize (58 of 60 kernel runs gave
distinct results at these sizes): with three re-executions, all four agreeing has odds far
below 1e-6.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug import storage
from nddebug.examples import mnist_cnn
from nddebug.examples.detection import make_step
from nddebug.state import collect_variables
from tests.helpers import CPU_ONLY, jacobian_through_a_loop, run_python, variables_bytes

pytestmark = pytest.mark.usefixtures("cpu_facts")  # the CPU's crop race; the CNN reproducible


def _crop_inputs(boxes: int = 4096) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(0)
    images = tf.constant(rng.random((2, 32, 32, 3), dtype=np.float32))
    centre = rng.uniform(0.35, 0.65, size=(boxes, 2))
    half = rng.uniform(0.15, 0.3, size=(boxes, 2))
    box_coords = tf.constant(np.concatenate([centre - half, centre + half], axis=1), tf.float32)
    box_index = tf.constant(rng.integers(0, 2, size=boxes), tf.int32)
    return images, box_coords, box_index


def test_rerun_check_finds_the_crop_culprit_in_one_step() -> None:
    step, args, state = make_step()
    before = variables_bytes(state[:2])
    report = nddebug.check(step, *args, mode="rerun", rerun=3, state=state, advance=False)
    assert report.mode == "rerun" and not report.ok
    # A source by construction, and nothing downstream can differ: every copy read the
    # original inputs.
    assert list(report.culprits["op_type"]) == ["CropAndResizeGradImage"], str(report)
    row = report.sources.iloc[0]
    assert row["distinct_outputs"] >= 2 and row["max_ulp"] >= 1 and row["max_abs_diff"] > 0
    assert "enable_op_determinism" in row["fix"]
    # One traced step: the step's recording and one capture run, no repeats of the step.
    assert len(report.recordings) == 1 and report.recordings[0].kind == "rerun"
    assert report.summary["runs"] == 4
    # Variable updates are stateful: not re-executed, and the report says so.
    assert "stateful" in report.not_covered
    assert "AssignVariableOp" in report.not_covered["stateful"] or any(
        "Assign" in t for t in report.not_covered["stateful"]
    )
    assert "cannot see stateful ops" in report.mode_note and "AssignSub" in report.mode_note
    text = str(report)
    assert "each stateless op executed 4 times" in text and "CropAndResizeGradImage" in text
    assert variables_bytes(state[:2]) == before  # advance=False leaves the state as it was


def test_rerun_on_the_seed000_cnn_reports_nothing_and_leaves_one_step() -> None:
    x, y = mnist_cnn.make_data(128)
    checked, plain = mnist_cnn.make_model(0), mnist_cnn.make_model(0)
    report = nddebug.check(checked.train_on_batch, x, y, mode="rerun", rerun=1, state=checked)
    assert report.ok, str(report)
    rec = report.recordings[0]
    rerun_types = {rec.ops[ev.op_id].op_type for ev in rec.events if ev.reruns}
    # The copies really ran: forward, backward and optimizer maths were re-executed.
    assert {"Conv2D", "Conv2DBackpropFilter", "BiasAddGrad", "MatMul"} <= rerun_types
    assert "ReadVariableOp" in report.not_covered.get("stateful", [])
    plain.train_on_batch(x, y)
    assert variables_bytes(collect_variables(checked)) == variables_bytes(collect_variables(plain))


def test_eager_rerun_in_trace_measures_and_lists_unseeded_random_op(tmp_path) -> None:
    images, box_coords, box_index = _crop_inputs()
    with nddebug.trace(rerun=3) as rec:
        noise = tf.random.uniform([3])  # stateful: never re-executed
        with tf.GradientTape() as tape:
            tape.watch(images)
            crops = tf.image.crop_and_resize(images, box_coords, box_index, crop_size=(14, 14))
            loss = tf.reduce_sum(crops * crops)
        grad = tape.gradient(loss, images)
        _ = tf.reduce_sum(grad) + tf.reduce_sum(noise)
    assert rec.kind == "rerun"
    report = nddebug.compare([rec])
    assert report.mode == "rerun"
    assert list(report.culprits["op_type"]) == ["CropAndResizeGradImage"], str(report)
    # Eager re-executions keep the divergent values as they go: magnitudes with no second pass.
    assert report.sources.iloc[0]["max_abs_diff"] > 0
    assert report.not_covered == {"stateful": ["RandomUniform"]}

    # The recording, re-executions included, survives a save and load.
    path = str(tmp_path / "rerun.nddebug")
    rec.save(path)
    (loaded,) = nddebug.load(path)
    assert loaded.kind == "rerun"
    assert [ev.reruns for ev in loaded.events] == [ev.reruns for ev in rec.events]
    again = nddebug.compare([loaded])
    assert list(again.sources["op_type"]) == ["CropAndResizeGradImage"]


def test_rerun_mode_says_what_it_cannot_re_execute() -> None:
    """An unseeded random op feeding an update: rerun mode cannot run it again (that changes
    its state) and said "reproducible", while repeated steps differ (RandomUniform). It says
    what it did not compare; the same step without the random op stays reproducible."""
    w = tf.Variable(tf.zeros([8]))

    @tf.function
    def noisy(x):
        w.assign_add(x * tf.random.uniform([8]))
        return tf.reduce_sum(w)

    @tf.function
    def clean(x):
        w.assign_add(x * 0.5)
        return tf.reduce_sum(w)

    report = nddebug.check(noisy, tf.ones([8]), state=[w], mode="rerun")
    assert report.verdict == "no difference seen, but not everything compared", str(report)
    assert any("RandomUniform" in line for line in report.not_compared), report.not_compared
    assert nddebug.check(clean, tf.ones([8]), state=[w], mode="rerun").ok


def test_rerun_mode_of_an_xla_step_says_the_compiled_program_was_not_checked() -> None:
    """Probe round 42, F4: rerun mode switches XLA off to re-execute the ops one by one, and
    said "reproducible" with no word that the compiled program the user runs was not
    checked. Repeat mode checks it as compiled first and can say "reproducible"."""
    w = tf.Variable(tf.random.stateless_normal([8, 3], seed=[1, 2]))
    x = tf.constant(np.random.default_rng(0).random((4, 8), dtype=np.float32))

    @tf.function(jit_compile=True)
    def step(x):
        h = x @ w
        w.assign_sub(0.01 * tf.matmul(x, h, transpose_a=True))
        return tf.reduce_sum(h)

    report = nddebug.check(step, x, state=[w], mode="rerun")
    assert report.verdict == "no difference seen, but not everything compared", str(report)
    assert report.program == "XLA off", report.program
    assert any("step as compiled (XLA)" in line for line in report.not_compared), str(report)
    repeat = nddebug.check(step, x, state=[w], mode="repeat")
    assert repeat.ok and repeat.program == "as compiled (XLA)", str(repeat)


@pytest.mark.parametrize("draw", ["numpy", "python"])
def test_rerun_mode_says_an_eager_step_drew_from_pythons_random_state(draw: str) -> None:
    """An eager step fed by NumPy's (or Python's) unseeded global random state: two plain
    calls differ, and rerun mode, which re-executes each op on its own inputs, said
    "reproducible" (probe round 38). It now says what it could not compare; the same step fed
    a fixed array stays ok."""
    import random

    w = tf.Variable(tf.ones([4, 1]))
    fixed = np.linspace(0.0, 1.0, 32, dtype=np.float32).reshape(8, 4)

    def noisy():
        if draw == "numpy":
            values = np.random.rand(8, 4).astype(np.float32)
        else:
            values = np.array([random.random() for _ in range(32)], np.float32).reshape(8, 4)
        return tf.reduce_sum(tf.matmul(tf.constant(values), w))

    def clean():
        return tf.reduce_sum(tf.matmul(tf.constant(fixed), w))

    assert noisy().numpy() != noisy().numpy()  # the ground truth: plain calls differ
    report = nddebug.check(noisy, state=[w], mode="rerun")
    assert not report.ok and report.verdict.startswith("no difference seen"), str(report)
    name = "NumPy's np.random" if draw == "numpy" else "Python's random module"
    assert any(name in line for line in report.not_compared), report.not_compared
    assert nddebug.check(clean, state=[w], mode="rerun").ok


def test_rerun_of_a_deterministic_graph_is_ok_and_copies_are_not_merged() -> None:
    @tf.function
    def f(a: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.matmul(a, a) * 2.0, axis=0)

    a = tf.constant(np.random.default_rng(1).random((64, 64), dtype=np.float32))
    with nddebug.trace(rerun=2) as rec:
        f(a)
    report = nddebug.compare([rec])
    assert report.ok, str(report)
    assert report.summary["runs"] == 3
    covered = {rec.ops[ev.op_id].op_type for ev in rec.events if ev.reruns}
    assert {"MatMul", "Mul", "Sum"} <= covered
    # Each copy is its own node in the graph the function runs (grappler did not fold them).
    graph = f.get_concrete_function(a).graph
    copies = [op for op in graph.get_operations() if "_nddebug_rerun" in op.node_def.attr]
    assert {op.type for op in copies} >= {"MatMul", "Mul", "Sum"}


def test_rerun_re_executes_ops_with_a_scalar_string_output() -> None:
    """A scalar string output (tf.print's StringFormat, tf.strings.join) reaches the host as
    bytes, not an array: rerun mode raised AttributeError out of the step (probe round 35)."""
    w = tf.Variable(1.0)

    def make_step() -> Any:
        @tf.function
        def step(x: tf.Tensor) -> tf.Tensor:
            tf.print("w =", w)
            text = tf.strings.join(["a", tf.strings.as_string(x)])
            w.assign_add(tf.cast(tf.strings.length(text), tf.float32) + x)
            return w

        return step

    report = nddebug.check(make_step(), tf.constant(1.0), state=[w], mode="rerun")
    assert report.ok, str(report)
    assert float(w.numpy()) == 11.0  # one step: 1 + len("a1.000000") + 1
    with nddebug.trace(rerun=1) as rec:
        make_step()(tf.constant(1.0))
    reran = {rec.ops[ev.op_id].op_type for ev in rec.events if ev.reruns}
    assert {"StringFormat", "StringJoin"} <= reran, reran
    assert nddebug.compare([rec]).ok


def test_rerun_bad_input_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="rerun"):
        with nddebug.trace(rerun=-1):
            pass
    with pytest.raises(ValueError, match="mode"):
        nddebug.check(lambda: None, mode="replay")
    with pytest.raises(ValueError, match="rerun"):
        nddebug.check(lambda: None, mode="rerun", rerun=0)
    with nddebug.trace(rerun=1) as rec:
        tf.random.uniform([4])  # only a stateful op: nothing was re-executed
    # A report that says so, not ok (it raised, and what was recorded was lost with it).
    report = nddebug.compare([rec])
    assert not report.ok and report.verdict == "no difference seen, but not everything compared"
    said = str(report)
    assert "Nothing was compared" in said and "No traced op differed" not in said, said
    assert any("RandomUniform: stateful" in x for x in report.blind_spots), report.blind_spots
    assert "not compared: no op of the step could be re-executed" in said, said
    # Its header says so too, not "each stateless op executed 1 times" (probe round 42, F6).
    assert "no op re-executed" in said and "executed 1 times" not in said, said
    with nddebug.trace(rerun=1) as a:
        tf.reduce_sum(tf.ones([3]) * 2.0)
    with nddebug.trace(rerun=1) as b:
        tf.reduce_sum(tf.ones([3]) * 2.0)
    with pytest.raises(nddebug.NotComparableError, match="one at a time"):
        nddebug.compare([a, b])


def test_a_version_1_file_gets_the_new_table_when_appended_to(tmp_path) -> None:
    path = str(tmp_path / "old.nddebug")
    with nddebug.trace() as plain:
        tf.reduce_sum(tf.ones([3]) * 2.0)
    plain.save(path)
    with sqlite3.connect(path) as con:  # as nddebug 0.1 wrote it
        con.execute("DROP TABLE reruns")
        con.execute("UPDATE meta SET value = '1' WHERE key = 'format_version'")
    assert [r.run_id for r in nddebug.load(path)] == [plain.run_id]
    with nddebug.trace(rerun=1) as rerun:
        tf.reduce_sum(tf.ones([3]) * 2.0)
    rerun.save(path)
    with sqlite3.connect(path) as con:
        version = con.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
    assert version == (str(storage.FORMAT_VERSION),)
    loaded = nddebug.load(path)
    assert [r.kind for r in loaded] == ["run", "rerun"]
    assert any(ev.reruns for ev in loaded[1].events)


def test_device_path_compares_in_the_graph(monkeypatch) -> None:
    """On a GPU the outputs are not in host memory: each copy is compared in the graph and
    only a divergent output's bytes travel to the host. Run that path here, on the CPU."""
    from nddebug.tracer import rerun

    monkeypatch.setattr(rerun, "on_host", lambda device: False)
    step, args, state = make_step()
    # A check whose copies all ran without the race sees nothing (measured: 2 of 52 checks
    # with 3 copies, 1 of about 60 with 8, the copies of one check hiding it together): up to
    # four checks, the first that shows it is asserted on.
    for _ in range(4):
        report = nddebug.check(step, *args, mode="rerun", rerun=8, state=state, advance=False)
        if not report.culprits.empty:
            break
    assert list(report.culprits["op_type"]) == ["CropAndResizeGradImage"], str(report)
    row = report.sources.iloc[0]
    assert row["max_abs_diff"] > 0 and row["distinct_outputs"] >= 2
    rec = report.recordings[0]
    # Real digests of the originals, computed in the graph, and inputs proven identical.
    crop = next(ev for ev in rec.events if rec.ops[ev.op_id].op_type == "CropAndResizeGradImage")
    assert crop.inputs and all(d is not None for d in crop.digests)
    assert len(crop.reruns) == 8


def test_device_path_compares_strings(monkeypatch) -> None:
    """String outputs on the device path (a GPU's): a copy's strings may have other lengths,
    so they are compared by digest; equal copies are no finding."""
    from nddebug.tracer import rerun

    monkeypatch.setattr(rerun, "on_host", lambda device: False)

    @tf.function
    def step(x):
        words = tf.strings.as_string(x * 3.0)
        return tf.strings.length(tf.strings.join([words, "!"]))

    report = nddebug.check(step, tf.range(5.0), mode="rerun", rerun=3, advance=False)
    assert report.ok, str(report)
    rec = report.recordings[0]
    joined = next(ev for ev in rec.events if rec.ops[ev.op_id].op_type == "StringJoin")
    assert joined.digests[0] is not None and len(joined.reruns) == 3

    def noise(n: np.ndarray) -> np.ndarray:  # words of another length on every call
        return np.array([b"x" * int(k) for k in np.random.randint(1, 50, size=n)], dtype=object)

    @tf.function
    def noisy(n):
        return tf.strings.length(tf.numpy_function(noise, [n], tf.string, stateful=False))

    report = nddebug.check(noisy, tf.constant(4), mode="rerun", rerun=3, advance=False)
    assert list(report.sources["op_type"]) == ["PyFuncStateless"], str(report)


def _crop_into_biased_conv_step(boxes: int = 1024, crop: int = 14) -> tuple[Any, tuple, list]:
    """The detection step with a bias on the backbone convolution: the racing crop gradient
    flows through ReluGrad into both BiasAddGrad and Conv2DBackpropFilter, which read the same
    tensor."""
    rng = np.random.default_rng(0)
    images = tf.constant(rng.random((2, 32, 32, 3), dtype=np.float32))
    centre = rng.uniform(0.35, 0.65, size=(boxes, 2))
    half = rng.uniform(0.15, 0.3, size=(boxes, 2))
    box_coords = tf.constant(np.concatenate([centre - half, centre + half], axis=1), tf.float32)
    box_index = tf.constant(rng.integers(0, 2, size=boxes), tf.int32)
    targets = tf.constant(rng.random((boxes, 4), dtype=np.float32))
    init = tf.keras.initializers.GlorotUniform(seed=0)
    conv_w = tf.Variable(init((3, 3, 3, 8)))
    conv_b = tf.Variable(tf.fill([8], 0.1))
    head_w = tf.Variable(init((crop * crop * 8, 4)))
    variables = [conv_w, conv_b, head_w]

    @tf.function
    def step(images: Any, box_coords: Any, box_index: Any, targets: Any) -> Any:
        with tf.GradientTape() as tape:
            conv = tf.nn.bias_add(tf.nn.conv2d(images, conv_w, 1, "SAME"), conv_b)
            crops = tf.image.crop_and_resize(
                tf.nn.relu(conv), box_coords, box_index, crop_size=(crop, crop)
            )
            pred = tf.matmul(tf.reshape(crops, [boxes, -1]), head_w)
            loss = tf.reduce_mean(tf.square(pred - targets))
        for v, g in zip(variables, tape.gradient(loss, variables), strict=True):
            v.assign_sub(0.01 * g)
        return loss

    return step, (images, box_coords, box_index, targets), variables


def test_rerun_names_no_op_downstream_of_the_crop_a_source() -> None:
    """oneDNN's graph rewrite merges a BiasAddGrad with a Conv2DBackpropFilter that reads the
    same tensor; which of the original and its copies got merged depended on memory order, so
    the copies ran another kernel than the original and BiasAddGrad was named a source in
    about one check in three (measured: 3 of 6 checks, 7 of 12). Twelve checks: all clean
    after the fix, while before it the odds of twelve clean checks were below 1%."""
    step, args, state = _crop_into_biased_conv_step()
    sources: list[str] = []
    for _ in range(12):
        report = nddebug.check(step, *args, mode="rerun", rerun=6, state=state, advance=False)
        sources += list(report.sources["op_type"])
        rec = report.recordings[0]
        copied = {rec.ops[ev.op_id].op_type for ev in rec.events if ev.reruns}
        assert {"BiasAddGrad", "Conv2DBackpropFilter", "ReluGrad"} <= copied
    assert set(sources) == {"CropAndResizeGradImage"}, sources


def _source_names(report: nddebug.Report) -> set[str]:
    return set(report.sources["op_name"])


@pytest.mark.parametrize("workload", ["CPU crop race", "emulated GPU CNN"])
def test_rerun_and_repeat_agree_on_the_sources_of_one_step(workload: str) -> None:
    """The two modes look differently: repeats compare whole steps, so an op downstream of a
    source is 'propagated' even when its own kernel is non-deterministic too; rerun gives each
    op its own inputs, so it names every such op. They agree when every source of the repeated
    check is a rerun source and every rerun source diverged in the repeated check."""
    if workload == "CPU crop race":
        step, args, state = make_step()
        emulate = False
    else:
        x, y = mnist_cnn.make_data(128)
        model = mnist_cnn.make_model(0)
        step, args, state, emulate = model.train_on_batch, (x, y), model, True
    repeated = nddebug.check(
        step, *args, repeats=3, state=state, advance=False, emulate_gpu=emulate
    )
    rerun = nddebug.check(
        step, *args, mode="rerun", rerun=3, state=state, advance=False, emulate_gpu=emulate
    )
    divergent = set(repeated.culprits["op_name"])
    assert _source_names(repeated), str(repeated)
    assert _source_names(repeated) <= _source_names(rerun) <= divergent, f"{repeated}\n\n{rerun}"
    if workload == "CPU crop race":  # one racing op: the same single source
        assert _source_names(rerun) == _source_names(repeated)
    else:  # the emulated GPU kernels downstream of the first ones are sources in rerun mode
        kinds = set(rerun.sources["op_type"])
        assert kinds == {"BiasAddGrad", "Conv2DBackpropFilter", "Conv2DBackpropInput"}


def test_rerun_mode_does_not_call_a_step_reproducible_whose_ops_ran_in_a_pretraced_function() -> (
    None
):
    """Rerun mode re-executes the ops it recorded; a function traced before the check runs as
    one call it cannot look into, nor re-execute. With an unseeded dropout inside, the step
    was "reproducible" (ok) in rerun mode although fresh processes differ (probe round 31,
    F2): the call was left out of what was not re-executed, as if its ops had been."""
    tf.random.set_seed(None)

    @tf.function
    def f(x):
        return tf.nn.dropout(x, 0.5)

    x = tf.ones([64])
    f(x)  # traced before the check
    report = nddebug.check(lambda x: f(x) * 2.0, x, mode="rerun")
    assert not report.ok, str(report)
    assert report.verdict == "no difference seen, but not everything compared"
    assert any("traced before the rerun block" in n for n in report.not_compared), str(report)


def test_rerun_mode_checks_a_jacobian_through_a_while_loop() -> None:
    """tape.jacobian (pfor) of a while loop: pfor converts the loop's body, which held rerun
    mode's host callback, and check(mode="rerun") raised "Encountered an exception while
    vectorizing the jacobian computation" out of the step (probe round 38)."""
    jacobian, w = jacobian_through_a_loop()

    plain = jacobian().numpy()
    report = nddebug.check(tf.function(jacobian.python_function), state=w, mode="rerun")
    assert report.verdict == "reproducible", str(report)
    assert np.array_equal(jacobian().numpy(), plain)


@pytest.mark.parametrize("case", ["sum of three", "batch moments", "keras batchnorm"])
def test_a_traced_rerun_step_computes_the_plain_bits_of_its_sums(case: str) -> None:
    """A sum of three or more terms (a gradient's AddN) takes over the buffer of a term
    nothing else holds and adds the others to it, in an order set by which term that is.
    Rerun mode gave the sum and its copy terms of their own (a Snapshot each): the original
    then summed in another order than the plain step, and trace(rerun=1) changed the weights
    of every step with batch moments or BatchNormalization, while its report said
    "reproducible" (probe round 48, F5). Such a sum is no longer copied, and reads its terms
    as the plain step does."""
    import keras

    from nddebug.tracer import ops

    rng = np.random.RandomState(0)
    x = tf.constant(rng.randn(64, 32).astype(np.float32))
    if case == "keras batchnorm":
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((32,)), keras.layers.Dense(16), keras.layers.BatchNormalization(),
             keras.layers.Dense(1)]
        )  # fmt: skip
        opt = keras.optimizers.Adam()
        model(x)
        opt.build(model.trainable_variables)
        variables = [*model.variables, *opt.variables]
    else:
        variables = [tf.Variable(rng.randn(32, 32).astype(np.float32) * 0.3)]
    start = [v.numpy() for v in variables]

    def make() -> Any:
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                if case == "keras batchnorm":
                    loss = tf.reduce_sum(model(x, training=True) ** 2)
                else:
                    h = x @ variables[0]
                    if case == "sum of three":
                        loss = tf.reduce_sum(h * h) + tf.reduce_sum(h * 3.0)
                    else:
                        mean, var = tf.nn.moments(h, axes=[0])
                        loss = tf.reduce_sum((h - mean) ** 2 * tf.math.rsqrt(var + 1e-3))
            if case == "keras batchnorm":
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            else:
                variables[0].assign_sub(0.01 * tape.gradient(loss, variables[0]))
            return loss

        return step

    def after(block: Any) -> list[np.ndarray]:
        for v, value in zip(variables, start, strict=True):
            v.assign(value)
        step = make()
        with block:
            step()
        return [v.numpy() for v in variables]

    plain = after(contextlib.nullcontext())
    traced = after(nddebug.trace(rerun=1))
    for a, b in zip(plain, traced, strict=True):
        np.testing.assert_array_equal(a, b)
    with nddebug.trace(rerun=1) as rec:
        for v, value in zip(variables, start, strict=True):
            v.assign(value)
        make()()
    report = nddebug.compare([rec])
    assert report.verdict == "reproducible", str(report)
    assert "AddN" in report.not_covered.get(ops.RERUN_SUMS, []), report.not_covered


_ONEDNN_STEP = """
import contextlib, hashlib, json
import numpy as np, tensorflow as tf, keras, nddebug
from nddebug.environment import onednn_enabled
from nddebug.tracer import rerun
keras.utils.set_random_seed(0)
x = tf.constant(np.random.RandomState(0).randn(16, 16, 16, 8).astype("float32"))
model = keras.Sequential([keras.Input((16, 16, 8)), keras.layers.Conv2D(16, 3, activation="relu"),
                          keras.layers.Conv2D(8, 3), keras.layers.GlobalAveragePooling2D(),
                          keras.layers.Dense(1)])
opt = keras.optimizers.SGD(0.1)
model(x)
opt.build(model.trainable_variables)
start = [v.numpy() for v in model.variables]
def run(block):
    for v, s in zip(model.variables, start):
        v.assign(s)
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    with block as rec:
        step()
    runs.append(rec)
    return hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.variables)).hexdigest()
runs = []
out = {"onednn": onednn_enabled(), "plain": run(contextlib.nullcontext()),
       "rerun": run(nddebug.trace(rerun=1))}
report = nddebug.compare([runs[-1]])
out["verdict"] = report.verdict
out["merged"] = report.not_covered.get(rerun.RERUN_MERGED, [])
print(json.dumps(out))
"""


def test_a_traced_rerun_step_leaves_onednns_merged_gradient_kernels_as_they_are() -> None:
    """With oneDNN on, TensorFlow merges a convolution's filter gradient with its bias
    gradient into one kernel. Rerun mode gave the filter gradient a Snapshot of the gradient
    of its own, so that its copies ran the same kernel: then nothing merged, and the bias
    gradient of every trace(rerun=1) step had other bits than the plain step's (probe round
    48, F5). The two are not copied where oneDNN is on."""
    out = run_python(_ONEDNN_STEP, env={"TF_ENABLE_ONEDNN_OPTS": "1", **CPU_ONLY})
    if not out["onednn"]:
        pytest.skip("oneDNN could not be switched on here")
    assert out["rerun"] == out["plain"]
    assert out["verdict"] == "reproducible"
    assert set(out["merged"]) == {"BiasAddGrad", "Conv2DBackpropFilter"}, out
