"""The nddebug command line, run as a user would: fresh processes, exit codes, reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.helpers import CPU_ONLY, ROOT, subprocess_env

SCRIPTS = os.path.join(ROOT, "tests", "scripts")


def nddebug(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = subprocess_env()
    full_env.pop("PYTHONHASHSEED", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "nddebug", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=ROOT,
        timeout=900,
    )


def test_hash_randomisation_reaches_the_first_tf_op_and_a_fixed_seed_fixes_it() -> None:
    script = os.path.join(SCRIPTS, "hash_order.py")
    varied = nddebug("run", "-n", "3", "--hashseed", "random", "--format", "json", script)
    assert varied.returncode == 1, varied.stderr
    report = json.loads(varied.stdout)
    (source,) = [c for c in report["culprits"] if c["role"] == "source"]
    assert source["op_type"] == "Mul" and "hash_order.py" in source["location"]
    assert "PYTHONHASHSEED" in source["explanation"] and "--hashseed" in source["fix"]
    # Processes keep digests only: the magnitudes are there, and unknown.
    assert source["rel_diff"] is None and source["scale"] is None
    fixed = nddebug("run", "-n", "2", "--hashseed", "0", script)  # two suffice: equal or not
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "reproducible" in fixed.stdout and "NOT" not in fixed.stdout


def test_run_finds_the_crop_culprit_across_processes() -> None:
    # A CPU fact (the CPU kernel's race): on a GPU the box gradient diverges too.
    result = nddebug("run", "-n", "3", os.path.join(SCRIPTS, "crop_step.py"), env=CPU_ONLY)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "NOT reproducible" in result.stdout
    assert "Source: CropAndResizeGradImage" in result.stdout
    assert "run 3/3" in result.stderr  # progress


def test_run_on_the_cnn_script_exits_zero(tmp_path) -> None:
    out = str(tmp_path / "cnn.nddebug")
    # A CPU fact: on a GPU the CNN's BiasAddGrad and Conv2DBackpropFilter diverge.
    result = nddebug(
        "run", "-n", "2", "-o", out, os.path.join(SCRIPTS, "cnn_step.py"), env=CPU_ONLY
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The saved runs re-render the same verdict, in every format.
    for fmt in ("text", "html", "csv", "json"):
        again = nddebug("report", out, "--format", fmt)
        assert again.returncode == 0, again.stderr
    assert "<table" not in nddebug("report", out, "--format", "html").stdout  # nothing to list
    assert json.loads(nddebug("report", out, "--format", "json").stdout)["summary"]["runs"] == 2


def test_diff_names_the_op_whose_kernel_changed_under_op_determinism(tmp_path) -> None:
    paths = {}
    for name, env in (("plain", {}), ("deterministic", {"TF_DETERMINISTIC_OPS": "1"})):
        paths[name] = str(tmp_path / f"{name}.nddebug")
        proc = subprocess.run(
            # 8 steps: one recording must show the race, even on a loaded machine.
            [sys.executable, "-m", "nddebug.runner", os.path.join(SCRIPTS, "crop_step.py"), "8"],
            # CPU only: on a GPU the crop's gradient raises under op determinism.
            env=subprocess_env({"NDDEBUG_RECORD": paths[name], **CPU_ONLY, **env}),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    result = nddebug("diff", paths["plain"], paths["deterministic"])
    assert result.returncode == 1, result.stdout + result.stderr
    env_part, _, rest = result.stdout.partition("The computations first part at ")
    assert "op_determinism: False  ->  True" in env_part
    assert rest.startswith("CropAndResizeGradImage")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "-n", "1", "x.py"), "at least 2"),
        (("run", "no_such_script.py"), "no such script"),
        (("report", "missing.nddebug"), "no such recording file"),
        (("report", "tests"), "tests is a folder: name a recording file in it"),
        (("run", "--hashseed", "abc", os.path.join(SCRIPTS, "hash_order.py")), "--hashseed"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_two(args, message) -> None:
    result = nddebug(*args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["ops", "report", "run", "run --show-output"])
def test_a_reader_that_stops_reading_leaves_the_exit_code_to_the_verdict(
    command: str, tmp_path
) -> None:
    """`nddebug report runs.nddebug | head -3` (a reader that closes the pipe): the rest of the
    output is dropped, not an error; it exited 2 with "nddebug: error: [Errno 32] Broken pipe",
    which CI reads as bad input instead of "not reproducible" (exit 1)."""
    import tensorflow as tf

    import nddebug as nd
    from nddebug.storage import save

    args, expected = ["ops"], 0
    if command == "report":

        @tf.function
        def step():
            return tf.reduce_sum(tf.random.uniform([64]))  # unseeded: differs in every run

        recs = []
        for _ in range(2):
            with nd.trace() as rec:
                step()
            recs.append(rec)
        path = str(tmp_path / "runs.nddebug")
        save(recs, path)
        args, expected = ["report", path], 1
    if command.startswith("run"):
        # `nddebug run ... 2>&1 | head -1`: the progress lines meet the closed pipe too.
        script = tmp_path / "same.py"
        script.write_text(
            "import sys\nimport tensorflow as tf\nimport nddebug\nwith nddebug.trace():\n"
            "    tf.reduce_sum(tf.ones([4]) * 2.0)\n"
            "for i in range(200):\n    print('chatty', i, file=sys.stderr, flush=True)\n"
        )
        args, expected = ["run", "-n", "2", *command.split()[1:], str(script)], 0
    env = subprocess_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nddebug", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    if command == "run --show-output":
        # The runs' output, copied to standard error, meets the closed pipe; the verdict on
        # standard output stays (it exited 2 with nothing on standard output). As `| head
        # -2`: the first lines were read, so the progress line went through.
        proc.stderr.readline(), proc.stderr.readline()
        proc.stderr.close()
        out = proc.stdout.read().decode()
        assert proc.wait(timeout=300) == expected and "reproducible — 2 runs" in out, out
        return
    proc.stdout.close()  # the reader is gone before the first line is written
    if command == "run":
        proc.stderr.close()
        assert proc.wait(timeout=300) == expected
        return
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == expected, err
    assert "error" not in err and "Broken pipe" not in err, err


def test_ops_searches_the_knowledge_base() -> None:
    result = nddebug("ops", "BiasAddGrad")
    assert result.returncode == 0 and "BiasAddGrad" in result.stdout and "GPU" in result.stdout


def test_emulate_gpu_flag_rehearses_the_gpu_in_every_process() -> None:
    script = os.path.join(SCRIPTS, "segment_step.py")
    # The rehearsal runs on the CPU, as on a machine without a GPU.
    out = nddebug("run", "-n", "2", "--emulate-gpu", "--format", "json", script, env=CPU_ONLY)
    assert out.returncode == 1, out.stdout + out.stderr
    report = json.loads(out.stdout)
    sources = [c for c in report["culprits"] if c["role"] == "source"]
    assert [c["op_type"] for c in sources] == ["UnsortedSegmentSum"], report
    assert "deterministic" in sources[0]["fix"].lower()


def test_diff_of_files_with_several_blocks_compares_every_block(tmp_path, capsys) -> None:
    """`nddebug run -o` files hold each run's blocks: diff compared block 1 alone and said
    "The computations agree bit for bit" while block 2 differed (probe round 46, F5)."""
    import tensorflow as tf

    import nddebug
    from nddebug.cli import main

    paths = []
    for name, scale in (("a", 2.0), ("b", 3.0)):
        path = str(tmp_path / f"{name}.nddebug")
        factor = tf.constant(scale)
        for block, value in ((1, tf.constant(2.0)), (2, factor)):  # block 2 differs
            with nddebug.trace(label=f"process 0 block {block}", path=path):
                tf.reduce_sum(tf.ones([4]) * value)
        paths.append(path)
    code = main(["diff", *paths])
    out = capsys.readouterr().out
    assert code == 1, out
    first, _, second = out.partition("=== trace block 2 of 2 ===")
    assert "=== trace block 1 of 2 ===" in first and "agree bit for bit" in first, out
    assert "The computations first part at Mul" in second, out
    assert "pid:" not in out  # each process has its own: no environment difference


def _labelled_blocks(path: str, process: int, labels: list[str], values: dict[str, Any]) -> None:
    """One `nddebug run` process's trace blocks, saved as `run -o` labels them."""
    import tensorflow as tf

    import nddebug

    for b, own in enumerate(labels):
        with nddebug.trace(label=f"process {process} block {b + 1}: {own}", path=path):
            tf.reduce_sum(tf.ones([4]) * values[own]())


