"""Bad input through the API: the user's own exception is never replaced, and runs that are not
comparable as they stand are said so next to the verdict."""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

import pytest
import tensorflow as tf

import nddebug


def _runs(n: int = 2) -> list[nddebug.Recording]:
    @tf.function
    def step(x):
        return tf.reduce_sum(tf.tanh(x) * 2.0)

    recs = []
    for _ in range(n):
        with nddebug.trace() as rec:
            step(tf.ones([16]))
        recs.append(rec)
    return recs


def test_a_failed_save_never_replaces_the_blocks_own_exception(tmp_path: Any) -> None:
    # The folder is there when the block starts (a missing one fails at once) and gone when
    # it ends.
    folder = os.path.join(tmp_path, "gone")
    path = os.path.join(folder, "run.nddebug")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ZeroDivisionError):
            os.makedirs(folder)
            with nddebug.trace(path=path):
                tf.constant(1.0) + 1.0
                os.rmdir(folder)
                raise ZeroDivisionError("the user's own")
    assert any("could not be saved" in str(w.message) for w in caught)
    # Without an exception in the block, the save error is the error.
    with pytest.raises(nddebug.RecordingFileError):
        os.makedirs(folder)
        with nddebug.trace(path=path):
            tf.constant(1.0) + 1.0
            os.rmdir(folder)


def test_an_interrupted_run_is_not_compared_as_complete() -> None:
    recs = _runs()
    recs[1] = dataclasses.replace(recs[1], status="interrupted")
    report = nddebug.compare(recs)
    assert not report.ok
    assert report.verdict == "no difference seen, but not everything compared"
    assert "exception inside the block" in str(report)


@pytest.mark.parametrize("code, status", [(0, "complete"), (None, "complete"), (3, "interrupted")])
def test_a_block_ended_by_sys_exit_is_complete_only_when_the_exit_is_clean(code, status) -> None:
    """sys.exit(0) inside a block ends the program as meant: its run is whole, and comparing
    it must not say "compared only as far as they ran" (exit code 1 under nddebug run)."""
    with pytest.raises(SystemExit):
        with nddebug.trace() as rec:
            tf.reduce_sum(tf.ones([4]) * 2.0)
            raise SystemExit(code)
    assert rec.status == status


def test_runs_of_different_setups_are_said_next_to_the_verdict() -> None:
    recs = _runs()
    env = dict(recs[1].environment)
    env["tensorflow"] = "2.20.0"
    recs[1] = dataclasses.replace(recs[1], environment=env)
    text = str(nddebug.compare(recs))
    assert "different TensorFlow versions" in text and "2.20.0" in text


def test_trace_refuses_a_bad_detail_and_rerun_before_running() -> None:
    with pytest.raises(ValueError, match="detail"):
        with nddebug.trace(detail="everything"):
            raise AssertionError("must not run")
    with pytest.raises(ValueError, match="rerun"):
        with nddebug.trace(rerun=-1):
            raise AssertionError("must not run")


