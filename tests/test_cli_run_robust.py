"""`nddebug run` as a user meets it: chatty scripts, failures, Ctrl-C, -o, several blocks.

Real TensorFlow in every run; each script is written to tmp_path and kept tiny, so that a run
costs little more than importing TensorFlow.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import nddebug
from tests.helpers import CPU_ONLY, ROOT, subprocess_env

# Every test bounds its nddebug command: a hang fails the test instead of stalling the suite.
TIMEOUT = 120


def _script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _env(**extra: str) -> dict[str, str]:
    env = subprocess_env({**CPU_ONLY, **extra})
    env.pop("PYTHONHASHSEED", None)
    return env


def _nddebug(*args: str, cwd: str = ROOT, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nddebug", *args],
        capture_output=True,
        text=True,
        env=_env(**env),
        cwd=cwd,
        timeout=TIMEOUT,
    )


# Writes well over a pipe's 64 KB to stdout and to stderr, before, inside and after its block.
CHATTY = """
    import sys

    import tensorflow as tf

    import nddebug

    LINE = "x" * 99

    def chatter(tag):
        for _ in range(800):  # 80 KB a stream each time: 240 KB in all
            print(tag, LINE)
            print(tag, LINE, file=sys.stderr)

    chatter("before")
    with nddebug.trace():
        chatter("inside")
        tf.reduce_sum(tf.ones([4]) * 2.0)
    chatter("after")
    print("CHATTY-END", file=sys.stderr)
    sys.stderr.write("progress 95%")  # a last line left open
