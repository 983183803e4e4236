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
    "hash seed": {"PYTHONHASHSEED": "0"},
    "seeds and hash seed": {"NDDEBUG_SEED": "0", "PYTHONHASHSEED": "0"},
}
#: Fixes that only fresh processes can apply: a process's hash seed is fixed when it starts.
PER_PROCESS = frozenset({"hash seed", "seeds and hash seed"})
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
    """Which fix a source's advice names: "op determinism", "seeds", "hash seed" (the same
    PYTHONHASHSEED in every process), "seeds and hash seed", or "" (none to apply). Advice
    to fix the hash seed was verified with seeds alone, which cannot change a set's order:
    "still divergent" beside advice that works (probe round 47, F9)."""
    fix = str(row.get("fix", ""))
    low = fix.lower()
    hashed = "pythonhashseed" in low or "--hashseed" in low
    rest = low.replace("pythonhashseed", "").replace("--hashseed", "")
    seeds = str(row.get("kind", "")) == "random" or ("seed" in rest and "determinism" not in fix)
    if seeds or hashed:
        return "seeds and hash seed" if seeds and hashed else "seeds" if seeds else "hash seed"
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
            proc = subprocess.run(
                cmd,
                env=full,
                stdin=subprocess.DEVNULL,  # a prompt nobody sees would wait (cli._one_run)
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            if proc.returncode != 0:
                return per_run, proc.stderr
            if not os.path.exists(path):
                return per_run, f"{script} ran no nddebug.trace() block"
            per_run.append(load(path))
    return per_run, ""


@dataclasses.dataclass
class Replay:
    """How check() ran a step, so that its report can re-run it in-process with a fix."""

    fn: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    state: Any
    repeats: int
    emulate_gpu: bool


#: Why seeding in this process cannot verify a pipeline's fix: see _in_process.
SEEDS_AFTER_THE_DATASET = (
    "still differed with seeds set before each run of an in-process check, which reach a "
    "dataset only where the step builds it; one built before the check took its seeds when it "
    "was made, as it will in your program after the fix (tf.random.set_seed before building "
    "it): verify with a script instead (report.verify(script=...), nddebug run --verify)"
)


def _in_process(replay: Replay, fix: str, op_types: list[str]) -> list[tuple[str, str, str, str]]:
    """Re-check the step in this process with ``fix`` switched on at run time (the checked
    function is retraced under it), then switch it back. State is left as it was."""
    from tensorflow.python.framework import config

    from nddebug.check import check

    was = config.is_op_determinism_enabled()
    how = {"op determinism": "op determinism on, step retraced", "seeds": "seeds set (0)"}
    try:
        if fix == "op determinism" and not was:
            config.enable_op_determinism()
        report = check(
            replay.fn,
            *replay.args,
            repeats=max(3, replay.repeats),
            state=replay.state,
            seed=0 if fix == "seeds" else None,
            advance=False,
            quantify=False,
            confirm=0,
            emulate_gpu=replay.emulate_gpu,
            **replay.kwargs,
        )
    finally:
        if fix == "op determinism" and not was:
            config.disable_op_determinism()
    diverged = set(report.culprits["op_type"]) if report.recordings else set()
    risky = set(report.risks["op_type"]) if report.recordings else set()
    raised = {e.op_type: e.message for e in report.errors}
    rows = []
    for t in op_types:
        if t in raised:
            rows.append((t, fix, "raises here", raised[t]))
        elif t in diverged and fix == "seeds" and t.startswith("IteratorGetNext"):
            # Seeds set before each run reach a dataset only where the step builds it: one
            # built before the check took its seeds when it was made (probe round 36).
            rows.append((t, fix, "not verified", SEEDS_AFTER_THE_DATASET))
        elif t in diverged:
            rows.append((t, fix, "still divergent", f"in-process check, {how[fix]}"))
        elif t in risky:
            rows.append((t, fix, "still divergent", f"known non-deterministic with {how[fix]}"))
        elif not report.ok:
            # Nothing diverged, but the re-check did not compare everything (a function
            # traced before the seed was set: check() checked a seeded copy): "fixed" was
            # said of what it could not see (probe round 41, F3).
            rows.append(
                (t, fix, "not verified", _not_shown(report, f"in-process check ({how[fix]})"))
            )
        else:
            rows.append((t, fix, "fixed", f"in-process check ({how[fix]}), {report.verdict}"))
    return rows


def _not_shown(report: Report, how: str) -> str:
    """Why a re-check (``how`` it was made) in which nothing diverged does not show a fix
    works."""
    unseen = "; ".join(report.not_compared) or "; ".join(report.verdict_notes)
    return f"{how}: {report.verdict}" + (f": {unseen}" if unseen else "")


def verify(
    report: Report,
    script: str | None = None,
    args: Sequence[str] = (),
    runs: int = 3,
    env: dict[str, str] | None = None,
) -> pd.DataFrame:
    """One row per source (and per known culprit that ran, ``report.risks``) of ``report``:
    the fix applied and its verdict (see VERDICTS).

    With ``script`` the step is re-run as that script in ``runs`` fresh processes with the
    fix's environment (FIX_ENV) on top of ``env``. Without one, a report from check() re-runs
    its step in this process: the fix is switched on at run time (op determinism; seeds),
    the step retraced and checked again, and the setting switched back. Otherwise every
    source is "not verified", and the row says why and which command can verify it.
    """
    import pandas as pd

    from nddebug.check import compare

    rows = []
    groups: dict[str, list[str]] = {}
    for _, row in report.sources.iterrows():
        groups.setdefault(fix_for(row), []).append(str(row["op_type"]))
    if report.recordings:
        for _, row in report.risks.iterrows():
            t = str(row["op_type"])
            fix = fix_for(row)
            if t not in groups.get(fix, []):
                groups.setdefault(fix, []).append(t)
    for raised in getattr(report, "errors", []):
        rows.append((raised.op_type, "op determinism", "raises here", raised.message))
    replay = getattr(report, "replay", None)
    for fix, op_types in groups.items():
        if fix and script is None and replay is not None and fix not in PER_PROCESS:
            rows += _in_process(replay, fix, op_types)
            continue
        if not fix or script is None:
            why = (
                "the advice names no fix to apply automatically"
                if not fix
                else "a process's hash seed is fixed when it starts, so this fix needs fresh "
                "processes: verify with a script (`nddebug run --verify SCRIPT`, or "
                "report.verify(script=...))"
                if fix in PER_PROCESS
                else "no step to re-run: this report was not made by check(); pass "
                "script= (or run `nddebug run --verify SCRIPT`) to re-run it in fresh processes"
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
        unsure: Report | None = None  # the first block whose re-runs were not all compared
        for b in range(min(len(r) for r in per_run)):
            again = compare([r[b] for r in per_run])
            still |= set(again.culprits["op_type"])
            if not again.ok and unsure is None:
                unsure = again
        how = f"{runs} fresh runs with {_env_text(FIX_ENV[fix])}"
        for t in op_types:
            if t in still:
                rows.append((t, fix, "still divergent", how))
            elif unsure is not None:
                rows.append((t, fix, "not verified", _not_shown(unsure, how)))
            else:
                rows.append((t, fix, "fixed", how))
    return pd.DataFrame(rows, columns=["op_type", "fix", "verdict", "detail"])


def _env_text(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items())
