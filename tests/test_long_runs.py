"""Whole training runs: at which step two runs first part, and how the divergence grows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug.examples import detection
from nddebug.timeline import sparkline, step_of
from tests.helpers import nddebug_run, subprocess_env


def _small_loop() -> Callable[..., Any]:
    """A fresh small training step (8x8 matmul, tanh, gradient, update) and a function that
    traces ``steps`` calls of it from the same initial weights, call ``differ_at`` alone
    getting an input that differs (as a value read from outside TensorFlow would). With
    ``held``, the number of op executions in memory after each call is appended to it."""
    w = tf.Variable(tf.ones([8, 8]) * 0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.tanh(tf.matmul(x, w)))
        w.assign_sub(0.05 * tape.gradient(loss, w))
        return loss

    def run(
        steps: int,
        differ_at: int | None = None,
        value: float = 0.9,
        detail: str = "ops",
        path: str | None = None,
        held: list[int] | None = None,
    ) -> Any:
        w.assign(tf.ones([8, 8]) * 0.1)
        with nddebug.trace(path=path, detail=detail) as rec:
            for k in range(1, steps + 1):
                x = np.full([4, 8], 0.5, np.float32)
                if k == differ_at:
                    x[0, 0] = value
                step(tf.constant(x))
                if held is not None:
                    held.append(len(rec.events))
        return rec

    return run


def _loop(steps: int, differ_at: int | None, value: float = 0.9, detail: str = "ops") -> list[Any]:
    """Two runs of a ``steps``-step loop; in the second, call ``differ_at`` alone gets an input
    that differs."""
    run = _small_loop()
    return [run(steps, detail=detail), run(steps, differ_at, value, detail)]


def test_first_divergence_names_the_step_and_the_op() -> None:
    report = nddebug.compare(_loop(200, differ_at=137))
    fd = report.first_divergence
    assert fd is not None and fd.step == 137 and fd.steps == 200
    assert fd.op_type == "MatMul" and fd.role == "source"
    assert "test_long_runs.py" in fd.location
    text = " ".join(str(report).split())  # as wrapped for the location's length
    assert "first part at step 137 of 200" in text and "Steps 1 to 136 agree" in text
    assert fd.step_function == "step" and "A step is one call of step." in text
    # Everything after it only propagated: no variable read of a later step is a source.
    assert set(report.sources["op_type"]) == {"MatMul"}
    reads = report.culprits[report.culprits["op_type"] == "ReadVariableOp"]
    assert len(reads) and set(reads["role"]) == {"propagated"}
    counts = report.timeline
    assert len(counts) == 200 and not any(counts[:136]) and all(counts[136:])
    assert report.summary["first_divergence"]["step"] == 137
    assert "first divergence: step 137" in report._repr_html_()


@pytest.mark.parametrize("detail", ["ops", "steps"])
def test_a_step_that_returns_nothing_is_a_step(detail: str) -> None:
    """A tf.function with no arguments and no outputs (a step that updates variables and
    returns nothing): its call was dropped (no output, no input digest), so its ops belonged
    to no call, the run had no steps, and --steps/--bisect named step 1 of 1."""
    w = tf.Variable(tf.ones([4]))
    n = tf.Variable(0)

    @tf.function
    def step():
        g = tf.cos(w) * 0.01
        g = tf.cond(n >= 5, lambda: g + tf.random.uniform([4]) * 1e-3, lambda: g)
        w.assign_sub(g)
        n.assign_add(1)

    recs = []
    for _ in range(2):
        w.assign(tf.ones([4]))
        n.assign(0)
        with nddebug.trace(detail=detail) as rec:
            for _ in range(8):
                step()
        recs.append(rec)
    fd = nddebug.compare(recs).first_divergence
    assert fd is not None and (fd.step, fd.steps) == (6, 8), fd


def test_identical_runs_have_no_first_divergence() -> None:
    report = nddebug.compare(_loop(30, differ_at=None))
    assert report.ok and report.first_divergence is None
    assert report.timeline == [0] * 30 and report.summary["first_divergence"] is None


def test_a_racing_op_in_a_30_step_loop_is_the_only_source() -> None:
    """The CPU crop gradient races; whether or not it showed in these runs, nothing else is a
    source (every later read of the weights it updated only propagates), and the verdict is
    never "reproducible"."""
    step, args, state = detection.make_step(boxes=1024)
    state[-1].build([v for v in state if isinstance(v, tf.Variable)])  # its slots, counter
    # Everything the step updates, the optimizer's iteration counter too: a counter left
    # running would differ from the first call (the state was not restored), a source.
    weights = [v for v in state if isinstance(v, tf.Variable)] + list(state[-1].variables)
    initial = [v.numpy() for v in weights]
    recs = []
    for _ in range(2):
        for v, value in zip(weights, initial, strict=True):
            v.assign(value)
        with nddebug.trace() as rec:
            for _ in range(30):
                step(*args)
        recs.append(rec)
    report = nddebug.compare(recs)
    assert not report.ok
    assert set(report.sources["op_type"]) <= {"CropAndResizeGradImage"}, report.sources
    assert "CropAndResizeGradImage" in set(report.risks["op_type"])
    if report.first_divergence is not None:
        assert report.first_divergence.op_type == "CropAndResizeGradImage"


def test_updates_after_a_divergent_update_only_propagate() -> None:
    """After step 3's update differs, every later update of the variable outputs another
    value (its input is what the variable held) though its recorded inputs are identical:
    those updates carried the difference on; the runs part at step 3."""
    w = tf.Variable(tf.zeros([64]))

    @tf.function
    def step(x):
        w.assign_add(x)
        return tf.reduce_sum(w)

    recs = []
    for run in range(2):
        w.assign(tf.zeros([64]))
        with nddebug.trace() as rec:
            for k in range(1, 11):
                x = np.ones([64], np.float32)
                if run == 1 and k == 3:
                    x[0] = 2.0  # read from outside TensorFlow
                step(tf.constant(x))
        recs.append(rec)
    report = nddebug.compare(recs)
    fd = report.first_divergence
    assert fd is not None and fd.step == 3 and fd.op_type == "AssignAddVariableOp"
    assert len(report.sources) == 1 and "entered TensorFlow" in fd.explanation
    assert not any(report.timeline[:2]) and all(report.timeline[2:])


def test_step_numbering_and_sparkline() -> None:
    steps = [10, 20, 30]
    assert [step_of(steps, s) for s in (5, 10, 15, 20, 30, 99)] == [1, 1, 2, 2, 3, 3]
    assert step_of([], 5) is None
    assert sparkline([0, 0, 3, 9]) == "··▃█"
    assert len(sparkline(list(range(1000)), width=50)) <= 50


_PER_PROCESS_LOOP = textwrap.dedent(
    """
    import random
    import numpy as np, tensorflow as tf, nddebug

    w = tf.Variable(tf.ones([8, 8]) * 0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.tanh(tf.matmul(x, w)))
        w.assign_sub(0.05 * tape.gradient(loss, w))
        return loss

    with nddebug.trace():
        for k in range(1, 61):
            x = np.full([4, 8], 0.5, np.float32)
            if k == 41:
                x[0, 0] = random.SystemRandom().uniform(0.6, 0.9)  # per process
            step(tf.constant(x))
    """
)


def test_nddebug_run_names_the_step_where_processes_part(tmp_path: Any) -> None:
    proc = nddebug_run(tmp_path, _PER_PROCESS_LOOP, "--format", "json", name="loop.py")
    assert proc.returncode == 1, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)["summary"]
    assert summary["first_divergence"]["step"] == 41
    assert summary["first_divergence"]["steps"] == 60


def test_per_step_digests_find_the_step_and_one_step_in_full_names_the_op() -> None:
    """Two levels: one digest per step says where the runs part at a few bytes a step; the
    same loop with only that step recorded in full names the op."""
    cheap = nddebug.compare(_loop(200, differ_at=137, detail="steps"))
    assert all(len(r.events) == 200 for r in cheap.recordings)  # one execution per step
    fd = cheap.first_divergence
    assert fd is not None and fd.step == 137 and fd.op_type == "Step"
    assert "--bisect" in str(cheap)
    full = nddebug.compare(_loop(200, differ_at=137, detail="step:137"))
    fd = full.first_divergence
    assert fd is not None and fd.step == 137 and fd.op_type == "MatMul"
    assert set(full.sources["op_type"]) == {"MatMul"}
    # Steps before 137 are digests, step 137 is in full, nothing after it is kept.
    kinds = [r.ops[e.op_id].op_type for r in full.recordings[:1] for e in r.events]
    assert kinds.count("Step") == 136 and "MatMul" in kinds


def test_a_bad_detail_is_refused_before_anything_runs() -> None:
    import pytest

    with pytest.raises(ValueError, match="detail"):
        with nddebug.trace(detail="step:0"):
            raise AssertionError("the block must not run")


def _bisect(tmp_path: Any, script_text: str) -> subprocess.CompletedProcess:
    """``nddebug run -n 2 --bisect`` on ``script_text``, saved as a script in ``tmp_path`` and
    run there (its files land there too)."""
    return nddebug_run(tmp_path, script_text, "--bisect", name="loop.py")


def test_nddebug_run_bisect_names_the_op_of_the_first_divergent_step(tmp_path: Any) -> None:
    proc = _bisect(tmp_path, _PER_PROCESS_LOOP)
    assert proc.returncode == 1, proc.stderr[-3000:]
    first, _, second = proc.stdout.partition("=== --bisect: step 41")
    assert second, proc.stdout
    assert "first part at step 41 of 60, in Step" in first
    assert "first part at step 41" in second and "in MatMul" in second
    assert "did not replay" not in proc.stdout


def test_nddebug_run_bisect_says_when_the_divergence_did_not_recur(tmp_path: Any) -> None:
    """A divergence at step 41 in one process of the first pass only (the first to create a
    marker file): the second pass's two runs of that step agree. It printed a plain
    "reproducible" for them, as if the runs had never parted."""
    proc = _bisect(
        tmp_path,
        _PER_PROCESS_LOOP.replace(
            "if k == 41:",
            "if k == 41 and _first_process():",
        ).replace(
            "import random\n",
            "import os, random\n\n\n"
            "def _first_process():\n"
            "    try:\n"
            "        os.close(os.open('marker', os.O_CREAT | os.O_EXCL))\n"
            "        return True\n"
            "    except FileExistsError:\n"
            "        return False\n",
        ),
    )
    assert proc.returncode == 1, proc.stderr[-3000:]  # the runs did part
    first, _, second = proc.stdout.partition("=== --bisect: step 41")
    assert "first part at step 41 of 60" in first, proc.stdout
    assert "reproducible" in second and "does not happen in every run" in second, second


def test_nddebug_run_bisect_on_runs_that_make_different_numbers_of_steps(tmp_path: Any) -> None:
    """The first process stops after 47 steps, the others after 49 (an early stop, a time
    budget): each step is deterministic. --bisect counted the step to record in the reference
    run with a position in the other one, recorded step 47 in full, found it equal in both
    and blamed a race (probe round 32, F3). It now says the runs made different numbers of
    steps, and records nothing in full."""
    proc = _bisect(
        tmp_path,
        _PER_PROCESS_LOOP.replace("if k == 41:", "if k > stop:\n            break\n        if 0:")
        .replace("with nddebug.trace():", "stop = _stop()\nwith nddebug.trace():")
        .replace(
            "import random\n",
            "import os, random\n\n\n"
            "def _stop():\n"
            "    try:\n"
            "        os.close(os.open('marker', os.O_CREAT | os.O_EXCL))\n"
            "        return 47\n"
            "    except FileExistsError:\n"
            "        return 49\n",
        ),
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    first, _, second = proc.stdout.partition("=== --bisect: trace block 1 ===")
    assert "first part at step 48" in " ".join(first.split()), proc.stdout
    said = " ".join(second.split())
    assert "made different numbers of steps: run 1: 47, run 2: 49" in said, proc.stdout
    assert "does not happen in every run" not in proc.stdout
    assert "recorded in full in 2 fresh runs" not in proc.stdout


@pytest.mark.parametrize("detail", ["ops", "steps"])
def test_runs_of_different_lengths_part_at_the_first_step_one_did_not_make(detail: str) -> None:
    """Each step deterministic, one run stopping after 47 steps and the other after 49, with
    an eager read after every step (logging). Per-step digests matched the ops after each
    run's last call with each other: a source at step 47, "steps 1 to 46 agree"; recorded in
    full it was a control-flow difference at step 48 (probe round 32, F4). And "step 48 of
    47" read as a bug (F5)."""
    w = tf.Variable(tf.ones([8, 1]))

    @tf.function
    def step(x):
        w.assign_sub(0.01 * tf.matmul(x, w, transpose_a=True))
        return tf.reduce_sum(w)

    def run(stop: int) -> Any:
        w.assign(tf.ones([8, 1]))
        with nddebug.trace(detail=detail) as rec:
            for i in range(stop):
                step(tf.fill([8, 8], 0.01 * i))
                tf.reduce_sum(w)  # read after every step, as logging does
        return rec

    report = nddebug.compare([run(47), run(49)])
    fd = report.first_divergence
    assert (fd.step, fd.role) == (48, "control flow"), fd
    assert report.sources.empty, str(report)
    assert fd.steps_per_run == [47, 49]
    text = " ".join(str(report).split())
    assert "at step 48 (the runs made different numbers of steps: run 1: 47, run 2: 49)" in text
    assert "Steps 1 to 47 agree" in text