def test_report_matches_blocks_by_label_when_appended_sessions_took_other_paths(
    tmp_path, capsys
) -> None:
    """A file two `run -o` sessions appended to, the second without the evaluation block:
    its "eval" block was compared with the other session's second "train" block, "NOT
    reproducible" for a deterministic script (probe round 46, F8). Blocks are matched by
    label, the headers say which, and the different paths are said (exit 1)."""
    import tensorflow as tf

    from nddebug.cli import main

    path = str(tmp_path / "mix.nddebug")
    same = {"train": lambda: tf.constant(2.0), "eval": lambda: tf.range(4.0)}
    for process in (0, 1):
        _labelled_blocks(path, process, ["train", "eval", "train"], same)
    for process in (0, 1):
        _labelled_blocks(path, process, ["train", "train"], same)
    code = main(["report", path])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "NOT reproducible" not in out and "share no op" not in out, out
    parts = out.split("=== trace block ")[1:]
    assert [p.split(" ===")[0] for p in parts] == ["1 of 3: train", "2 of 3: eval", "3 of 3: train"]
    assert [p.count("reproducible — 4 runs") for p in parts] == [1, 0, 1], out
    assert "reproducible — 2 runs" in parts[1], out
    assert "recorded in run(s) 1, 2 only, of 4" in parts[1], out