"""


def test_a_chatty_script_does_not_hang_and_each_run_has_its_progress_line(tmp_path) -> None:
    script = _script(tmp_path, "chatty.py", CHATTY)
    result = _nddebug("run", "-n", "2", script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reproducible — 2 runs" in result.stdout
    # Nothing the runs wrote reaches the terminal without --show-output.
    assert "CHATTY-END" not in result.stderr and "xxxx" not in result.stdout
    progress = [line for line in result.stderr.splitlines() if line.startswith("nddebug: run")]
    assert len(progress) == 2, result.stderr
    for i, line in enumerate(progress, 1):
        done = r"done in \d+\.\d s, 1 block\(s\), [1-9]\d* op executions"
        assert re.fullmatch(f"nddebug: run {i}/2: {re.escape(script)} … {done}", line), line


def _ends_inside_its_block(tmp_path, module: str, end: str) -> str:
    """A script whose trace() block runs one op, then ``end`` (from ``module``)."""
    return _script(
        tmp_path,
        "ends.py",
        f"""
        import {module}

        import tensorflow as tf

        import nddebug

        with nddebug.trace():
            tf.reduce_sum(tf.ones([4]) * 2.0)
            {end}
        """,
    )


def test_a_script_that_exits_cleanly_inside_its_block_is_reproducible(tmp_path) -> None:
    """sys.exit(0) inside the block was an interrupted run: "not everything compared", exit 1."""
    result = _nddebug("run", "-n", "2", _ends_inside_its_block(tmp_path, "sys", "sys.exit(0)"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "reproducible — 2 runs" in result.stdout
    assert "exception inside the block" not in result.stdout


def test_a_process_that_ends_inside_its_block_is_not_said_to_have_run_none(tmp_path) -> None:
    """os._exit(0) inside the block: "ran no nddebug.trace() block: wrap the training step"."""
    result = _nddebug("run", "-n", "2", _ends_inside_its_block(tmp_path, "os", "os._exit(0)"))
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("nddebug: error:")]
    assert "entered a nddebug.trace() block" in line and "os._exit()" in line, line
    assert "ran no nddebug.trace() block" not in result.stderr


def test_show_output_passes_the_runs_output_through_to_standard_error(tmp_path) -> None:
    script = _script(tmp_path, "chatty.py", CHATTY)
    result = _nddebug("run", "-n", "2", "--show-output", script)
    assert result.returncode == 0, result.stderr[-3000:]
    err = result.stderr
    assert err.count("CHATTY-END") == 2 and err.count("inside " + "x" * 99) == 2 * 2 * 800
    # The report alone on standard output, the progress around each run's output.
    assert "xxxx" not in result.stdout and "reproducible — 2 runs" in result.stdout
    assert err.index(f"nddebug: run 1/2: {script}\n") < err.index("CHATTY-END")
    assert f"nddebug: run 2/2: {script}: done in " in err
    # Not glued onto the script's open last line (probe round 45, F3).
    assert f"progress 95%\nnddebug: run 1/2: {script}: done in " in err


def test_a_script_that_asks_for_input_fails_at_once_instead_of_waiting(tmp_path) -> None:
    """Run from a terminal, a script's input() waited for ever: its prompt went to a file."""
    script = _script(
        tmp_path,
        "asks.py",
        """
        import tensorflow as tf

        import nddebug

        with nddebug.trace():
            tf.reduce_sum(tf.ones([4]) * 2.0)
        print("got", input("run name? "))
        """,
    )
    err = tmp_path / "err"
    with open(err, "w") as se:
        # A standard input that stays open and never says anything, like an idle terminal.
        proc = subprocess.Popen(
            [sys.executable, "-m", "nddebug", "run", "-n", "2", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=se,
            env=_env(),
            cwd=ROOT,
        )
        try:
            code = proc.wait(timeout=TIMEOUT)
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdin is not None
            proc.stdin.close()
    said = err.read_text()
    assert code == 2, said[-3000:]
    assert "run 1 failed" in said and "EOFError" in said, said[-3000:]


def test_a_run_killed_by_a_signal_says_which_and_a_folder_is_not_a_script(tmp_path) -> None:
    script = _script(
        tmp_path,
        "killed.py",
        """
        import os
        import signal

        import tensorflow as tf

        import nddebug

        with nddebug.trace():
            tf.reduce_sum(tf.ones([4]) * 2.0)
        os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    result = _nddebug("run", "-n", "2", script)
    assert result.returncode == 2, result.stderr[-3000:]
    said = "run 1 failed (exit -9: killed by SIGKILL (the system may have run out of memory))"
    assert said in result.stderr, result.stderr[-3000:]
    assert "recording(s) made before it are saved in" in result.stderr
    folder = _nddebug("run", "-n", "2", str(tmp_path))
    assert folder.returncode == 2
    assert f"{tmp_path} is a folder: name the script to run in it" in folder.stderr


def test_a_script_that_fails_before_any_op_under_all_saves_no_empty_recording(tmp_path) -> None:
    """Under --all, a SyntaxError leaves run 1 an interrupted block with no op in it: "the 1
    recording(s) made before it are saved" pointed at a file nothing could be read from
    (probe round 44, F7)."""
    script = _script(tmp_path, "broken.py", "import tensorflow as tf\nx = (\n")
    result = _nddebug("run", "-n", "2", "--all", script)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "run 1 failed" in result.stderr and "SyntaxError" in result.stderr
    assert "recording(s)" not in result.stderr, result.stderr[-3000:]


def test_blocks_of_a_child_process_are_matched_by_origin_not_by_finishing_order(
    tmp_path,
) -> None:
    """A launcher and the script it starts each record a block, into the same file, in the
    order they finish: the child's first in run 1, the parent's first in run 2. Matched by
    that order, two programs' blocks were compared: "NOT reproducible" for runs that agreed
    (probe round 45, F5)."""
    child = _script(
        tmp_path,
        "child.py",
        """
        import os, sys, time

        import tensorflow as tf

        import nddebug

        while sys.argv[1] != "now" and not os.path.exists(sys.argv[1]):
            time.sleep(0.05)  # run 2: the parent's block ends first
        with nddebug.trace():
            tf.reduce_sum(tf.ones([4]) * 3.0)
        """,
    )
    parent = _script(
        tmp_path,
        "launcher.py",
        f"""
        import os, subprocess, sys

        import tensorflow as tf

        import nddebug

        count = {str(tmp_path / "count")!r}
        n = len(open(count).read()) if os.path.exists(count) else 0
        open(count, "a").write("x")
        go = {str(tmp_path / "go")!r} + str(n)
        child = subprocess.Popen([sys.executable, {child!r}, "now" if n == 0 else go])
        with nddebug.trace():
            for i in range(3):
                tf.matmul(tf.ones([2, 2]), tf.ones([2, 2]) * float(i))
            if n == 0:
                child.wait()  # run 1: the child's block ends first
        open(go, "w").close()
        child.wait()
        """,
    )
    result = _nddebug("run", "-n", "2", parent)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.count("reproducible — 2 runs") == 2, result.stdout


def test_a_script_that_raises_keyboardinterrupt_itself_failed_it_was_not_interrupted(
    tmp_path,
) -> None:
    """Python ends a script's uncaught KeyboardInterrupt by killing itself with SIGINT, as a
    Ctrl-C would: nddebug said "interrupted" (exit 130), with no word of the script's
    traceback. A Ctrl-C reaches nddebug too; this one did not, so the run failed."""
    script = _script(
        tmp_path,
        "kbint.py",
        """
        import tensorflow as tf

        import nddebug

        with nddebug.trace():
            tf.reduce_sum(tf.ones([4]) * 2.0)
        raise KeyboardInterrupt("the script's own")
        """,
    )
    result = _nddebug("run", "-n", "2", script)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "run 1 failed (exit -2: killed by SIGINT (not a Ctrl-C given to nddebug" in (
        result.stderr
    ), result.stderr[-3000:]
    assert "KeyboardInterrupt: the script's own" in result.stderr
    assert "interrupted" not in result.stderr


def _short(*args: str) -> subprocess.CompletedProcess:
    """_nddebug with a short limit: what it checks must not wait on the file."""
    return subprocess.run(
        [sys.executable, "-m", "nddebug", *args],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=60,
    )


def test_a_named_pipe_or_a_device_is_refused_as_a_recording_file(tmp_path) -> None:
    """A FIFO given as a recording file blocked for ever on its first read (nddebug report
    FIFO, nddebug run -o FIFO), and /dev/null passed as an empty file, to fail only when the
    first run was saved (probe round 35, finding 6). Both are refused at once, before any run."""
    marker = tmp_path / "ran"
    script = _script(tmp_path, "marks.py", f"open({str(marker)!r}, 'w').close()\n")
    fifo = tmp_path / "pipe.nddebug"
    os.mkfifo(fifo)
    report = _short("report", str(fifo))
    assert report.returncode == 2, report.stderr
    assert f"{fifo} is a named pipe (FIFO), not a recording file" in report.stderr
    run = _short("run", "-n", "2", "-o", str(fifo), script)
    assert run.returncode == 2 and "a named pipe (FIFO)" in run.stderr, run.stderr
    null = _short("run", "-n", "2", "-o", os.devnull, script)
    assert null.returncode == 2 and f"{os.devnull} is a device" in null.stderr, null.stderr
    assert not marker.exists()


def test_an_output_folder_that_does_not_exist_fails_before_any_run(tmp_path) -> None:
    marker = tmp_path / "ran"
    script = _script(tmp_path, "marks.py", f"open({str(marker)!r}, 'w').close()\n")
    missing = tmp_path / "no" / "such" / "folder"
    result = _nddebug("run", "-n", "2", "-o", str(missing / "out.nddebug"), script)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"nddebug: error: -o {missing / 'out.nddebug'}: the folder {missing} does not exist"
    )
    assert not marker.exists()
    folder = _nddebug("run", "-n", "2", "-o", str(tmp_path), script)
    assert folder.returncode == 2 and "is a folder" in folder.stderr and not marker.exists()
    text = tmp_path / "notes.txt"
    text.write_text("not a recording")
    other = _nddebug("run", "-n", "2", "-o", str(text), script)
    assert other.returncode == 2 and f"-o {text}: exists and is not a recording" in other.stderr
    both = _nddebug("run", "--steps", "--bisect", "-n", "2", script)  # one or the other
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    assert not marker.exists()
    # report: the output's folder is checked before the report is computed, and named as -o's
    report = _nddebug("report", str(text), "-o", str(missing / "r.html"))
    assert report.returncode == 2
    assert report.stderr.strip() == (
        f"nddebug: error: -o {missing / 'r.html'}: the folder {missing} does not exist"
    )
    assert not marker.exists() and text.read_text() == "not a recording"


# Run 1 records its block; run 2 fails with exit 3 (before TensorFlow: it is quick).
FAILS_SECOND = """
    import os
    import sys

    if os.environ["NDDEBUG_LABEL"] == "process 1":
        print("preparing the data", file=sys.stderr)
        print("ValueError: no such file: data.csv", file=sys.stderr)
        sys.exit(3)

    import tensorflow as tf

    import nddebug

    with nddebug.trace():
        tf.reduce_sum(tf.ones([4]))
"""


def test_a_failing_run_from_a_read_only_folder_reports_the_script_and_keeps_run_one(
    tmp_path,
) -> None:
    script = _script(tmp_path, "fails.py", FAILS_SECOND)
    cwd = tmp_path / "read-only"
    cwd.mkdir()
    cwd.chmod(0o555)  # (root writes there all the same: hence the listing below)
    try:
        result = _nddebug("run", "-n", "3", script, cwd=str(cwd))
        assert os.listdir(cwd) == []  # no nddebug-partial.nddebug, nothing
    finally:
        cwd.chmod(0o755)
    assert result.returncode == 2
    err = result.stderr
    assert "Traceback" not in err and "nddebug-partial.nddebug" not in err
    assert f"nddebug: run 2/3: {script} … failed\n" in err
    assert "nddebug: error: run 2 failed (exit 3):\npreparing the data\n" in err
    assert "ValueError: no such file: data.csv\n" in err
    assert "run 3/3" not in err
    # Run 1's recording is kept, in a fresh temporary folder that the message names.
    saved = err.rsplit("The 1 recording(s) made before it are saved in ", 1)[1].strip()
    assert saved.endswith("fails.nddebug.") and not saved.startswith(str(cwd))
    path = saved[:-1]
    try:
        assert [r.label for r in nddebug.load(path)] == ["process 0"]
    finally:
        os.remove(path)
        os.rmdir(os.path.dirname(path))


# Two blocks that differ from each other, each the same in every run; the second block's
# run 2 sleeps (the Ctrl-C test stops it there).
TWO_BLOCKS = """
    import os
    import time

    import tensorflow as tf

    import nddebug

    with nddebug.trace():
        tf.reduce_sum(tf.ones([4]) * 2.0)
    with nddebug.trace(label="eval"):
        tf.reduce_max(tf.range(10.0) - 1.0)
    if os.environ.get("SLEEP_IN") == os.environ["NDDEBUG_LABEL"]:
        open(os.environ["PID_FILE"], "w").write(str(os.getpid()))
        time.sleep(600)
"""


def test_two_blocks_saved_with_o_give_the_runs_verdict_in_report(tmp_path) -> None:
    script = _script(tmp_path, "two.py", TWO_BLOCKS)
    out = str(tmp_path / "two.nddebug")
    result = _nddebug("run", "-n", "2", "-o", out, script)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "done in " in result.stderr and " s, 2 block(s), " in result.stderr
    assert result.stdout.count("reproducible — 2 runs") == 2 and "NOT" not in result.stdout
    labels = [r.label for r in nddebug.load(out)]
    assert labels == [
        "process 0 block 1", "process 0 block 2: eval", "process 1 block 1",
        "process 1 block 2: eval",
    ]  # fmt: skip
    report = _nddebug("report", out)
    assert report.returncode == 0, report.stdout + report.stderr
    assert report.stdout.count("reproducible — 2 runs") == 2 and "NOT" not in report.stdout
    assert "=== trace block 2 of 2: eval ===" in report.stdout
    # The same comparisons, one per block, as `run` made them (its mode line aside).
    strip = lambda text: [x for x in text.strip().splitlines() if "mode:" not in x]  # noqa: E731
    assert strip(report.stdout) == strip(result.stdout)


@pytest.mark.parametrize(
    ("sig", "code", "how"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped (SIGTERM)")],
)
def test_ctrl_c_or_sigterm_stops_the_runs_keeps_the_finished_ones(tmp_path, sig, code, how):
    """Ctrl-C, and SIGTERM (a CI runner's or a scheduler's stop): SIGTERM reaches nddebug's
    process alone, and the script's process went on running with nobody to wait for it."""
    script = _script(tmp_path, "two.py", TWO_BLOCKS)
    out = tmp_path / "kept.nddebug"
    pid_file = tmp_path / "sleeper.pid"
    err_path = tmp_path / "stderr.txt"
    env = _env(SLEEP_IN="process 1", PID_FILE=str(pid_file))
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nddebug", "run", "-n", "3", "-o", str(out), script],
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
            env=env,
            cwd=ROOT,
            # Ctrl-C as in a terminal, even where this test runs with SIGINT ignored.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            deadline = time.monotonic() + TIMEOUT
            # Run 1 done, run 2 recorded its blocks and sleeps: interrupt it there.
            while not (pid_file.exists() and pid_file.read_text()):
                assert proc.poll() is None, err_path.read_text()
                assert time.monotonic() < deadline, err_path.read_text()
                time.sleep(0.1)
            assert "nddebug: run 1/3" in err_path.read_text()
            assert " done in " in err_path.read_text()
            proc.send_signal(sig)
            stdout, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    err = err_path.read_text()
    assert proc.returncode == code, err
    assert "Traceback" not in err and stdout == ""
    lines = err.splitlines()
    assert lines[-2] == f"nddebug: run 2/3: {script} … interrupted", err
    assert lines[-1] == (
        f"nddebug: {how} in run 2/3, its processes stopped: the 4 recording(s) made so "
        f"far are saved in {out}."
    )
    # The sleeping run was killed (and reaped): its process is gone.
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
    # Run 1's two blocks, and the two that run 2 finished before it was stopped.
    labels = [r.label for r in nddebug.load(str(out))]
    assert labels[:2] == ["process 0 block 1", "process 0 block 2: eval"]
    assert labels[2:] == ["process 1 block 1", "process 1 block 2: eval"]


# check() under `nddebug run`: its own trace blocks (warm-up, repeats) are not the script's.
CHECKS = """
    import tensorflow as tf

    import nddebug

    x = tf.Variable(tf.ones([4]))

    def step():
        x.assign_add(tf.ones([4]))

    nddebug.check(step, repeats=2, state=[x])
    with nddebug.trace():
        tf.reduce_sum(x * 2.0)
"""


def _trace_has_record_env() -> bool:
    import inspect

    from nddebug.tracer import trace

    return "record_env" in inspect.signature(trace).parameters


@pytest.mark.xfail(
    not _trace_has_record_env(),
    strict=True,
    reason="check() needs trace(..., record_env=False) so as not to take NDDEBUG_RECORD from "
    "`nddebug run`: else its warm-up and repeats are saved as the script's blocks",
)
def test_check_inside_a_run_script_records_only_the_scripts_own_blocks(tmp_path) -> None:
    script = _script(tmp_path, "checks.py", CHECKS)
    out = str(tmp_path / "checks.nddebug")
    result = _nddebug("run", "-n", "2", "-o", out, script)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert [r.label for r in nddebug.load(out)] == ["process 0", "process 1"]


def test_report_reads_runs_workers_and_blocks_from_the_labels_run_gives() -> None:
    from nddebug.cli import _as_runs
    from nddebug.recording import Recording

    def recs(*labels: str) -> list[Recording]:
        return [Recording(label=label) for label in labels]

    def shape(per_run) -> list[list[list[str]]]:
        return [[[r.label for r in blocks] for blocks in run] for run in per_run]

    two = recs("process 0 block 1", "process 0 block 2: eval", "process 1 block 1")
    assert shape(_as_runs(two)) == [
        [["process 0 block 1", "process 0 block 2: eval"]], [["process 1 block 1"]]
    ]  # fmt: skip
    workers = recs("process 0 worker 0", "process 0 worker 1", "process 1 worker 1")
    assert shape(_as_runs(workers)) == [
        [["process 0 worker 0"], ["process 0 worker 1"]], [[], ["process 1 worker 1"]]
    ]  # fmt: skip
    # `run -o` twice into one file: the second session's runs follow the first's.
    assert len(_as_runs(recs("process 0", "process 1", "process 0", "process 1"))) == 4
    assert _as_runs(recs("process 0", "repeat 0")) is None  # not (only) `run`'s recordings
    assert _as_runs(recs("process 0 block 2")) is None  # a gap


def test_show_output_copies_whole_lines(tmp_path, capfd) -> None:
    from nddebug.cli import _Tail

    path = tmp_path / "out.txt"
    tail = _Tail(str(path))
    with open(path, "wb", buffering=0) as f:
        f.write(b"inside ")
        tail.pump()
        f.write(b"xxx\nnext ")
        tail.pump()
        assert capfd.readouterr().err == "inside xxx\n"  # not "next " yet: the line goes on
        f.write(b"line")
        tail.pump(final=True)
        assert capfd.readouterr().err == "next line"


def test_all_traces_the_verify_runs_too_and_says_determinism_the_script_turned_on(
    tmp_path,
) -> None:
    # --verify re-ran the script without --all's block ("ran no nddebug.trace() block"), and
    # a script that turns op determinism on first was described as run with it off.
    unseeded = _script(
        tmp_path,
        "unseeded.py",
        "import tensorflow as tf\nprint(float(tf.reduce_sum(tf.random.uniform([16]))))\n",
    )
    result = _nddebug("run", "-n", "2", "--all", "--verify", unseeded)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "ran no nddebug.trace() block" not in result.stdout
    assert re.search(r"RandomUniform\s+seeds\s+fixed", result.stdout), result.stdout[-2000:]
    determined = _script(
        tmp_path,
        "determined.py",
        """
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()
        print(float(tf.reduce_sum(tf.ones([16]) * 3.0)))
        """,
    )
    result = _nddebug("run", "-n", "2", "--all", "--format", "json", determined)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"op_determinism": true' in result.stdout, result.stdout[:2000]


def test_runs_that_shared_one_pythonhashseed_say_set_order_could_not_show(tmp_path) -> None:
    """PYTHONHASHSEED set in the shell is inherited by every run (the default): each process
    then hashes strings alike, and a step fed in set order was "reproducible" in every run,
    while processes started without it differ. The verdict says what the runs held fixed;
    runs with a new hash salt each say nothing of it."""
    script = _script(
        tmp_path,
        "setorder.py",
        """
        import tensorflow as tf

        import nddebug

        names = sorted({"alpha", "beta", "gamma"})  # sorted: the same in every process
        with nddebug.trace():
            tf.reduce_sum(tf.constant([float(len(n)) for n in names]) * 2.0)
        """,
    )
    # (--hashseed 0 sets it as a shell's would be inherited: these tests run without it.)
    fixed = _nddebug("run", "-n", "2", "--hashseed", "0", script)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr[-3000:]
    assert "reproducible — 2 runs" in fixed.stdout, fixed.stdout
    assert "every run had PYTHONHASHSEED=0" in fixed.stdout, fixed.stdout
    salted = _nddebug("run", "-n", "2", "--hashseed", "random", script)
    assert salted.returncode == 0, salted.stdout + salted.stderr[-3000:]
    assert "reproducible — 2 runs" in salted.stdout and "PYTHONHASHSEED" not in salted.stdout


def test_a_one_run_file_and_a_timeout_say_what_they_are_about(tmp_path) -> None:
    """`nddebug report` on a file with one run said why it could not compare, not which file;
    `--timeout` on a one-process run blamed a worker waiting for a missing peer."""
    path = tmp_path / "one.nddebug"
    script = _script(
        tmp_path,
        "one.py",
        f"""
        import tensorflow as tf

        import nddebug

        with nddebug.trace(path={str(path)!r}):
            tf.reduce_sum(tf.ones([3]) * 2.0)
        """,
    )
    made = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, env=_env(), timeout=TIMEOUT
    )
    assert made.returncode == 0, made.stderr[-3000:]
    report = _nddebug("report", str(path))
    assert report.returncode == 2
    assert f"{path}: comparison needs at least two recordings" in report.stderr, report.stderr
    slow = _script(tmp_path, "slow.py", "import time\n\ntime.sleep(30)\n")
    stopped = _nddebug("run", "-n", "2", "--timeout", "1", slow)
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    assert "run 1 timed out after 1 s: still running, all stopped" in stopped.stderr
    assert "peer" not in stopped.stderr and "raise --timeout" in stopped.stderr


def test_a_script_run_by_a_relative_path_finds_the_files_beside_it(tmp_path) -> None:
    """`python sub/script.py` gives the script an absolute __file__ (Python 3.9+); `nddebug run
    sub/script.py` gave it the relative path, and a script that changes directory and then
    opens a file beside itself failed only under nddebug (probe round 48, F7)."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "data.txt").write_text("hello")
    _script(
        sub,
        "beside.py",
        """
        import os

        import tensorflow as tf

        import nddebug

        os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(os.sep))))  # elsewhere
        assert os.path.isabs(__file__), __file__
        print("DATA", open(os.path.join(os.path.dirname(__file__), "data.txt")).read())
        with nddebug.trace():
            tf.constant(1.0) * 2.0
        """,
    )
    result = _nddebug("run", "-n", "2", "--show-output", "sub/beside.py", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DATA hello" in result.stderr


def test_runs_of_a_rerun_block_are_each_compared_with_their_reexecutions(tmp_path) -> None:
    """`nddebug run` of a script whose block is trace(rerun=1) ran every run, then ended with
    "a rerun report reads exactly one recording" (exit 2), and without -o the runs were lost
    (probe round 48, F9). Each run is now reported with its own re-executions."""
    script = _script(
        tmp_path,
        "reruns.py",
        """
        import tensorflow as tf

        import nddebug

        w = tf.Variable(tf.ones([4, 4]))

        @tf.function
        def step(x):
            w.assign_sub(0.01 * tf.reduce_sum(x @ w) * tf.ones_like(w))

        with nddebug.trace(rerun=1):
            step(tf.ones([2, 4]))
        """,
    )
    result = _nddebug("run", "-n", "2", script)
    assert result.returncode != 2, result.stderr[-3000:]
    out = result.stdout
    assert "=== run 1: its re-executions ===" in out and "=== run 2: its re-executions" in out
    assert "each run is compared with its own re-executions" in out