def test_a_long_block_with_a_path_is_written_as_it_runs(tmp_path: Any, monkeypatch: Any) -> None:
    """trace(path=...) holds at most about a chunk of op executions in memory: the rest is in
    the file while the block still runs, and the run read back is the whole run."""
    from nddebug import storage

    monkeypatch.setattr(storage, "CHUNK_EVENTS", 300)
    loop = _small_loop()

    def run(path: str | None, differ_at: int | None = None, detail: str = "ops") -> Any:
        held: list[int] = []
        return loop(150, differ_at, 0.7, detail, path, held), held

    path = str(tmp_path / "long.nddebug")
    plain, _ = run(None)
    streamed, held = run(path)
    assert max(held) < 300 + 20  # a chunk and one step, not the run's 1,500
    assert streamed.events == [] and streamed.streamed_to == path
    whole = streamed.whole()
    assert len(whole.events) == len(plain.events) == 1500
    assert nddebug.compare([plain, streamed]).ok
    other, _ = run(path, differ_at=97)
    report = nddebug.compare([streamed, other])
    assert report.first_divergence.step == 97 and report.first_divergence.op_type == "MatMul"
    assert [r.run_id for r in nddebug.load(path)] == [streamed.run_id, other.run_id]
    # One digest per step streams too.
    steps, _ = run(path, detail="steps")
    assert len(steps.whole().events) == 150
    # Every call fills a chunk: nothing is left in memory at the end, and that is no sign
    # of an empty block.
    monkeypatch.setattr(storage, "CHUNK_EVENTS", 10)
    each, _ = run(str(tmp_path / "each.nddebug"))
    assert each.events == [] and len(each.whole().events) == 1500
    assert not any("No TensorFlow op ran" in w for w in each.warnings + each.whole().warnings)


