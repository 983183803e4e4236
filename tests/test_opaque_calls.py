"""Calls nddebug cannot see inside (a tf.function traced before the block, an XLA cluster):
the variables they write are still compared, so a difference there is never "reproducible"."""

from __future__ import annotations

import json
import os

import keras
import numpy as np
import tensorflow as tf

import nddebug
from nddebug.recording import XLA_NOTE
from nddebug.state import StateKeeper
from tests.helpers import variables_bytes
from tests.test_cli import SCRIPTS
from tests.test_cli import nddebug as nddebug_cli


def _hidden_update(random: bool, jit_compile: bool = False):
    """A tf.function that writes a variable and returns a constant, traced before any block."""
    acc = tf.Variable(tf.zeros([64]), name="accumulator")

    def update(x):
        noise = tf.random.uniform([64]) if random else tf.fill([64], 0.5)
        acc.assign_add(noise * x)
        return tf.constant(1.0)

    fn = tf.function(update, jit_compile=jit_compile)
    fn(tf.ones([64]))
    return fn, acc


def _traced_runs(fn, state, n: int = 3) -> list[nddebug.Recording]:
    keeper = StateKeeper(state)
    before = keeper.snapshot()
    runs = []
    for _ in range(n):
        keeper.restore(before)
        with nddebug.trace() as rec:
            fn(tf.ones([64]))
        runs.append(rec)
    return runs


def test_trace_compares_the_variables_a_pretraced_function_writes() -> None:
    fn, acc = _hidden_update(random=True)
    report = nddebug.compare(_traced_runs(fn, [acc]))
    assert not report.ok, str(report)
    (source,) = report.sources.itertuples()
    assert source.op_type.startswith("__inference_update"), str(report)
    assert source.kind == "random" and "accumulator" in source.explanation, str(report)

    fn, acc = _hidden_update(random=False)
    report = nddebug.compare(_traced_runs(fn, [acc]))
    assert report.ok, str(report)
    assert report.summary["verdict"] == "reproducible"


def test_an_xla_cluster_that_writes_different_values_is_the_source() -> None:
    fn, acc = _hidden_update(random=True, jit_compile=True)
    report = nddebug.compare(_traced_runs(fn, [acc]))
    assert not report.ok, str(report)
    (source,) = report.sources.itertuples()
    assert source.kind == "random" and "XLA" in source.explanation, str(report)

    fn, acc = _hidden_update(random=False, jit_compile=True)
    assert nddebug.compare(_traced_runs(fn, [acc])).ok


def test_check_names_a_pretraced_function_called_by_the_step() -> None:
    """check() retraces the function it is given, not a tf.function the step calls: that one
    stays opaque, and what it writes is compared."""
    fn, acc = _hidden_update(random=True)

    def wrapper():
        return fn(tf.ones([64]))

    report = nddebug.check(wrapper, repeats=3, state=[acc], advance=False)
    assert not report.ok, str(report)
    source = report.sources.iloc[0]
    assert source.op_type.startswith("__inference_update"), str(report)
    assert source.kind == "random" and "accumulator" in source.explanation, str(report)

    fn, acc = _hidden_update(random=False)
    assert nddebug.check(lambda: fn(tf.ones([64])), repeats=3, state=[acc]).ok


def test_check_of_an_xla_step_checks_it_as_compiled_then_names_the_op_with_xla_off() -> None:
    fn, acc = _hidden_update(random=True, jit_compile=True)
    report = nddebug.check(fn, tf.ones([64]), repeats=3, state=[acc])
    assert not report.ok
    df = report.culprits
    compiled = df[(df.program == "as compiled (XLA)") & (df.role == "source")]
    # Its random op has no seed; XLA draws it from the process's counter all the same, so
    # fresh processes agree (probe round 42, F1): not a random source as compiled.
    assert list(compiled.kind) == ["compiled stream"], str(report)
    assert compiled.iloc[0].op_type.startswith("__inference_update")
    xla_off = df[(df.program == "XLA off") & (df.role == "source")]
    assert list(xla_off.op_type) == ["RandomUniform"], str(report)
    text = str(report)
    assert text.index("as compiled (XLA on)") < text.index("with XLA off"), text
    # XLA's random numbers come from a counter check() cannot put back: said, once per run.
    said = [w for w in report.warnings if "inside XLA-compiled functions" in w]
    assert len(said) == 1 and "RandomUniform in update" in said[0], report.warnings


