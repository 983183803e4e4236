"""An unseeded random op inside a custom layer is found as a "random" source; a seeded one,
stateless or legacy, is not."""

from __future__ import annotations

import json
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug.tracer import fresh
from tests.helpers import nddebug_run, run_python


class NoisyDense(keras.layers.Layer):
    """A layer that adds noise from an unseeded, stateful random op: a classic mistake."""

    def __init__(self, units: int, stateless: bool = False) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(units)
        self.stateless = stateless

    def call(self, x):
        y = self.dense(x)
        if self.stateless:
            return y + 0.01 * tf.random.stateless_uniform(tf.shape(y), seed=[1, 2])
        return y + 0.01 * tf.random.uniform(tf.shape(y))


def _model(stateless: bool, global_seed: bool = False) -> keras.Model:
    keras.utils.set_random_seed(0)  # the weights
    if not global_seed:
        # No global seed when the step is traced: tf.random.uniform gets seed=seed2=0 and
        # seeds its kernel at random (with one, it takes a seed derived from it).
        tf.random.set_seed(None)
    model = keras.Sequential([keras.Input((16,)), NoisyDense(8, stateless), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((32, 16), dtype=np.float32), rng.random((32, 2), dtype=np.float32)


def test_unseeded_random_uniform_is_a_random_source() -> None:
    model = _model(stateless=False)
    report = nddebug.check(model.train_on_batch, *_data(), repeats=3, state=model)
    sources = report.sources
    assert list(sources["op_type"]) == ["RandomUniform"], str(report)
    row = sources.iloc[0]
    assert row["kind"] == "random"
    assert "seed" in row["fix"].lower()
    assert "test_random_source.py" in row["location"]
    # Everything the noise feeds into is propagated, not a source.
    assert (report.culprits["role"] != "source").sum() >= 3


def test_legacy_noise_under_a_global_seed_is_reproducible() -> None:
    """With a global seed (keras.utils.set_random_seed), tf.random.uniform takes a seed derived
    from it, and fresh processes train bit for bit alike. Its kernel keeps its place in that
    seeded stream from call to call, so repeats of one traced step drew other numbers and
    check() said "NOT reproducible", naming the op and advising the seed the user had set.
    Each run now calls fresh copies of the function, and says so."""
    model = _model(stateless=False, global_seed=True)
    before = [w.copy() for w in model.get_weights()]
    report = nddebug.check(model.train_on_batch, *_data(), repeats=3, state=model)
    assert report.ok, str(report)
    assert any("seeded stateful random ops (RandomUniform)" in w for w in report.warnings)
    plain = _model(stateless=False, global_seed=True)
    plain.train_on_batch(*_data())
    after = model.get_weights()
    assert all((a == b).all() for a, b in zip(after, plain.get_weights(), strict=True))
    assert not all((a == b).all() for a, b in zip(after, before, strict=True))
    # Without the global seed the op seeds itself at random: still the source.
    unseeded = _model(stateless=False)
    report = nddebug.check(unseeded.train_on_batch, *_data(), repeats=3, state=unseeded)
    assert list(report.sources["op_type"]) == ["RandomUniform"], str(report)
    assert not any("seeded stateful random ops" in w for w in report.warnings)


def test_seeded_stateless_noise_is_reproducible() -> None:
    model = _model(stateless=True)
    report = nddebug.check(model.train_on_batch, *_data(), repeats=3, state=model)
    assert report.ok, str(report)


def test_a_loop_around_the_random_op_is_not_a_second_source() -> None:
    tf.random.set_seed(None)  # no global seed: the op below is unseeded

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        def body(i: tf.Tensor, acc: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return i + 1, acc + tf.random.uniform([4])  # unseeded: differs every run

        return tf.while_loop(lambda i, acc: i < 3, body, (tf.constant(0), x))[1]

    report = nddebug.check(step, tf.zeros([4]), repeats=3)
    assert list(report.sources["op_type"]) == ["RandomUniform"], str(report)
    loop = report.culprits[report.culprits["op_type"].isin(["While", "StatelessWhile"])]
    assert len(loop) == 1 and loop.iloc[0]["role"] == "propagated", str(report)
    assert "returns what the ops inside it computed" in loop.iloc[0]["explanation"]
    assert loop.iloc[0]["kind"] == "random"


def _seeded_noise() -> tf.types.experimental.PolymorphicFunction:
    """A tf.function drawing from a seeded legacy stream: every function made by this draws
    the same numbers in the same order, as fresh processes do."""

    @tf.function
    def noisy(x):
        return x + tf.random.uniform([16], seed=7)

    return noisy


def test_seeded_noise_in_a_function_a_python_step_calls_is_reproducible() -> None:
    """A plain Python step calling a tf.function with a seeded tf.random.uniform, traced
    before the check or first inside it: the repeats ran the user's own function, drew the
    next numbers each and said "NOT reproducible" (probe round 30, F1), and the steps after
    check() drew further on than without it. Each run now calls fresh copies of the function,
    and the user's kernels move on by the one ordinary step that ends the check."""
    tf.random.set_seed(0)
    x = tf.zeros([16])
    reference = _seeded_noise()
    plain = [reference(x).numpy() for _ in range(3)]
    assert not (plain[0] == plain[1]).all()  # the stream moves on: the case at hand

    earlier = _seeded_noise()
    assert (earlier(x).numpy() == plain[0]).all()  # traced and called before the check
    report = nddebug.check(lambda x: earlier(x), x, repeats=3)
    assert report.ok, str(report)
    assert any("seeded stateful random ops (RandomUniform)" in w for w in report.warnings)
    assert (earlier(x).numpy() == plain[2]).all()  # the check was one step: draw 2

    inside = _seeded_noise()  # first traced inside the check
    report = nddebug.check(lambda x: inside(x), x, repeats=3)
    assert report.ok, str(report)
    assert (inside(x).numpy() == plain[1]).all()
    assert not fresh.copies_alive()  # the copies went with their runs


def test_seeded_noise_in_a_nested_function_traced_before_is_reproducible() -> None:
    """The seeded function is called inside the checked tf.function and was traced before:
    copying only the outer function shared the inner one's kernels (F3)."""
    tf.random.set_seed(0)
    x = tf.zeros([16])
    inner = _seeded_noise()
    inner(x)

    @tf.function
    def outer(x):
        return 2.0 * inner(x)

    reference = _seeded_noise()
    plain = [reference(x).numpy() for _ in range(3)]
    assert nddebug.check(outer, x, repeats=3).ok
    # As without the check: outer's call of inner has a kernel of its own, which the check's
    # one ordinary step moved on once, and inner's eager kernel drew once, before it.
    assert (outer(x).numpy() == 2.0 * plain[1]).all()
    assert (inner(x).numpy() == plain[1]).all()


def test_unseeded_noise_a_python_step_calls_is_still_a_source() -> None:
    tf.random.set_seed(None)

    @tf.function
    def noisy(x):
        return x + tf.random.uniform([16])

    report = nddebug.check(lambda x: noisy(x), tf.zeros([16]), repeats=3)
    assert list(report.sources["op_type"]) == ["RandomUniform"], str(report)
    assert not any("seeded stateful random ops" in w for w in report.warnings)


def test_a_keras_seed_generators_state_read_is_a_random_source() -> None:
    """A Keras random layer with no seed keeps an int64 [seed, counter] state that its
    stateless random ops draw from. Where that state differs between recordings (a
    SeedGenerator made without a seed, in another process; advanced by an earlier block in
    this one), its reads are random sources, with the advice to seed, not "state carried
    over" alone. (check() puts such a state back between its runs: tracer.unheld.)"""
    model = keras.Sequential([keras.Input((8,)), keras.layers.GaussianNoise(0.1)])
    model.add(keras.layers.Dense(2))
    x = np.ones((16, 8), np.float32)
    forward = tf.function(lambda: model(x, training=True))
    recordings = []
    for _ in range(2):
        with nddebug.trace() as rec:
            forward()
        recordings.append(rec)
    report = nddebug.compare(recordings)
    noise = report.sources[report.sources["op_name"].str.contains("gaussian_noise")]
    assert len(noise) >= 1 and set(noise["kind"]) == {"random"}, str(report)
    assert all("seed" in fix.lower() for fix in noise["fix"])
    assert len(noise) == len(report.sources), str(report)  # the weights were not moved on


_UNSEEDED_LAYER = """
import numpy as np
import keras

x = np.arange(8 * 8 * 8, dtype="float32").reshape(8, 8, 8, 1) / 512.0
y = (np.arange(8) % 2).astype("int32")
init = keras.initializers.GlorotUniform(seed=1)
model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.RandomFlip(),  # no seed: its SeedGenerator draws one from Python's random
    keras.layers.Flatten(),
    keras.layers.Dense(2, kernel_initializer=init),
])
model.compile(optimizer=keras.optimizers.SGD(0.1),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.train_on_batch(x, y)
"""


def test_a_seed_generator_made_inside_the_block_is_a_random_source(tmp_path: Any) -> None:
    """nddebug run --all over a model with an unseeded RandomFlip, built inside the block: the
    eager Cast of its SeedGenerator's [seed, 0] was the source, kind "other", with the advice
    to fix PYTHONHASHSEED, which does not touch Python's random (probe round 44, F3; ground
    truth: the weights differ across fresh processes, and are equal with seed=)."""
    proc = nddebug_run(tmp_path, _UNSEEDED_LAYER, "--all", "--format", "json", name="aug.py")
    assert proc.returncode == 1, proc.stderr[-3000:]
    sources = [c for c in json.loads(proc.stdout)["culprits"] if c["role"] == "source"]
    assert [(s["op_type"], s["kind"]) for s in sources] == [("Cast", "random")], sources
    assert "SeedGenerator made without a seed" in sources[0]["explanation"]
    assert "PYTHONHASHSEED" not in sources[0]["fix"] and "Seed it" in sources[0]["fix"]


_PRETRACED_GENERATOR = """
import tensorflow as tf
import nddebug

g = tf.random.Generator.from_non_deterministic_state()
w = tf.Variable(tf.linspace(-1.0, 1.0, 16))


@tf.function
def step():
    noise = g.normal([16]) * 0.1
    w.assign_sub(0.1 * tf.sin(w + noise))


step()  # traced before the block: nddebug sees the call, not its ops
with nddebug.trace():
    step()
"""


def test_a_pretraced_call_drawing_from_a_generators_state_is_a_random_source(
    tmp_path: Any,
) -> None:
    """A step traced before the block draws from Generator.from_non_deterministic_state():
    the generator's state, a variable the call captures, differs between processes before
    the call. The call was "other", with the advice to fix PYTHONHASHSEED (probe round 44,
    F2; ground truth: fresh processes differ, and agree with from_seed)."""
    proc = nddebug_run(tmp_path, _PRETRACED_GENERATOR, "--format", "json", name="gen.py")
    assert proc.returncode == 1, proc.stderr[-3000:]
    sources = [c for c in json.loads(proc.stdout)["culprits"] if c["role"] == "source"]
    assert [s["kind"] for s in sources] == ["random"], sources
    why = sources[0]["explanation"]
    assert "RngReadAndSkip" in why and "from_non_deterministic_state()" in why, why
    assert "PYTHONHASHSEED" not in sources[0]["fix"] and "from_seed" in sources[0]["fix"]


_PRETRACED_DROPOUT = """
import numpy as np
import keras
import nddebug

rng = np.random.default_rng(0)
x = rng.normal(size=(32, 8)).astype("float32")
y = (rng.random(32) * 3).astype("int32")
init = keras.initializers.GlorotUniform(seed=1)
model = keras.Sequential([
    keras.Input((8,)),
    keras.layers.Dense(16, activation="relu", kernel_initializer=init),
    keras.layers.Dropout(0.3),  # no seed: its SeedGenerator draws one from Python's random
    keras.layers.Dense(3, kernel_initializer=init),
])
model.compile(optimizer=keras.optimizers.SGD(0.1),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.train_on_batch(x, y)  # traces the train function before the block
with nddebug.trace():
    model.train_on_batch(x, y)
"""


def test_a_pretraced_train_function_with_an_unseeded_dropout_is_a_random_source(
    tmp_path: Any,
) -> None:
    """The same as a Generator's, for a Keras SeedGenerator's state (probe round 44, F2's
    Keras case): the train function traced before the block draws with stateless ops from
    a seed that Python's random chose in each process."""
    proc = nddebug_run(tmp_path, _PRETRACED_DROPOUT, "--format", "json", name="pre.py")
    assert proc.returncode == 1, proc.stderr[-3000:]
    sources = [c for c in json.loads(proc.stdout)["culprits"] if c["role"] == "source"]
    assert [s["kind"] for s in sources] == ["random"], sources
    assert "StatelessRandomUniformV2" in sources[0]["explanation"], sources[0]["explanation"]
    assert "PYTHONHASHSEED" not in sources[0]["fix"]


def test_fresh_copies_keep_emulate_gpus_masks_random() -> None:
    """Under emulate_gpu() a function holding a seeded random op runs as fresh copies, which
    copy the emulation's random masks too: with their seeds copied, every run drew the same
    mask and the emulated culprit looked deterministic. Each copy gets masks of its own."""
    tf.random.set_seed(0)
    # 64 segments: with 4, two random splits give every sum the same bits once in ~150 pairs.
    ids = tf.constant(np.arange(4096) % 64, tf.int32)

    @tf.function
    def step(x):
        noisy = x + tf.random.uniform(tf.shape(x), seed=3)
        return tf.math.unsorted_segment_sum(noisy * 1e3, ids, 64)

    report = nddebug.check(step, tf.ones([4096]), repeats=3, emulate_gpu=True)
    assert "UnsortedSegmentSum" in set(report.sources["op_type"]), str(report)
    assert "RandomUniform" not in set(report.sources["op_type"]), str(report)
    assert any("seeded stateful random ops (RandomUniform)" in w for w in report.warnings)


def test_an_eager_op_with_its_own_seed_is_a_seeded_stream_not_non_determinism() -> None:
    """tf.random.uniform(shape, seed=5) run eagerly: TensorFlow keeps its kernel for the
    process, so each run of check() drew the next numbers. It was "NOT reproducible" with the
    advice to seed the op, though fresh processes agree bit for bit. It is now of kind
    "seeded stream", the verdict says what was not compared, and the fix says what to do."""
    tf.random.set_seed(0)
    w = tf.Variable(tf.zeros([16]))

    def step() -> None:
        w.assign_add(tf.random.uniform([16], seed=5))

    report = nddebug.check(step, state=w, repeats=3)
    assert report.verdict == "NOT compared: seeded random ops drew further on in their streams"
    assert not report.ok
    row = report.sources.iloc[0]
    assert row["op_type"] == "RandomUniform" and row["kind"] == "seeded stream", str(report)
    assert row["fix"].startswith("Not non-determinism"), row["fix"]
    assert any("seeded stateful random ops RandomUniform differed" in w for w in report.warnings)
    # Unseeded (no global seed, no op seed): a random source, NOT reproducible.
    tf.random.set_seed(None)

    def unseeded() -> None:
        w.assign_add(tf.random.uniform([16]))

    report = nddebug.check(unseeded, state=w, repeats=3)
    assert report.verdict == "NOT reproducible"
    assert list(report.sources["kind"]) == ["random"], str(report)


def test_seeded_samplers_outside_tensorflows_legacy_list_draw_from_fresh_kernels() -> None:
    """A candidate sampler (tf.nn.sampled_softmax_loss's) keeps a seeded generator in its
    kernel as tf.random.uniform does, but is not on TensorFlow's LEGACY_RANDOM_OPS list: it got
    no fresh kernels, check() said "NOT reproducible" with the advice to seed it, and through a
    Python step the draws after check() moved on (probe round 31, F1)."""
    tf.random.set_seed(0)
    classes = tf.constant([[1], [2], [3], [4]], tf.int64)

    def make():
        @tf.function
        def sample():
            return tf.random.log_uniform_candidate_sampler(classes, 1, 64, True, 1000)[0]

        return sample

    reference = make()
    plain = [reference().numpy() for _ in range(3)]
    assert not all((p == plain[0]).all() for p in plain[1:])  # the stream moves on
    sample = make()
    assert (sample().numpy() == plain[0]).all()
    report = nddebug.check(lambda: sample(), repeats=3)
    assert report.ok, str(report)
    assert (sample().numpy() == plain[2]).all()


def test_eager_ops_with_their_own_seed_are_said_to_move_on_in_rerun_mode_too() -> None:
    """Rerun mode runs the step once traced: an eager op with a seed= of its own drew from the
    process's kernel for that seed, and the steps after check() drew further on, with no word
    (probe round 31, F3). An op seed drawn from the global seed alone comes from check()'s own
    stream and leaves the user's kernels alone: no such warning there (F4)."""
    tf.random.set_seed(0)
    w = tf.Variable(tf.zeros([16]))

    def own_seed() -> None:
        w.assign_add(tf.random.uniform([16], seed=5))

    def global_seed() -> None:
        w.assign_add(tf.random.uniform([16]))

    report = nddebug.check(own_seed, state=w, mode="rerun")
    assert any("with a seed= of their own (RandomUniform)" in x for x in report.warnings)
    for mode in ("rerun", "repeat"):
        report = nddebug.check(global_seed, state=w, repeats=2, mode=mode)
        assert not any("with a seed= of their own" in x for x in report.warnings), report.warnings
    # check(seed=...) seeds TensorFlow itself (tf.random.set_seed resets every kernel): the
    # op seeds are then TensorFlow's, not "of their own".
    report = nddebug.check(global_seed, state=w, repeats=2, seed=3)
    assert not any("with a seed= of their own" in x for x in report.warnings), report.warnings


def test_an_eager_seed_that_differs_between_runs_stays_a_random_source() -> None:
    """A seeded stream is a kernel going on with the same seeds; seeds that differ between
    the runs (drawn from Python's generator, which check() does not rewind between runs) are
    a random source, NOT reproducible."""
    import random

    tf.random.set_seed(0)
    w = tf.Variable(tf.zeros([16]))

    def step() -> None:
        w.assign_add(tf.random.uniform([16], seed=random.randrange(1, 2**30)))

    report = nddebug.check(step, state=w, repeats=3)
    assert report.verdict == "NOT reproducible", str(report)
    assert list(report.sources["kind"]) == ["random"], str(report)


def test_random_ops_lists_every_stateful_op_with_a_seeded_kernel() -> None:
    """recording.RANDOM_OPS is what check() gives fresh kernels and what a report calls a
    seeded stream: every stateful op TensorFlow registers with seed and seed2 attributes,
    but the queues (a resource) and cuDNN's RNNs (GPU dropout)."""
    from tensorflow.core.framework import op_def_pb2
    from tensorflow.python.client import pywrap_tf_session as c_api

    from nddebug.recording import RANDOM_OPS

    ops = op_def_pb2.OpList()
    ops.ParseFromString(c_api.TF_GetBuffer(c_api.TF_GetAllOpList()))
    seeded = {
        op.name
        for op in ops.op
        if op.is_stateful
        and {"seed", "seed2"} <= {a.name for a in op.attr}
        and "Queue" not in op.name
        and not op.name.startswith("CudnnRNN")
    }
    assert seeded == set(RANDOM_OPS)


def test_a_function_traced_before_the_global_seed_is_not_called_reproducible() -> None:
    """A tf.function first called with no global seed holds an unseeded RandomUniform, which
    draws other numbers in every process; check() after tf.random.set_seed retraced a copy in
    which the op was seeded, and said "reproducible" (probe round 36, finding 3). It says
    what it checked instead, and the verdict is "not everything compared". A function first
    traced after the seed was set is checked as it runs. (A fresh interpreter: the global
    seed is process-wide.)"""
    out = run_python(
        """
import json
import tensorflow as tf
import nddebug

w = tf.Variable(tf.ones([4]))

def make():
    @tf.function
    def step():
        w.assign_add(tf.random.uniform([4]) * 1e-3)
    return step

early = make()
early()  # traced with no global seed: unseeded in the program
tf.random.set_seed(5)
late = make()
late()  # traced under the seed: seeded
reports = [nddebug.check(f, state=w, repeats=3) for f in (early, late)]
print(json.dumps([
    [r.summary["verdict"], any("traced before a global seed" in x for x in r.warnings)]
    for r in reports
]))
"""
    )
    assert out[0] == ["no difference seen, but not everything compared", True], out
    assert out[1] == ["reproducible", False], out


def test_xla_random_ops_drawing_on_a_process_counter_are_a_stream_not_a_source() -> None:
    """A jit_compile step with tf.nn.dropout(seed=3): XLA ignores the seed and draws from a
    counter of the process that every call advances, so check()'s runs differ while fresh
    processes agree bit for bit (two plain processes, 4 steps each: probe round 37). It was
    "NOT reproducible" with the advice to seed what was seeded. A random op outside the
    compiled function with no seed at all still makes the step NOT reproducible."""
    tf.random.set_seed(0)
    w = tf.Variable(tf.ones([8, 4]))
    x = tf.constant(np.random.RandomState(0).randn(16, 8).astype("float32"))

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.dropout(x @ w, 0.3, seed=3) ** 2)
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    drew_on = "NOT compared: XLA-compiled random ops drew on from the process's counter"
    report = nddebug.check(step, x, state=w, repeats=3)
    assert report.verdict == drew_on, str(report)
    assert not report.ok
    assert set(report.sources["kind"]) == {"compiled stream"}, str(report)
    assert not any(fix.startswith("Seed it") for fix in report.sources["fix"]), str(report)
    tf.random.set_seed(None)

    # With no seed at all the same (probe round 42, F1: fresh processes agreed bit for bit,
    # seeded or not): the compiled program as the user runs it is not said to differ. With
    # XLA off the op is a random source, and its row says to seed it.
    @tf.function(jit_compile=True)
    def noisy(x):
        w.assign_sub(0.01 * tf.transpose(x) @ (x @ w * tf.random.uniform([16, 4])))
        return tf.reduce_sum(w)

    # What the runs moved on cannot be put back: said as a Python warning too, which a
    # DeterminismCheck's training after the check goes on with (probe round 42, F2).
    with pytest.warns(UserWarning, match="check\\(\\) cannot put it back"):
        report = nddebug.check(noisy, x, state=w, repeats=3)
    assert report.verdict == drew_on, str(report)
    compiled = report.sources[report.sources["program"] == "as compiled (XLA)"]
    assert list(compiled["kind"]) == ["compiled stream"], str(report)
    assert "without a seed" in compiled["explanation"].iloc[0], str(report)
    xla_off = report.sources[report.sources["program"] == "XLA off"]
    assert list(xla_off["op_type"]) == ["RandomUniform"], str(report)

    def unseeded(x):
        return step(x) + tf.reduce_sum(tf.random.uniform([64]))

    report = nddebug.check(unseeded, x, state=w, repeats=3)
    assert report.verdict == "NOT reproducible", str(report)
    assert "RandomUniform" in set(report.sources["op_type"]), str(report)


def test_check_with_seed_leaves_the_programs_random_streams_as_they_were() -> None:
    """check(seed=0) left Python's, NumPy's and TensorFlow's global seed at 0, and Keras's
    global SeedGenerator replaced, and ran its final step seeded: the draws after it were
    those of seed 0, not the program's (probe rounds 37 and 38). Each run also made a new
    Keras global SeedGenerator, so a step drawing from keras.random "took a different path".
    The kernels tf.random.set_seed drops cannot be given back: that is said."""
    import random

    def program(checked: bool) -> tuple[Any, ...]:
        keras.utils.set_random_seed(1)
        w = tf.Variable(tf.zeros([4]))

        def step() -> None:  # draws from every global stream
            n = np.random.rand(4).astype(np.float32) + random.random()
            w.assign_add(tf.constant(n) + tf.random.uniform([4]) + keras.random.normal([4]))

        step()
        if checked:
            report = nddebug.check(step, state=w, repeats=2, seed=0)
            assert report.verdict == "reproducible", str(report)
            assert any("drop the kernels" in m for m in report.warnings), report.warnings
        else:
            step()
        step()
        return (
            w.numpy().tobytes(),
            np.random.rand(),
            random.random(),
            tf.random.uniform([2]).numpy().tobytes(),
            keras.random.normal([2]).numpy().tobytes(),
        )

    assert program(checked=True) == program(checked=False)