def test_long_runs_in_a_file_are_compared_as_arrays(tmp_path: Any) -> None:
    """compare_file reads long runs as arrays of digests and only the first divergent call in
    full: the same step, op, role and timeline as comparing the runs loaded whole."""
    from nddebug import storage
    from nddebug.longruns import compare_file

    path = str(tmp_path / "runs.nddebug")
    for rec in _loop(200, differ_at=137):
        rec.save(path)
    whole = nddebug.compare(nddebug.load(path))
    report = compare_file(path, long_run=500)  # 2,000 executions per run: "long"
    assert report.window is not None and report.window.executions == 2000
    assert all(len(r.events) == 10 for r in report.recordings)  # one call of each run read
    fd, expected = report.first_divergence, whole.first_divergence
    assert fd is not None and expected is not None
    assert (
        (fd.step, fd.steps, fd.op_type, fd.role, fd.index)
        == (
            expected.step,
            expected.steps,
            expected.op_type,
            expected.role,
            expected.index,
        )
        == (137, 200, "MatMul", "source", expected.index)
    )
    assert set(report.sources["op_type"]) == {"MatMul"}
    assert not any(report.timeline[:136]) and all(report.timeline[136:])
    assert report.timeline[136] == whole.timeline[136]
    text = str(report)
    assert "first part at step 137 of 200" in text and "compared as digests" in text
    # Identical runs: ok, every execution compared.
    same = str(tmp_path / "same.nddebug")
    for rec in _loop(50, differ_at=None):
        rec.save(same)
    assert [n for *_, n in storage.run_index(same)] == [500, 500]
    assert compare_file(same, long_run=100).ok
    # `nddebug report` takes the same path for long runs.
    proc = subprocess.run(
        [sys.executable, "-m", "nddebug", "report", "--format", "json", path],
        capture_output=True,
        text=True,
        env=subprocess_env({"NDDEBUG_LONG_RUN": "500"}),
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)["summary"]
    assert summary["first_divergence"]["step"] == 137
    assert summary["op_executions_per_run"] == 2000
    assert any("compared as digests" in n for n in summary["notes"]), summary["notes"]