def test_a_first_run_that_creates_variables_is_explained_as_setup() -> None:
    """Two in-process blocks of a fresh Keras model's fit: the first creates the optimizer's
    slots, the second reuses them. The ops that ran in the first only are called first-call
    setup, with what to do, not an unexplained path."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).random((16, 8), dtype=np.float32)
    init = [v.numpy() for v in model.weights]
    recs = []
    for _ in range(2):
        for v, value in zip(model.weights, init, strict=True):
            v.assign(value)
        for v in model.optimizer.variables:
            v.assign(np.zeros(v.shape, v.dtype))
        with nddebug.trace() as rec:
            model.fit(x, x[:, :4], batch_size=16, epochs=1, verbose=0)
        recs.append(rec)
    report = nddebug.compare(recs)
    setup = report.culprits[report.culprits["role"] == "control flow"]
    assert len(setup) and all("first call" in e for e in setup["explanation"])


def test_many_repeats_keep_one_copy_of_runs_that_match(monkeypatch: Any) -> None:
    """check(repeats=N) holds the events of the different runs only: a deterministic step
    repeated 60 times keeps one copy; a step that differs every time keeps the first
    MAX_DISTINCT_REPEATS, and says how many it left out."""
    import sys

    module = sys.modules["nddebug.check"]
    w = tf.Variable(tf.ones([64, 64]) * 0.01)

    @tf.function
    def step(x):
        y = tf.tanh(tf.matmul(x, w))
        w.assign_sub(0.01 * y)
        return tf.reduce_sum(y)

    x = tf.ones([64, 64])
    report = nddebug.check(step, x, repeats=60, state=[w], quantify=False, confirm=0)
    assert report.ok, str(report)
    assert len(report.recordings) == 60
    assert len({id(r.events) for r in report.recordings}) == 1

    @tf.function
    def noisy(x):
        return tf.reduce_sum(x * tf.random.uniform([64, 64]))  # unseeded: differs every time

    monkeypatch.setattr(module, "MAX_DISTINCT_REPEATS", 4)
    report = nddebug.check(noisy, x, repeats=10, quantify=False, confirm=0)
    assert not report.ok
    assert len(report.recordings) == 4
    assert "RandomUniform" in set(report.sources["op_type"])
    assert any("6 repeat(s)" in w and "left out" in w for w in report.warnings), report.warnings
    assert "left out of the comparison" in str(report)


def test_a_run_compared_with_itself_is_refused(tmp_path: Any) -> None:
    """`nddebug diff a.nddebug a.nddebug`, or one run passed twice, said "reproducible" with
    the bound of two clean runs: a run agrees with itself by definition."""
    import subprocess
    import sys

    from tests.helpers import subprocess_env

    recs = _runs()
    with pytest.raises(nddebug.NotComparableError, match="given 2 times"):
        nddebug.compare([recs[0], recs[1], recs[0]])
    assert nddebug.compare(recs).ok  # two runs of their own
    path = str(tmp_path / "runs.nddebug")
    for rec in recs:
        rec.save(path)
    out = subprocess.run(
        [sys.executable, "-m", "nddebug", "diff", path, path],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert out.returncode == 2 and "compared with itself" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("cut_first", [False, True])
def test_a_run_cut_short_is_compared_as_far_as_it_ran(cut_first: bool) -> None:
    """A run stopped by Ctrl-C after 3 of 6 steps: the complete run's last 3 steps "ran in
    some runs only", and runs that agreed bit for bit as far as both went were "NOT
    reproducible" with control-flow rows. A difference within the common steps still is."""
    v = tf.Variable(tf.ones([32]))

    @tf.function
    def step(x):
        v.assign(tf.tanh(v * x) + 0.5)
        return tf.reduce_sum(v)

    def run(steps: int, noise: float = 0.0) -> nddebug.Recording:
        v.assign(tf.ones([32]))
        try:
            with nddebug.trace() as rec:
                for i in range(6):
                    if i == steps:
                        raise KeyboardInterrupt
                    step(tf.fill([32], 1.0 + (noise if i == 1 else 0.0)))
        except KeyboardInterrupt:
            pass
        return rec

    full, cut = run(6), run(3)
    assert cut.status == "interrupted"
    report = nddebug.compare([cut, full] if cut_first else [full, cut])
    assert not report.comparison.findings and not report.comparison.paths, str(report)
    assert report.verdict == "no difference seen, but not everything compared", str(report)
    differs = nddebug.compare([run(6), run(3, noise=0.25)])
    assert differs.verdict == "NOT reproducible", str(differs)
    assert differs.first_divergence.step == 2, differs.first_divergence


