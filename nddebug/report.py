"""The culprit report: the analysis of a set of recordings, ready to present.

A Report holds its recordings, so it can be saved, loaded and rendered again; the renderers
in :mod:`nddebug.render` only present what is here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nddebug import environment, knowledge, quantify
from nddebug.analysis import (
    Comparison,
    compare_recordings,
    expand_reruns,
    not_rerun,
    unit_values,
)
from nddebug.errors import NotComparableError
from nddebug.recording import Recording

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pandas as pd

    from nddebug.verify import Raised

COLUMNS = [
    "op_type",
    "op_name",
    "role",
    "kind",
    "device",
    "location",
    "runs_differing",
    "distinct_outputs",
    "max_abs_diff",
    "max_ulp",
    "frac_differing",
    "known_cause",
    "fix",
    "graph",
    "executions",
    "divergent_executions",
    "explanation",
    "key",
]

MODES = {
    "repeat": (
        "repeated the whole step in this process with identical inputs and restored state: sees "
        "non-deterministic kernels, unseeded or stateful random ops, input-pipeline order and "
        "races between ops; not per-process effects (autotuning, PYTHONHASHSEED), which need "
        "recordings from separate processes compared with nddebug.compare()"
    ),
    "compare": "compared recordings made separately (e.g. in different processes or machines)",
    "processes": (
        "ran the script in fresh processes: sees everything repeats in one process see, plus "
        "per-process effects (autotuning, hash randomisation, thread scheduling)"
    ),
    "diff": "compared two recordings, e.g. from two environments",
    "rerun": (
        "re-executed every stateless op on its own input tensors within one step: an op whose "
        "re-executions differ is a source by construction (a non-deterministic kernel). It "
        "cannot see stateful ops (random ops, variable updates, iterators, I/O), races between "
        "ops, input-pipeline order or per-process effects (autotuning, PYTHONHASHSEED): "
        "repeated steps (nddebug.check) and fresh processes (nddebug run) see those"
    ),
}


class Report:
    """Which ops made the runs differ, why, and what to do about it."""

    def __init__(
        self,
        recordings: list[Recording],
        mode: str = "compare",
        captures: list[Recording] | None = None,
        errors: list[Raised] | None = None,
    ) -> None:
        self.recordings = recordings
        self.captures = captures or []
        self.mode = mode
        #: Ops that raised instead of running (no deterministic kernel here): never "ok".
        self.errors = errors or []
        runs, capture_runs = recordings, self.captures
        if self.errors and len(runs) < 2:
            self.comparison = Comparison(0, 0, 0, [], [], [], [])
            return
        if mode == "rerun":
            if len(recordings) != 1 or recordings[0].kind != "rerun":
                raise NotComparableError(
                    "a rerun report reads exactly one recording made with trace(rerun=k) "
                    f"(got {len(recordings)}, of kinds {sorted({r.kind for r in recordings})}); "
                    "compare rerun recordings one at a time"
                )
            runs = expand_reruns(recordings[0])
            if len(runs) < 2:
                raise NotComparableError(
                    "the rerun recording holds no re-executed op: were all its ops stateful, or "
                    "its graphs traced before trace(rerun=k)?"
                )
            # Eager re-executions keep the values of divergent outputs as they go.
            own = [recordings[0]] if recordings[0].values else []
            capture_runs = [r for c in self.captures or own for r in expand_reruns(c)]
        self.comparison: Comparison = compare_recordings(runs)
        if len(capture_runs) >= 2:
            _attach_magnitudes(self.comparison, capture_runs)

    @property
    def ok(self) -> bool:
        """True when every run computed bitwise-identical outputs for every traced op."""
        return not (self.comparison.findings or self.comparison.paths or self.errors)

    @property
    def sources(self) -> pd.DataFrame:
        df = self.culprits
        return df[df["role"] == "source"].reset_index(drop=True)

    @property
    def culprits(self) -> pd.DataFrame:
        """One row per divergent op: sources first, in execution order, then the rest."""
        import pandas as pd

        rows = [_row(f) for f in self.comparison.findings]
        return pd.DataFrame(rows, columns=COLUMNS)

    @property
    def summary(self) -> dict[str, Any]:
        c = self.comparison
        env = self.recordings[0].environment if self.recordings else environment.capture()
        return {
            "verdict": "NOT checked"
            if self.errors and not c.runs
            else ("reproducible" if self.ok else "NOT reproducible"),
            "mode": self.mode,
            "runs": c.runs,
            "ops_traced": c.ops_traced,
            "op_executions_per_run": c.executions,
            "sources": sum(f.role == "source" for f in c.findings),
            "propagated": sum(f.role == "propagated" for f in c.findings),
            "control_flow": sum(f.role == "control flow" for f in c.findings),
            "paths_part": len(c.paths),
            "tensorflow": env.get("tensorflow", "?"),
            "devices": ", ".join(env.get("devices", [])),
            "op_determinism": env.get("op_determinism"),
        }

    @property
    def mode_note(self) -> str:
        note = MODES.get(self.mode, "")
        if self.mode == "rerun" and self.recordings:
            missed = not_rerun(self.recordings[0])
            if missed:
                note += ". Not re-executed here: " + "; ".join(
                    f"{', '.join(types)} ({reason})" for reason, types in missed.items()
                )
        return note

    @property
    def not_covered(self) -> dict[str, list[str]]:
        """In rerun mode, the op types that were not re-executed, by reason."""
        return not_rerun(self.recordings[0]) if self.mode == "rerun" and self.recordings else {}

    @property
    def warnings(self) -> list[str]:
        return self.comparison.warnings

    def verify(
        self, script: str | None = None, args: Sequence[str] = (), runs: int = 3, **env: str
    ) -> pd.DataFrame:
        """Re-run the step with each source's fix applied, in fresh processes (the fixes are
        process-wide): per source "fixed", "still divergent", "raises here" or "not
        verified" (see :func:`nddebug.verify.verify`; a check() step needs ``script``)."""
        from nddebug.verify import verify

        return verify(self, script=script, args=args, runs=runs, env=env)

    def save(self, path: str) -> None:
        """Write every recording (and capture run) to one file; nddebug.load() reads it back."""
        from nddebug import storage

        storage.save(self.recordings + self.captures, path)

    def __str__(self) -> str:
        from nddebug.render import text

        return text.render(self)

    def __repr__(self) -> str:
        s = self.summary
        return f"<nddebug.Report {s['verdict']}: {s['sources']} source(s), {s['runs']} runs>"

    def _repr_html_(self) -> str:
        from nddebug.render import html

        return html.render(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": str(self), "text/html": self._repr_html_()}


def _row(f: Any) -> dict[str, Any]:
    op = f.op
    c: knowledge.Culprit | None = f.culprit
    if f.role == "propagated":
        known = c.mechanism if c else ""
        fix = "Fix the source op(s) above; this op only carries their difference."
    elif f.entered:
        known = "not in the known list"
        fix = (
            "Find the Python-side value that differs before this op: fix PYTHONHASHSEED (e.g. "
            "nddebug run --hashseed 0), seed Python's random and NumPy, sort sets and dict keys "
            "before turning them into tensors, and list files in sorted order."
        )
    elif op.function == "uninstrumented" or op.op_type == "VariableState":
        known = "not in the known list"
        fix = (
            "Let nddebug see inside: create or first call the tf.function inside "
            "nddebug.trace(), or pass it (or the Keras model as state=) to nddebug.check(), "
            "and switch off jit_compile while debugging."
        )
    elif c is not None:
        known = f"{c.api}: {c.mechanism}"
        fix = c.fix
    else:
        known = "not in the known list"
        fix = knowledge.advice(f.kind)
    return {
        "op_type": op.op_type,
        "op_name": op.op_name or "(eager)",
        "role": f.role,
        "kind": f.kind,
        "device": op.device,
        "location": op.location,
        "runs_differing": f.runs_differing,
        "distinct_outputs": f.distinct_outputs,
        "max_abs_diff": f.max_abs_diff,
        "max_ulp": f.max_ulp,
        "frac_differing": f.frac_differing,
        "known_cause": known,
        "fix": fix,
        "graph": op.graph,
        "executions": f.executions,
        "divergent_executions": f.divergent_executions,
        "explanation": f.explanation,
        "key": f.key,
    }


def _attach_magnitudes(comparison: Comparison, captures: list[Recording]) -> None:
    """Fill max_abs_diff / max_ulp / frac_differing from the full values captured in a
    second pass (values are captured only for the ops found divergent)."""
    values = unit_values(captures)
    for f in comparison.findings:
        worst: quantify.Divergence | None = None
        for (unit_key, _slot), arrays in values.items():
            if unit_key[1] != f.key or len(arrays) < 2:
                continue
            d = quantify.measure(arrays)
            if d is None:
                continue
            if worst is None:
                worst = d
            else:
                worst = quantify.Divergence(
                    max(worst.max_abs_diff, d.max_abs_diff),
                    max(worst.max_ulp, d.max_ulp),
                    max(worst.frac_differing, d.frac_differing),
                )
        if worst is not None and worst.frac_differing > 0:
            # Measured on the capture runs; if the divergence did not recur there, unknown.
            f.max_abs_diff, f.max_ulp, f.frac_differing = (
                worst.max_abs_diff,
                worst.max_ulp,
                worst.frac_differing,
            )