@pytest.mark.parametrize("detail", ["ops", "steps"])
def test_one_step_function_called_from_two_loops_is_one_training_step(detail: str) -> None:
    """Steps 1-5 from one loop, 6-10 from another: the full-detail report counted the calls of
    one line only ("step 5 of 5") where --steps said step 7 of 10."""
    w = tf.Variable(tf.ones([4]))

    @tf.function
    def step(x):
        w.assign_sub(tf.sin(w * x) * 0.01)
        return tf.reduce_sum(w)

    recs = []
    for run in range(2):
        w.assign(tf.ones([4]))
        xs = [1.0] * 10
        if run:
            xs[6] = 1.5  # step 7 gets another input in the second run
        with nddebug.trace(detail=detail) as rec:
            for x in xs[:5]:
                step(tf.constant(x))
            for x in xs[5:]:
                step(tf.constant(x))
        recs.append(rec)
    fd = nddebug.compare(recs).first_divergence
    assert fd is not None and (fd.step, fd.steps) == (7, 10), fd


@pytest.mark.parametrize("detail", ["ops", "steps", "step:6"])
def test_variables_made_in_the_first_call_do_not_add_a_step(detail: str) -> None:
    """A Keras optimizer makes its slots inside the step's first call, and TensorFlow runs
    their initializer as a call of its own before the step: by steps, a run of 10 steps
    counted 11 and named the step after the one where the runs part ("step 7 of 11")."""
    recs = []
    for run in range(2):
        w = tf.Variable(tf.ones([4]))
        opt = keras.optimizers.SGD(0.1, momentum=0.9)

        @tf.function
        def step(x, w=w, opt=opt):
            opt.apply_gradients([(tf.sin(w * x), w)])
            return tf.reduce_sum(w)

        xs = [1.0] * 10
        if run:
            xs[5] = 1.5  # step 6 gets another input in the second run
        with nddebug.trace(detail=detail) as rec:
            for x in xs:
                step(tf.constant(x))
        recs.append(rec)
    fd = nddebug.compare(recs).first_divergence
    assert fd is not None and (fd.step, fd.steps) == (6, 10 if detail != "step:6" else 6), fd


