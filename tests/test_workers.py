"""`nddebug run --workers N`: a MultiWorkerMirroredStrategy job of N processes on this machine,
compared run against run per worker and worker against worker (real TF, gRPC on localhost)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import nddebug
from nddebug.replicas import worker_consistency
from tests.helpers import ROOT, subprocess_env

SCRIPT = f"{ROOT}/tests/scripts/workers_step.py"


def _run(*options: str, plant: str = "", timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "nddebug", "run", "--workers", "2", *options, SCRIPT]
    return subprocess.run(
        cmd,
        env=subprocess_env({"PLANT": plant}),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def deterministic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list]:
    path = str(tmp_path_factory.mktemp("workers") / "ok.nddebug")
    return _run("-n", "2", "-o", path), nddebug.load(path)


def test_a_deterministic_job_is_reproducible_on_every_worker_and_consistent(deterministic) -> None:
    proc, recs = deterministic
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    out = proc.stdout
    for k in (0, 1):
        assert f"=== worker {k}: its 2 runs compared ===" in out
    assert out.count("reproducible — 2 runs") == 2 and "NOT reproducible" not in out
    assert out.count("2 workers, 1 variable updates compared: consistent") == 2
    # Every worker's recording is in the one file, and says which worker made it.
    assert sorted(r.label for r in recs) == [
        "process 0 worker 0", "process 0 worker 1", "process 1 worker 0", "process 1 worker 1"
    ]  # fmt: skip
    for r in recs:
        assert r.environment["cluster_task"] == {"type": "worker", "index": int(r.label[-1])}
        ops = {op.op_type for op in r.ops.values()}
        assert "CollectiveReduceV2" in ops and "AssignSubVariableOp" in ops


def test_worker_consistency_of_the_recorded_workers(deterministic) -> None:
    _, recs = deterministic
    run0 = sorted((r for r in recs if r.label.startswith("process 0")), key=lambda r: r.label)
    result = worker_consistency(run0)
    assert result.consistent and result.replicas == 2 and result.updates_compared == 1
    with pytest.raises(nddebug.NotComparableError):
        worker_consistency(run0[:1])


def test_a_per_worker_difference_is_named() -> None:
    """Worker k scales its update by 1 + 1e-3 k: each worker is reproducible, the workers are
    not consistent, and the op where they part is the update's multiply."""
    proc = _run("-n", "2", plant="worker")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    out = proc.stdout
    assert out.count("reproducible — 2 runs") == 2  # each worker agrees with itself
    assert out.count("2 workers, 1 variable updates compared: INCONSISTENT") == 2
    assert "workers part at Mul mul_1" in out
    assert "depends on the worker (task index, device)" in out


def test_a_worker_that_dies_stops_the_job_and_keeps_the_recordings(tmp_path) -> None:
    path = str(tmp_path / "partial.nddebug")
    proc = _run("-n", "2", "-o", path, "--timeout", "120", plant="crash")
    assert proc.returncode == 2
    err = proc.stderr
    assert "run 2, worker 1 failed (exit 3) (the other workers were stopped)" in err, err[-3000:]
    assert "The 2 recording(s) made before it are saved in" in err
    assert sorted(r.label for r in nddebug.load(path)) == [
        "process 0 worker 0",
        "process 0 worker 1",
    ]


def test_a_worker_that_hangs_times_out() -> None:
    proc = _run("-n", "2", "--timeout", "10", plant="hang")
    assert proc.returncode == 2
    assert "run 1, worker 0 timed out after 10 s: worker(s) 0, 1 still running, all stopped" in (
        proc.stderr
    )


def test_bad_worker_options_are_usage_errors() -> None:
    proc = _run("-n", "2", "--workers", "0")
    assert proc.returncode == 2 and "--workers must be at least 1" in proc.stderr
    proc = _run("-n", "2", "--timeout", "-1")
    assert proc.returncode == 2 and "--timeout must be a positive number" in proc.stderr