def test_a_deterministic_keras_xla_step_is_ok_and_check_leaves_one_plain_step() -> None:
    def model_and_data():
        keras.utils.set_random_seed(3)
        model = keras.Sequential(
            [keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer="adam", loss="mse", jit_compile=True)
        rng = np.random.default_rng(0)
        data = (rng.random((64, 16), dtype=np.float32), rng.random((64, 1), dtype=np.float32))
        return model, data

    model, (x, y) = model_and_data()
    report = nddebug.check(model.train_on_batch, x, y, repeats=3, state=model)
    assert report.ok and report.program == "as compiled (XLA)", str(report)
    assert not [w for w in report.warnings if "random ops run inside XLA" in w], report.warnings
    assert model.jit_compile is True
    plain, _ = model_and_data()
    plain.train_on_batch(x, y)
    assert variables_bytes(model.weights) == variables_bytes(plain.weights)


def test_a_keras_xla_fit_gives_one_xla_warning_not_one_per_branch() -> None:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", metrics=["mae"], jit_compile=True)
    x, y = np.ones((32, 8), np.float32), np.ones((32, 1), np.float32)
    with nddebug.trace() as rec:
        model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    xla = [w for w in rec.warnings if "XLA" in w]
    assert len(xla) == 1 and xla[0].endswith(XLA_NOTE), rec.warnings


def test_a_pretraced_function_called_inside_a_graph_is_not_called_ok() -> None:
    """Inside an instrumented graph, a call to a function traced before the block cannot be
    hooked: what it writes is not compared, and the verdict says so instead of "ok", unless
    check() compares every variable it writes after the step (``state=``)."""
    v = tf.Variable(tf.zeros([4]))
    inner = tf.function(lambda x: v.assign_add(x)).get_concrete_function(
        tf.TensorSpec([4], tf.float32)
    )

    @tf.function
    def outer(x):
        inner(x)
        return tf.constant(0.0)

    report = nddebug.check(outer, tf.ones([4]), repeats=2, advance=False)
    assert not report.ok and report.not_compared, str(report)
    assert report.summary["verdict"].startswith("no difference seen"), str(report)
    assert any("the variables written by" in w for w in report.warnings), report.warnings
    # v held: compared after every run, so nothing the call wrote went uncompared.
    report = nddebug.check(outer, tf.ones([4]), repeats=2, state=[v], advance=False)
    assert report.ok, str(report)


def test_nddebug_run_names_the_pretraced_function() -> None:
    # (An XLA cluster's random op is not a cross-process difference on the CPU: XLA's generator
    # starts from the same state in every process, and advances per call, which check() sees.)
    script = os.path.join(SCRIPTS, "opaque_state_step.py")
    result = nddebug_cli("run", "-n", "2", "--format", "json", script)
    assert result.returncode == 1, result.stdout + result.stderr
    (source,) = [c for c in json.loads(result.stdout)["culprits"] if c["role"] == "source"]
    assert source["op_type"].startswith("__inference_update"), result.stdout
    assert source["kind"] == "random" and "accumulator" in source["explanation"], result.stdout


def test_a_savedmodel_call_is_compared_or_said_not_compared(tmp_path) -> None:
    class Module(tf.Module):
        def __init__(self) -> None:
            self.acc = tf.Variable(tf.zeros([16]), name="acc")

        @tf.function(input_signature=[tf.TensorSpec([16], tf.float32)])
        def update(self, x):
            self.acc.assign_add(tf.random.uniform([16]) * x)
            return tf.constant(1.0)

    tf.saved_model.save(Module(), str(tmp_path))

    def runs(loaded) -> nddebug.Report:
        keeper = StateKeeper([loaded.acc])
        before = keeper.snapshot()
        recs = []
        for _ in range(3):
            keeper.restore(before)
            with nddebug.trace() as rec:
                loaded.update(tf.ones([16]))
            recs.append(rec)
        return nddebug.compare(recs)

    # First called inside the block, the loaded wrapper is traced there and calls the restored
    # function from its graph, where nddebug cannot read the variables: never "ok".
    report = runs(tf.saved_model.load(str(tmp_path)))
    assert not report.ok and report.not_compared, str(report)
    # Called once before, the wrapper is an opaque eager call: its variables are compared.
    loaded = tf.saved_model.load(str(tmp_path))
    loaded.update(tf.zeros([16]))
    report = runs(loaded)
    assert not report.ok and report.sources.iloc[0].kind == "random", str(report)


class _DropoutTrainer(tf.Module):
    """A module to save: one linear layer trained through a dropout (``seed=None``: none)."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.w = tf.Variable(tf.random.stateless_normal([6, 1], seed=[1, 2]))

    @tf.function(input_signature=[tf.TensorSpec([None, 6]), tf.TensorSpec([None, 1])])
    def train(self, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.nn.dropout(x, 0.3, seed=self.seed) @ self.w - y) ** 2)
        self.w.assign_sub(0.1 * tape.gradient(loss, self.w))
        return loss


def test_a_loaded_function_that_differs_inside_is_named_as_unseen_not_python_side(
    tmp_path,
) -> None:
    """check() of a SavedModel's function with an unseeded dropout inside: check retraced the
    wrapper, whose only op is a call TensorFlow adds without telling nddebug. The wrapper's
    call was the source "its inputs already differed when they entered TensorFlow", with
    advice about PYTHONHASHSEED, though its inputs were identical. check() now traces the
    wrapper outside the runs, as its first plain call would, so each run calls the restored
    graph eagerly: that call is the source, compared at its boundary with the variables it
    writes, and the random op inside it is why."""

    tf.saved_model.save(_DropoutTrainer(seed=None), str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    x = tf.constant(np.random.RandomState(0).randn(16, 6).astype("float32"))
    report = nddebug.check(loaded.train, x, tf.ones([16, 1]), state=loaded, repeats=3)
    assert not report.ok
    (source,) = [f for f in report.comparison.findings if f.role == "source"]
    assert source.op.function == "uninstrumented" and source.kind == "random", str(report)
    assert "restored_function_body" in source.op.op_type, str(report)
    assert "entered TensorFlow" not in source.explanation, str(report)
    assert "restored from a SavedModel" in str(report)


def test_check_of_a_loaded_function_compares_what_it_writes(tmp_path) -> None:
    """check(loaded.train) of a deterministic SavedModel function: check() retraced the
    restored wrapper in the runs, whose call of the restored graph TensorFlow runs without
    telling nddebug, so the variables it writes were never compared and the verdict was
    "not everything compared" every time (probe round 30, F8). With seeded dropout inside, it
    is reproducible, and the weights after check() are one plain step's."""

    tf.random.set_seed(0)
    tf.saved_model.save(_DropoutTrainer(seed=1), str(tmp_path))
    x = tf.constant(np.random.RandomState(0).randn(16, 6).astype("float32"))
    y = tf.ones([16, 1])
    plain = tf.saved_model.load(str(tmp_path))
    for _ in range(2):
        plain.train(x, y)
    loaded = tf.saved_model.load(str(tmp_path))
    report = nddebug.check(loaded.train, x, y, state=loaded, repeats=3)
    assert report.ok, str(report)
    loaded.train(x, y)
    assert (loaded.w.numpy() == plain.w.numpy()).all()


def test_a_nested_xla_function_traced_before_the_check_is_said_in_every_run() -> None:
    """A jit_compile function traced before check(), called inside the checked step: the
    runs gave no XLA warning at all (it was made only for XLA functions traced in the
    block), so nothing said that the ops inside it were not compared."""
    from nddebug.recording import XLA_NOTE

    w = tf.Variable(tf.ones([4, 4]))

    @tf.function(jit_compile=True)
    def compiled(h):
        return tf.tanh(h) * 2.0

    x = tf.ones([2, 4])
    compiled(x @ w)  # traced before

    @tf.function
    def step(x):
        return tf.reduce_sum(compiled(x @ w))

    report = nddebug.check(step, x, repeats=2, state=w)
    assert report.ok
    assert any(w.endswith(XLA_NOTE) and "compiled" in w for w in report.warnings), report.warnings


def test_a_pretraced_function_called_from_two_lines_is_named_once() -> None:
    @tf.function
    def f(x):
        return tf.sin(x) * 2.0

    x = tf.ones([3])
    f(x)  # traced before the block: uninstrumented inside it
    with nddebug.trace() as rec:
        f(x)
        f(x + 1.0)
    said = [w for w in rec.warnings if "ran uninstrumented" in w]
    assert len(said) == 1, rec.warnings


def test_a_pretraced_call_inside_a_function_is_unseen_only_where_it_writes() -> None:
    """A function traced before the check, called inside the checked one: what it writes is
    not compared, and the verdict says so. One that only reads its variables (Keras's grouped
    Conv2D calls an XLA function with its kernel) hides nothing: its output is compared where
    it is read. Every such call was "not everything compared" (probe round 37, finding 3)."""
    w = tf.Variable(tf.ones([4, 4]))
    v = tf.Variable(tf.zeros([4]))

    @tf.function
    def writes(h):
        v.assign_add(tf.reduce_sum(h, 0))
        return tf.reduce_sum(h)

    @tf.function
    def reads(h):
        return tf.reduce_sum(h * v)

    x = tf.ones([2, 4])
    writes(x @ w)  # traced before
    reads(x @ w)
    report = nddebug.check(tf.function(lambda x: writes(x @ w)), x, state=[w, v], repeats=2)
    assert report.verdict == "no difference seen, but not everything compared", str(report)
    assert any("writes" in m and "not compared" in m for m in report.warnings), report.warnings
    report = nddebug.check(tf.function(lambda x: reads(x @ w)), x, state=[w, v], repeats=2)
    assert report.ok and not report.blind_spots, str(report)


def test_a_grouped_convolution_model_is_checked_whole() -> None:
    """Conv2D(groups=4) in Keras 3 runs tf.nn.convolution in a jit_compile tf.function that
    reads the kernel: check() calls the step reproducible, and training goes on as plain."""

    def build() -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((8, 8, 4)),
                keras.layers.Conv2D(8, 3, groups=4, activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(3),
            ]
        )
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        return model

    rs = np.random.RandomState(0)
    x, y = rs.randn(4, 8, 8, 4).astype("float32"), rs.randint(0, 3, (4,))
    plain, checked = build(), build()
    report = nddebug.check(checked.train_on_batch, x, y, state=checked, repeats=2)
    assert report.ok, str(report)
    for model in (plain, plain, checked):
        model.train_on_batch(x, y)
    assert variables_bytes(plain.weights) == variables_bytes(checked.weights)