def test_a_block_of_eager_ops_only_is_written_as_it_runs(tmp_path: Any, monkeypatch: Any) -> None:
    """No tf.function in the block: its eager ops stream to the file too, so memory stays
    bounded and a process that dies mid-block leaves the chunks so far (before, such a block
    held all its executions in memory and wrote nothing until it ended)."""
    from nddebug import storage

    monkeypatch.setattr(storage, "CHUNK_EVENTS", 100)
    path = str(tmp_path / "eager.nddebug")
    held = []
    x = tf.ones([4])
    with nddebug.trace(path=path) as rec:
        for _ in range(500):
            x = x * 1.0001
            held.append(len(rec.events))
        assert os.path.exists(path)  # chunks are there while the block still runs
    assert max(held) <= 100 and rec.events == [] and rec.streamed_to == path
    whole = rec.whole()
    assert [rec.ops[e.op_id].op_type for e in whole.events].count("Mul") == 500


def test_steps_are_counted_alike_in_full_and_by_steps_with_other_calls_between() -> None:
    """An evaluation function called every 5 steps: a step is a call of the training step, in
    full detail and with one digest per step (which counted every top-level call: "step 14 of
    36" for a divergence at step 12 of 30)."""
    w = tf.Variable(tf.ones([8, 8]) * 0.1)

    @tf.function
    def step(x):
        w.assign_sub(0.05 * tf.tanh(tf.matmul(x, w)))
        return tf.reduce_sum(w)

    @tf.function
    def evaluate(x):
        return tf.reduce_sum(tf.matmul(x, w))

    def run(detail: str, differ_at: int | None) -> Any:
        w.assign(tf.ones([8, 8]) * 0.1)
        with nddebug.trace(detail=detail) as rec:
            for k in range(1, 31):
                x = np.full([8, 8], 0.5, np.float32)
                x[0, 0] = 0.9 if k == differ_at else 0.5
                step(tf.constant(x))
                if k % 5 == 0:
                    evaluate(tf.constant(x))
        return rec

    for detail in ("ops", "steps"):
        fd = nddebug.compare([run(detail, None), run(detail, 12)]).first_divergence
        assert (fd.step, fd.steps) == (12, 30), (detail, fd.step, fd.steps)