def test_a_bad_recording_path_fails_before_the_block_runs(tmp_path) -> None:
    """trace(path=...) with a folder, a missing folder or a file that is no recording raised
    only when the block ended: a long training run lost its recording at the very end
    (probe round 37). check(path=...) too: it failed after its warm-up."""
    from nddebug.errors import RecordingFileError

    v = tf.Variable(1.0)
    other = tmp_path / "notes.txt"
    other.write_text("not a recording\n" * 4)
    for path in (tmp_path, tmp_path / "missing" / "x.nddebug", other):
        with pytest.raises(RecordingFileError), nddebug.trace(path=str(path)):
            v.assign_add(1.0)
        with pytest.raises(RecordingFileError):
            nddebug.check(lambda: v.assign_add(1.0), state=v, path=str(path))
    assert float(v.numpy()) == 1.0  # nothing ran
    assert other.read_text() == "not a recording\n" * 4


def test_recordings_that_share_no_op_say_so() -> None:
    """compare() of a trace of one program and a trace of another said "NOT reproducible"
    with no source and a path that parted at op #0, and nothing about why (probe round 44,
    F5): they share no op, and the report says so."""
    x = tf.constant([0.5, 1.5, 2.5])

    def program_a():
        return tf.reduce_sum(tf.sin(x))

    def program_b():
        return tf.reduce_max(tf.cos(x) * 2.0)

    runs = {}
    for name, program in (("a", program_a), ("a again", program_a), ("b", program_b)):
        with nddebug.trace() as runs[name]:
            program()
    report = nddebug.compare([runs["a"], runs["b"]])
    said = [w for w in report.warnings if "share no op" in w]
    assert said and "run 0 began with Sin" in said[0] and "run 1 with Cos" in said[0], said
    assert "share no op" in str(report)
    # Runs of one program share their ops: nothing said.
    same = nddebug.compare([runs["a"], runs["a again"]])
    assert same.ok and not any("share no op" in w for w in same.warnings)


def test_check_refuses_a_step_it_cannot_run_before_running_it() -> None:
    """check() inside a tf.function failed in NumPy conversion; a generator or coroutine
    function "recorded no TensorFlow op" and left its coroutine unawaited (probe round 47,
    F15). Each is refused with what to do, and nothing of the step ran."""
    import asyncio

    from nddebug.errors import TraceError

    ran = []

    def step() -> Any:
        ran.append(1)
        return tf.reduce_sum(tf.ones([3]))

    @tf.function
    def outer() -> Any:
        nddebug.check(step, repeats=2)
        return tf.constant(0.0)

    with pytest.raises(TraceError, match=r"while a tf\.function is being traced"):
        outer()

    def generator() -> Any:
        ran.append(1)
        yield tf.ones([2])

    async def coroutine() -> Any:
        ran.append(1)
        await asyncio.sleep(0)

    for fn, what in ((generator, "a generator function"), (coroutine, "a coroutine function")):
        with pytest.raises(TypeError, match=what):
            nddebug.check(fn, repeats=2)
    assert not ran


def test_a_table_made_on_the_first_call_is_refused_with_what_to_do() -> None:
    """A tf.function that makes its lookup table on its first call and keeps it in Python:
    check()'s retraced copy cannot use it (nor can TensorFlow's own retrace), and check()
    ended with TensorFlow's "out of scope" TypeError (probe round 47, F6)."""
    held: dict[str, Any] = {}

    @tf.function
    def step(x: Any) -> Any:
        if "t" not in held:
            keys, values = tf.constant([1, 2, 3], tf.int64), tf.constant([0.5, 1.5, 2.5])
            init = tf.lookup.KeyValueTensorInitializer(keys, values)
            held["t"] = tf.lookup.StaticHashTable(init, 0.0)
        return tf.reduce_sum(held["t"].lookup(tf.constant([1, 3], tf.int64))) * tf.reduce_sum(x)

    x = tf.constant([1.0, 2.0, 3.0])
    step(x)
    with pytest.raises(TypeError, match="Create it outside the function"):
        nddebug.check(step, x, repeats=2)
    assert float(step(x)) == 18.0  # the function itself still runs
