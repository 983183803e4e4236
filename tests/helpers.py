"""Shared helpers for the test suite."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# For a child process that asserts what the CPU does: it sees no GPU at all.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": "-1"}


def subprocess_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child interpreter: this checkout first on PYTHONPATH, with the
    caller's PYTHONPATH kept after it (TensorFlow may be reachable only through it)."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
    """Build and run a step on the CPU where a GPU is visible too, for tests of CPU facts.

    A tf.function called in this scope places every op that names no device on the CPU (TF
    instantiates a function with its call's device as the default), and variables created in
    it live there, so the ops that read and update them run there as well. Pair it with
    assert_ran_on_cpu: the recording says where each op ran."""
    import tensorflow as tf

    with tf.device("/CPU:0"):
        yield


def assert_ran_on_cpu(report: Any) -> None:
    """Every op the report's runs recorded ran on a CPU (a CPU fact was measured on a CPU)."""
    devices = {op.device for rec in report.recordings for op in rec.ops.values()}
    elsewhere = sorted(d for d in devices if "CPU" not in d.upper())
    assert not elsewhere, f"ops ran off the CPU: {elsewhere}"


def run_python(code: str, env: dict[str, str] | None = None, timeout: int = 600) -> dict:
    """Run code in a fresh interpreter (process-wide TF switches need one) and return the JSON
    object it prints on its last line."""
    full_env = subprocess_env(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def jacobian_through_a_loop() -> tuple[Any, Any]:
    """A tf.function returning tape.jacobian (pfor) of a two-step while loop, and its
    weight: pfor converts the loop's body with whatever nddebug added to it."""
    import numpy as np
    import tensorflow as tf

    w = tf.Variable(tf.random.stateless_normal([4, 4], seed=[1, 2]))
    x = tf.constant(np.random.RandomState(0).randn(3, 4).astype(np.float32))

    @tf.function
    def jacobian() -> Any:
        with tf.GradientTape() as tape:
            h = tf.while_loop(lambda i, h: i < 2, lambda i, h: (i + 1, tf.tanh(h @ w)), (0, x))[1]
        return tape.jacobian(h, w)

    return jacobian, w


def variables_bytes(variables: list) -> list[bytes]:
    return [v.numpy().tobytes() for v in variables]


def nddebug_run(
    folder: Any, script_text: str, *options: str, name: str = "train.py", timeout: int = 400
) -> subprocess.CompletedProcess:
    """``nddebug run -n 2 OPTIONS script`` on ``script_text``, saved as ``name`` in ``folder``
    and run there (the files it writes land there too)."""
    script = folder / name
    script.write_text(textwrap.dedent(script_text))
    return subprocess.run(
        [sys.executable, "-m", "nddebug", "run", "-n", "2", *options, str(script)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=folder,
        timeout=timeout,
    )