def test_keras_validation_calls_are_not_training_steps() -> None:
    """fit with validation_data calls Keras's test function, named like its train function
    (multi_step_on_iterator) and called from the same line of the user's code: the steps were
    the train and test calls together (42 for 36 training batches)."""
    from nddebug.timeline import step_calls

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.ones((64, 4), np.float32), np.zeros((64, 1), np.float32)
    for detail in ("ops", "steps"):
        with nddebug.trace(detail=detail) as rec:
            model.fit(x, y, batch_size=16, epochs=2, verbose=0, validation_data=(x[:16], y[:16]))
        assert len(step_calls(rec)) == 8, detail  # 2 epochs of 4 batches; 2 validations


@pytest.mark.parametrize("detail", ["ops", "steps"])
def test_a_step_of_keras_with_steps_per_execution_is_said_to_be_one_call(
    detail: str, tmp_path: Any
) -> None:
    """With steps_per_execution=4 a step is one call of Keras's train function, 4 batches:
    the report said "step 3 of 4" for a difference in batch 9 of 10 and never said what it
    counted (probe round 32, F6). It names the function, and what a call of it is."""

    def run(noisy_from: int | None) -> Any:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
        model.compile("sgd", "mse", steps_per_execution=4)

        def batches() -> Any:
            for k in range(10):
                x = np.ones((16, 4), np.float32)
                if noisy_from is not None and k >= noisy_from:
                    x[:, 0] += 0.5  # a value read from outside TensorFlow that differs
                yield x, np.zeros((16, 1), np.float32)

        spec = (tf.TensorSpec([16, 4], tf.float32), tf.TensorSpec([16, 1], tf.float32))
        data = tf.data.Dataset.from_generator(batches, output_signature=spec)
        with nddebug.trace(detail=detail) as rec:
            model.fit(data, verbose=0)
        return rec

    recs = [run(None), run(8)]
    report = nddebug.compare(recs)
    fd = report.first_divergence
    # Batch 9 of 10 is in the third call; a fourth found the generator's end (its length is
    # unknown to Keras), and it is a call too.
    assert fd is not None and (fd.step, fd.steps) == (3, 4), fd
    assert fd.step_function == "multi_step_on_iterator"
    text = " ".join(str(report).split())
    assert fd.batches_per_call == 4, fd
    assert "A step is one call of multi_step_on_iterator (Keras's train function: " in text
    assert "steps_per_execution=4, so a call trains up to 4 batches)" in text
    # The file keeps it: the same sentence from the saved recordings.
    path = str(tmp_path / "runs.nddebug")
    for rec in recs:
        rec.save(path)
    assert nddebug.compare(nddebug.load(path)).first_divergence == fd


_EVAL_EVERY_4 = """
import numpy as np
import tensorflow as tf

import nddebug

w = tf.Variable(tf.ones([4, 1]))


@tf.function
def train(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((x @ w - 1.0) ** 2)
    w.assign_sub(0.05 * tape.gradient(loss, w))
    return loss


@tf.function
def evaluate(x):
    return tf.reduce_mean((x @ w - 1.0) ** 2)


rng = np.random.default_rng(0)
with nddebug.trace():
    for i in range(12):
        train(tf.constant(rng.normal(size=(8, 4)).astype("float32")))
        if i % 4 == 3:  # an evaluation fed by an unseeded draw: it alone differs
            evaluate(tf.constant(np.random.normal(size=(8, 4)).astype("float32")))
"""


