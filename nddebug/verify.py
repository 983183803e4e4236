"""Advice that is checked: re-run a step with a source's recommended fix applied and say, per
source, whether the fix made it reproducible, left it divergent, or raises on this device.

Fixes such as op determinism are process-wide and cannot be undone, so the step is re-run in
fresh processes: that needs a script (``nddebug run`` has one; a ``check()`` report gets one
through ``report.verify(script=...)``). Also here: what a step that raised UnimplementedError
under op determinism (no deterministic kernel on this device) becomes in a report.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nddebug import knowledge

if TYPE_CHECKING:
    import pandas as pd

    from nddebug.report import Report

_NODE = re.compile(r"\{\{node ([^}]+)\}\}")
_FIRST_LINE = re.compile(r"^\s*(?:\S+Error: )?(.*)$")

#: The environment that applies a fix in a fresh process, by fix.
FIX_ENV = {
    "op determinism": {"TF_DETERMINISTIC_OPS": "1"},
    "seeds": {"NDDEBUG_SEED": "0"},
}
VERDICTS = ("fixed", "still divergent", "raises here", "not verified")


@dataclasses.dataclass
class Raised:
    """An op that raised instead of running: no deterministic kernel for it on this device."""

    op_type: str
    op_name: str
    message: str
    fix: str

    @property
    def summary(self) -> str:
        return (
            f"{self.op_type} ({self.op_name}) has no deterministic kernel here: under op "
            "determinism TensorFlow raises UnimplementedError for it, so op determinism "
            "cannot fix it on this device"
        )


def raised_from(error: BaseException | str, device: str | None = "GPU") -> Raised:
    """The op an UnimplementedError names (``{{node ...}}`` in its message, or its node_def),
    with the knowledge base's alternatives for it."""
    from nddebug.emulate import TF_MESSAGES

    text = str(getattr(error, "message", None) or error)
    node_def = getattr(error, "node_def", None)
    op_type = str(getattr(node_def, "op", "") or "")
    match = _NODE.search(text)
    op_name = match.group(1) if match else str(getattr(node_def, "name", "") or "?")
    if not op_type:
        op_type = next((t for t, m in TF_MESSAGES.items() if m in text), "")
    if not op_type:
        # Gradient ops keep their type as the last part of their name: .../CropAndResizeGradImage
        op_type = re.sub(r"_\d+$", "", op_name.rsplit("/", 1)[-1])
    culprit = knowledge.lookup(op_type, device)
    lines = [line.strip() for line in text.splitlines() if line.strip()] or [text]
    first = next((line for line in lines if "eterministic" in line), lines[0])
    return Raised(
        op_type=op_type,
        op_name=op_name,
        message=_FIRST_LINE.sub(r"\1", first),
        fix=culprit.fix if culprit is not None else "",
    )


def fix_for(row: Any) -> str:
    """Which fix a source's advice names: "op determinism", "seeds", or "" (none to apply)."""
    fix = str(row.get("fix", ""))
    if str(row.get("kind", "")) == "random" or ("seed" in fix.lower() and "determinism" not in fix):
        return "seeds"
    if "enable_op_determinism" in fix or "TF_DETERMINISTIC_OPS" in fix:
        return "op determinism"
    return ""


def run_script(
    script: str, args: Sequence[str], env: dict[str, str], runs: int, timeout: int = 600
) -> tuple[list[list[Any]], str]:
    """Run ``script`` ``runs`` times, each in a fresh process, recording its trace() blocks.
    Returns the recordings per run, or the error text of the first run that failed."""
    from nddebug.storage import load
    from nddebug.tracer import LABEL_ENV, RECORD_ENV

    per_run = []
    with tempfile.TemporaryDirectory(prefix="nddebug-verify-") as tmp:
        for i in range(runs):
            path = os.path.join(tmp, f"run{i}.nddebug")
            full = {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ, **env}
            full.update({RECORD_ENV: path, LABEL_ENV: f"process {i}"})
            cmd = [sys.executable, "-m", "nddebug.runner", script, *args]
            proc = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=timeout)
            if proc.returncode != 0:
                return per_run, proc.stderr
            if not os.path.exists(path):
                return per_run, f"{script} ran no nddebug.trace() block"
            per_run.append(load(path))
    return per_run, ""


def verify(
    report: Report,
    script: str | None = None,
    args: Sequence[str] = (),
    runs: int = 3,
    env: dict[str, str] | None = None,
) -> pd.DataFrame:
    """One row per source of ``report``: the fix applied and its verdict (see VERDICTS).

    The step is re-run as ``script`` in ``runs`` fresh processes with the fix's environment
    (FIX_ENV) on top of ``env`` (e.g. the one the report was made under). Without a script
    nothing can be re-run: every source is "not verified", and the row says why.
    """
    import pandas as pd

    from nddebug.check import compare

    rows = []
    groups: dict[str, list[str]] = {}
    for _, row in report.sources.iterrows():
        groups.setdefault(fix_for(row), []).append(str(row["op_type"]))
    for raised in getattr(report, "errors", []):
        rows.append((raised.op_type, "op determinism", "raises here", raised.message))
    for fix, op_types in groups.items():
        if not fix or script is None:
            why = (
                "the advice names no fix to apply automatically"
                if not fix
                else "no script: a check() step is a Python callable, and this fix is "
                "process-wide; pass script= to re-run it in fresh processes"
            )
            rows += [(t, fix, "not verified", why) for t in op_types]
            continue
        per_run, error = run_script(script, args, {**(env or {}), **FIX_ENV[fix]}, runs)
        if error:
            if "UnimplementedError" in error:
                raised = raised_from(error)
                rows += [(t, fix, "raises here", raised.message) for t in op_types]
            else:
                tail = " ".join(error.strip().splitlines()[-3:])
                rows += [(t, fix, "not verified", f"the script failed: {tail}") for t in op_types]
            continue
        still: set[str] = set()
        for b in range(min(len(r) for r in per_run)):
            again = compare([r[b] for r in per_run])
            still |= set(again.culprits["op_type"])
        for t in op_types:
            verdict = "still divergent" if t in still else "fixed"
            rows.append((t, fix, verdict, f"{runs} fresh runs with {_env_text(FIX_ENV[fix])}"))
    return pd.DataFrame(rows, columns=["op_type", "fix", "verdict", "detail"])


def _env_text(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items())
