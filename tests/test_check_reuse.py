"""check() traces and instruments a step once for all its checks with the same settings.

A copy per check cost a whole trace, instrumentation and optimization each time, and
TensorFlow keeps the graph of a function that applies a Keras optimizer's gradients for the
life of the process: a DeterminismCheck every step grew a small MLP's process by ~5.7 MB per
check. What the copy was made under (GPU emulation, op determinism, seeds, the model's own
functions) still gets a copy of its own, and what instrumenting said is said in every check.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug.keras import DeterminismCheck

pytestmark = pytest.mark.usefixtures("cpu_facts")


class _Counted(keras.Sequential):
    """Counts how often Keras traces its train step (once per train function it builds)."""

    traces = 0

    def train_step(self, data):
        type(self).traces += 1
        return super().train_step(data)


def _model(optimizer: str = "adam") -> keras.Model:
    keras.utils.set_random_seed(0)
    model = _Counted(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)],
        name="counted",
    )
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((n, 8), dtype=np.float32), rng.integers(0, 3, n)


def test_a_determinism_check_every_step_traces_the_train_step_once() -> None:
    def traces_of_fit(batches: int) -> int:
        x, y = _data(8 * batches)
        model = _model()
        _Counted.traces = 0
        callback = DeterminismCheck(every_n_steps=1, repeats=2, on_failure="raise")
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
        assert len(callback.reports) == batches and all(r.ok for r in callback.reports)
        assert all(r.summary["ops_traced"] > 20 for r in callback.reports)  # ops compared
        return _Counted.traces

    # As many traces for eight checks as for two (it was one more per check).
    assert traces_of_fit(8) == traces_of_fit(2)


def test_a_recompiled_model_is_checked_with_its_new_train_function() -> None:
    x, y = _data(16)
    model = _model()
    callback = DeterminismCheck(every_n_steps=1, repeats=2, on_failure="raise")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    _Counted.traces = 0
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    again = _Counted.traces
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _Counted.traces = 0
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    # compile() made new functions: the checks' copy is traced again with fit's own.
    assert _Counted.traces > again, (_Counted.traces, again)
    assert len(callback.reports) == 6 and all(r.ok for r in callback.reports)


def _segment_step():
    """A step whose segment sum is a GPU culprit (atomics), deterministic on the CPU."""
    rng = np.random.default_rng(1)
    data = tf.constant(rng.standard_normal(4096).astype(np.float32))
    ids = tf.constant(np.sort(rng.integers(0, 64, 4096)).astype(np.int32))

    @tf.function
    def step():
        # 64 segments: two random splits never give every sum the same bits (see
        # test_emulate_gpu's pretraced-function test).
        return tf.math.unsorted_segment_sum(data, ids, 64)

    return step


def test_a_copy_made_without_emulation_is_not_taken_for_an_emulated_check() -> None:
    step = _segment_step()
    assert nddebug.check(step, repeats=2, confirm=0).ok  # deterministic on the CPU
    emulated = nddebug.check(step, repeats=3, emulate_gpu=True, confirm=0)
    assert not emulated.ok
    assert "UnsortedSegmentSum" in set(emulated.culprits["op_type"]), emulated
    again = nddebug.check(step, repeats=2, confirm=0)
    assert again.ok


def test_a_checked_function_is_instrumented_once_and_compared_each_time() -> None:
    traced = []

    @tf.function
    def step(a):
        traced.append(1)
        return tf.reduce_sum(tf.matmul(a, a))

    a = tf.ones([4, 4])
    reports = [nddebug.check(step, a, repeats=2) for _ in range(3)]
    assert all(r.ok and r.summary["ops_traced"] >= 2 for r in reports)
    # The user's own trace (check()'s last, ordinary step) and check()'s one copy.
    assert len(traced) == 2, len(traced)


def test_what_instrumenting_said_is_said_in_every_check() -> None:
    @tf.function
    def helper(a):
        return a * 2.0

    a = tf.ones([4])
    helper(a)  # traced before any block: its ops cannot be recorded

    @tf.function
    def step(b):
        return helper(b) + 1.0

    first = nddebug.check(step, a, repeats=2)
    second = nddebug.check(step, a, repeats=2)
    said = [w for w in first.warnings if "traced before nddebug.trace()" in w]
    assert said, first.warnings
    assert said[0] in second.warnings, second.warnings


def test_a_recompile_is_seen_where_the_model_had_no_functions_of_its_own() -> None:
    """Checked before any fit, a model's own functions are None, and compile() leaves them
    None: the check after a compile took the train function built beside the first compile
    (the old optimizer, whose slots state= did not restore)."""
    x, y = _data(16)
    model = _model()

    def step() -> None:
        model.train_on_batch(x[:8], y[:8])

    nddebug.check(step, state=model, repeats=2, advance=False)
    _Counted.traces = 0
    nddebug.check(step, state=model, repeats=2, advance=False)
    assert _Counted.traces == 0  # the same compile: reused
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    report = nddebug.check(step, state=model, repeats=2, advance=False)
    assert _Counted.traces >= 1 and report.ok, (_Counted.traces, str(report))


def test_what_instrumenting_a_branch_said_is_said_in_every_check() -> None:
    """A note made in a tf.cond branch's graph (no function of its own): kept for the function
    the branch is built in, so the next check, which does not trace it again, says it too."""

    @tf.function
    def helper(a):
        return a * 2.0

    a = tf.ones([4])
    helper(a)  # traced before any block

    @tf.function
    def step(b):
        return tf.cond(tf.reduce_sum(b) > 0, lambda: helper(b), lambda: b) + 1.0

    first = nddebug.check(step, a, repeats=2)
    second = nddebug.check(step, a, repeats=2)
    said = [w for w in first.warnings if "traced before nddebug.trace()" in w]
    assert said, first.warnings
    assert said[0] in second.warnings, second.warnings


class _Noisy(tf.Module):
    """A module whose ``__call__`` is a tf.function, with an unseeded random op when asked."""

    def __init__(self, noisy: bool) -> None:
        super().__init__()
        self.noisy = noisy
        self.w = tf.Variable(tf.ones([4, 2]))

    @tf.function
    def __call__(self, x):
        delta = tf.random.uniform([4, 2]) if self.noisy else tf.fill([4, 2], 0.5)
        self.w.assign_add(delta)
        return tf.reduce_sum(x @ self.w)


def test_a_module_whose_call_is_a_tf_function_is_checked_as_that_function() -> None:
    """check(module) ran the module's function as traced before the check, uninstrumented: the
    source was the whole call, with the advice to give check() the function, which the user
    had done (probe round 47, F2)."""
    x = tf.ones([3, 4])
    noisy = _Noisy(noisy=True)
    noisy(x)  # traced and called before the check, as in training
    report = nddebug.check(noisy, x, state=noisy, repeats=3, quantify=False)
    sources = report.culprits[report.culprits.role == "source"]
    assert list(sources.op_type) == ["RandomUniform"], report
    assert not any("ran uninstrumented" in w for w in report.warnings), report.warnings

    calm = _Noisy(noisy=False)
    calm(x)
    for _ in range(2):  # the second check takes the copy the first kept
        report = nddebug.check(calm, x, state=calm, repeats=2, quantify=False)
        assert report.ok and report.summary["ops_traced"] > 1, report
    assert [v.name for v in calm.variables] == ["Variable:0"]  # nothing of nddebug's tracked
    # One step before, one per check (its final ordinary step): 1 + 3 * 0.5.
    np.testing.assert_array_equal(calm.w.numpy(), np.full([4, 2], 2.5, np.float32))


def _flagged_step(cfg: dict[str, bool], w: tf.Variable):
    @tf.function
    def step(x):
        h = x * w
        if cfg["noise"]:  # read while tracing: the graph keeps what it was then
            h = h + tf.random.uniform([4])
        w.assign_add(h * 0.1)
        return tf.reduce_sum(h)

    return step


def test_a_copy_traced_under_other_python_values_is_said_to_check_another_program() -> None:
    """check() retraces the step: traced with an unseeded random op behind a Python flag
    that was turned off since, the function still draws in every call, but check()'s copy
    did not, and the step was "reproducible" (probe round 47, F12)."""
    x = tf.ones([4])
    cfg = {"noise": True}
    w = tf.Variable(tf.ones([4]))
    step = _flagged_step(cfg, w)
    step(x)
    cfg["noise"] = False
    report = nddebug.check(step, x, state=[w], repeats=2, quantify=False)
    assert not report.ok, report
    (note,) = [n for n in report.not_compared if "traced a copy" in n]
    assert "lacks" in note and "RandomUniform" in note, note

    # The flag as it was when the function was traced: the same program, nothing said.
    step = _flagged_step(cfg, w)
    step(x)
    report = nddebug.check(step, x, state=[w], repeats=2, quantify=False)
    assert report.ok and not report.not_compared, report