def test_bisect_records_an_evaluation_with_the_step_it_leads_into(tmp_path: Any) -> None:
    """An evaluation call every 4 steps belongs to the step it leads into (step 5). The
    second pass recorded the evaluation's call alone, not training step 5, and its report
    said "step 4 of 4" and "steps 1 to 3 agree" where the first said step 5 of 12."""
    proc = _bisect(tmp_path, _EVAL_EVERY_4)
    assert proc.returncode == 1, proc.stderr[-3000:]
    first, _, second = proc.stdout.partition("=== --bisect: step 5 ")
    # Compared with the lines joined: where the text wraps depends on the script's path.
    assert "first part at step 5 of 12" in " ".join(first.split()), proc.stdout
    # The op ran in the evaluation call that leads into step 5, and the report says so.
    flat = " ".join(second.split())
    assert (
        "first part at step 5 of 5, in a call of evaluate before that step's own call, in MatMul"
        in flat
    ), second
    assert "Steps 1 to 4 agree" in flat and "did not replay" not in flat, second
    assert "(evaluate)" in second


def test_an_eager_block_folded_into_steps_says_it_was_one_step() -> None:
    """Steps end with top-level calls: a block of eager code alone folds into one step, and
    the report named a Step "created at ? on ?" with no word of why there was one step."""
    recs = []
    for k in range(2):
        with nddebug.trace(detail="steps") as rec:
            x = tf.ones([4])
            for i in range(5):
                x = x * 1.5 + (float(k) if i == 3 else 0.0)  # run 2 parts at iteration 4
        recs.append(rec)
    report = nddebug.compare(recs)
    (source,) = [f for f in report.comparison.findings if f.role == "source"]
    assert source.op.op_type == "Step"
    assert "called no tf.function" in source.explanation, source.explanation
    assert "created at ?" not in str(report)

    @tf.function
    def step(x):
        return x * 1.5

    recs = []
    for k in range(2):
        with nddebug.trace(detail="steps") as rec:
            for i in range(3):
                step(tf.ones([4]) + (float(k) if i == 2 else 0.0))
        recs.append(rec)
    (source,) = [f for f in nddebug.compare(recs).comparison.findings if f.role == "source"]
    assert source.op.op_type == "Step" and "called no tf.function" not in source.explanation


@pytest.mark.parametrize(
    ("callee", "name"),
    [
        ("session:Session.run@train.py:15 (<module>)", "Session.run"),
        ("eager:__inference_train_step_42@train.py:9 (main) via Trainer.fit", "train_step"),
    ],
)
def test_a_folded_step_names_its_function_without_the_key(callee: str, name: str) -> None:
    """With --steps a step is a Step op naming its call's key: the sentence printed the key
    ("A step is one call of session:Session.run@p10_tf1.py:15 (<module>)", probe round 34)."""
    from nddebug.recording import Event, OpInfo, Recording
    from nddebug.timeline import step_function

    rec = Recording(label="run", digest_algorithm="x", kind="run")
    rec.ops[1] = OpInfo(
        op_id=1,
        key="step:1",
        op_type="Step",
        op_name="all op executions of one step",
        graph="",
        device="",
        location="",
        dtypes=["int64"],
        shapes=[[2]],
        digestible=[True],
        attrs={"callee": callee},
    )
    rec.events.append(Event(0, 1, 0, [(1, 2)]))
    assert step_function(rec, [0]) == name


_VALIDATION_SHUFFLED = """
import keras
import numpy as np
import tensorflow as tf
import nddebug

x = np.linspace(-1, 1, 64 * 8, dtype=np.float32).reshape(64, 8)
y = x[:, :1] * 2
train = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
validation = tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).shuffle(32).batch(8)  # no seed
init = keras.initializers.Ones()
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, kernel_initializer=init)])
model.compile(optimizer="sgd", loss="mse")
with nddebug.trace():
    model.fit(train, validation_data=validation, epochs=2, verbose=0)
"""


def test_a_divergence_in_validation_is_said_to_be_in_another_call_than_the_step(
    tmp_path: Any,
) -> None:
    """Training agrees and only fit's validation (its test function, called before the next
    epoch's first step) reads a shuffled set: the report said "step 5 ... Steps 1 to 4
    agree" as if training had diverged (probe round 34)."""
    proc = nddebug_run(tmp_path, _VALIDATION_SHUFFLED, "--format", "json", name="fit.py")
    assert proc.returncode == 1, proc.stderr[-3000:]
    fd = json.loads(proc.stdout)["summary"]["first_divergence"]
    assert fd["step"] == 5 and fd["other_call_after"] is False, fd
    assert fd["other_call"].startswith("multi_step_on_iterator (from "), fd
    assert "evaluate" in fd["other_call"], fd