def test_report_of_several_blocks_is_one_json_or_csv_document(tmp_path, capsys) -> None:
    """``--format json`` and ``csv`` of a file with several blocks printed one document per
    block with text lines between them, which no parser reads (probe round 46, F9)."""
    import pandas as pd
    import tensorflow as tf

    from nddebug.cli import main

    path = str(tmp_path / "two.nddebug")
    values = {
        "train": lambda: tf.constant(2.0),
        "noisy": lambda: tf.random.uniform([4]),  # unseeded: a source in every run
    }
    for process in (0, 1):
        _labelled_blocks(path, process, ["train", "noisy"], values)
    assert main(["report", path, "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [(b["block"], b["label"]) for b in doc["blocks"]] == [(1, "train"), (2, "noisy")]
    assert doc["blocks"][0]["summary"]["verdict"] == "reproducible"
    noisy = doc["blocks"][1]
    assert noisy["summary"]["verdict"] != "reproducible"
    assert "RandomUniform" in {c["op_type"] for c in noisy["culprits"] if c["role"] == "source"}

    csv = tmp_path / "two.csv"
    assert main(["report", path, "--format", "csv", "-o", str(csv)]) == 1
    table = pd.read_csv(csv)
    assert list(table.columns[:3]) == ["block", "label", "worker"]
    assert set(table["block"]) == {2} and set(table["label"]) == {"noisy"}
    assert "RandomUniform" in set(table["op_type"])


def test_report_of_an_xla_checks_file_compares_each_program_apart(tmp_path, capsys) -> None:
    """check(path=) of an XLA step appends the runs of the step as compiled and then with XLA
    off, under the same labels: `report` compared them as one set, said "0 source op(s)" and
    called the real source "control flow" (probe round 47, F7)."""
    import numpy as np
    import tensorflow as tf

    import nddebug
    from nddebug.cli import main

    w = tf.Variable(tf.ones([4, 3]))
    x = tf.constant(np.arange(24, dtype=np.float32).reshape(6, 4) / 10)

    @tf.function(jit_compile=True)
    def step(x):
        h = tf.reduce_sum(x @ w) * tf.random.uniform([])
        w.assign_sub(0.01 * w * h)
        return h

    step(x)
    path = str(tmp_path / "xla.nddebug")
    live = nddebug.check(step, x, state=[w], repeats=3, path=path, quantify=False)
    assert live.program == "XLA off", live
    labels = [r.label for r in nddebug.load(path)]
    assert any(label.startswith("as compiled: ") for label in labels), labels
    assert main(["report", path]) == 1
    out = capsys.readouterr().out
    compiled, _, off = out.partition("=== the step with XLA off (to name the op) ===")
    assert "=== the step as compiled (XLA on) ===" in compiled and off, out
    assert "control flow" not in out, out
    assert "Source: RandomUniform" in " ".join(off.split()), off


def test_a_file_that_several_checks_appended_to_is_reported_check_by_check(
    tmp_path, capsys
) -> None:
    """check(path=P) every few steps of a training loop appends each check's runs to one file:
    they start from other weights by design, and `report` compared them as one set, "NOT
    reproducible", state carried over, where every check had said reproducible (probe round
    48, F3). Each check is now compared apart; a difference in one of them is named there."""
    import numpy as np
    import tensorflow as tf

    import nddebug
    from nddebug.cli import main

    w = tf.Variable(tf.ones([4, 4]))
    x = tf.constant(np.random.RandomState(0).rand(8, 4).astype("float32"))
    noisy = tf.Variable(0.0)

    @tf.function
    def step(x):
        draw = tf.cond(noisy > 0, lambda: tf.random.uniform([]), lambda: tf.constant(0.0))
        loss = tf.reduce_sum(tf.tanh(x @ w)) + draw
        w.assign_sub(0.01 * tf.ones_like(w) * loss)
        return loss

    path = str(tmp_path / "checks.nddebug")
    verdicts = []
    for k in range(5):
        if k == 3:
            noisy.assign(1.0)  # the third check's step draws an unseeded number
        if k in (1, 2, 4):
            live = nddebug.check(step, x, state=[w], repeats=2, path=path, quantify=False)
            verdicts.append(live.ok)
        else:
            step(x)
    assert verdicts == [True, True, False]
    assert main(["report", path]) == 1
    out = capsys.readouterr().out
    first, second, third = out.split("=== check ")[1:]
    assert first.startswith("1 of 3 ===") and "NOT" not in first, out
    assert second.startswith("2 of 3 ===") and "NOT" not in second, out
    assert third.startswith("3 of 3 ===") and "NOT reproducible" in third, out
    assert "Source: RandomUniform" in " ".join(third.split()), third
    assert main(["report", path, "--format", "json"]) == 1
    blocks = json.loads(capsys.readouterr().out)["blocks"]
    assert [b["label"] for b in blocks] == ["check 1 of 3", "check 2 of 3", "check 3 of 3"]
