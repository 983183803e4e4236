"""Shared helpers for the test suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, env: dict[str, str] | None = None, timeout: int = 600) -> dict:
    """Run code in a fresh interpreter (process-wide TF switches need one) and return the JSON
    object it prints on its last line."""
    full_env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
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


def variables_bytes(variables: list) -> list[bytes]:
    return [v.numpy().tobytes() for v in variables]
