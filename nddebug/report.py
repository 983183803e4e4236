"""The culprit report: the analysis of a set of recordings, ready to present.

A Report holds its recordings, so it can be saved, loaded and rendered again; the renderers
in :mod:`nddebug.render` only present what is here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from nddebug import environment, knowledge, quantify
from nddebug.analysis import (
    Comparison,
    OpFinding,
    compare_recordings,
    expand_reruns,
    not_compared,
    not_rerun,
    rerun_blind,
    unit_values,
)
from nddebug.errors import NotComparableError
from nddebug.recording import OPAQUE, TF1_LOOP, Recording, restored_function
from nddebug.risks import (
    Risk,
    describe_bound,
    known_risks,
    rule_out_bound,
    setup_notes,
    shared_hashseed,
)
from nddebug.timeline import FirstDivergence, Window, divergence_per_step, first_divergence

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
    "scale",
    "rel_diff",
    "frac_differing",
    "unmeasured",
    "known_cause",
    "evidence",
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
        "non-deterministic kernels, unseeded or stateful random ops, races between ops and the "
        "order of an input pipeline the step builds itself; not the pipeline that made its "
        "inputs (fit's, under DeterminismCheck: they are the same batch in every repeat) nor "
        "per-process effects (autotuning, PYTHONHASHSEED), which need separate processes: "
        "nddebug run, or recordings compared with nddebug.compare()"
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
        "ops, input-pipeline order, values an eager step makes in Python (NumPy's random "
        "state, the clock: each enters TensorFlow once) or per-process effects (autotuning, "
        "PYTHONHASHSEED): repeated steps (nddebug.check) and fresh processes (nddebug run) "
        "see those"
    ),
}


#: Kinds of sources that differ in runs repeated in one process by design, not between fresh
#: processes: the verdict says what they kept from being compared, not "NOT reproducible".
_BY_DESIGN = ("seeded stream", "seeded pass", "compiled stream")


class Report:
    """Which ops made the runs differ, why, and what to do about it."""

    def __init__(
        self,
        recordings: list[Recording],
        mode: str = "compare",
        captures: list[Recording] | None = None,
        errors: list[Raised] | None = None,
        window: Window | None = None,
    ) -> None:
        self.recordings = recordings
        #: Long runs (nddebug.longruns): the recordings are the first divergent call of each
        #: run, the rest was compared as arrays; where that call sits in the whole run.
        self.window = window
        self.captures = captures or []
        self.mode = mode
        #: Ops that raised instead of running (no deterministic kernel here): never "ok".
        self.errors = errors or []
        #: How check() ran the step (a nddebug.verify.Replay), so verify() can re-run it.
        self.replay: Any = None
        self._risk_rows: list[Risk] | None = None  # known_risks(), made on first use
        # check() on an XLA step: which program this report is of ("as compiled (XLA)" or
        # "XLA off"), and, for the XLA-off report, the report of the step as compiled.
        self.program = ""
        self.as_compiled: Report | None = None
        #: A rerun recording in which no op could be re-executed: nothing was compared.
        self._nothing_rerun = False
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
                # Nothing it ran could be re-executed (random ops, updates, iterators; outputs
                # it cannot read, as a TensorList's; graphs traced before the block): a report
                # that says so, not ok, rather than an error that lost what was recorded.
                warnings = sorted(set(recordings[0].warnings))  # what the run said, still
                self.comparison = Comparison(1, len(recordings[0].ops), 0, [], [], [], warnings)
                self._nothing_rerun = True
                return
            # Eager re-executions keep the values of divergent outputs as they go.
            own = [recordings[0]] if recordings[0].values else []
            capture_runs = [r for c in self.captures or own for r in expand_reruns(c)]
        self.comparison: Comparison = compare_recordings(runs, in_process=mode == "repeat")
        if len(capture_runs) >= 2:
            _attach_magnitudes(self.comparison, capture_runs)
        _sort_by_magnitude(self.comparison.findings)

    @property
    def ok(self) -> bool:
        """True when every run computed bitwise-identical outputs for every traced op, nothing
        that could differ went uncompared (see :attr:`not_compared`), and no op ran that the
        knowledge base says is non-deterministic here (see :attr:`risks`)."""
        own = not self.comparison.findings and not self.comparison.paths and not self.not_compared
        own = own and not self.errors and not self._risks(applies=True)
        own = own and not any(r.status == "interrupted" for r in self._compared_runs())
        return own and (self.as_compiled is None or self.as_compiled.ok)

    def _risks(self, applies: bool) -> list[Risk]:
        if self._risk_rows is None:
            executed = self.window.executed if self.window is not None else None
            self._risk_rows = known_risks(self._compared_runs(), self.comparison.findings, executed)
        return [r for r in self._risk_rows if r.applies == applies]

    def hidden_risk_keys(self) -> set[str]:
        """The op keys (without their "#n" suffix) of risks that did not diverge here."""
        import re

        return {re.sub(r"#\d+$", "", r.key) for r in self._risks(applies=True) if not r.observed}

    def set_confirmations(self, found: dict[str, str]) -> None:
        """Record what re-executing each suspect alone showed (see check(confirm=...))."""
        import re

        for r in self._risks(applies=True):
            text = found.get(re.sub(r"#\d+$", "", r.key))
            if text:
                r.confirmed = text

    def _compared_runs(self) -> list[Recording]:
        return self.recordings if self.mode != "rerun" else self.recordings[:1]

    @property
    def risks(self) -> pd.DataFrame:
        """The ops that ran and that the knowledge base lists as non-deterministic on the
        device they ran on with the run's settings (op determinism), whether or not they
        diverged in these runs (``observed``). Any row keeps :attr:`ok` False: a race that did
        not show in N runs is still a race."""
        return _risk_frame(self._risks(applies=True))

    @property
    def other_device_risks(self) -> pd.DataFrame:
        """Ops that ran here and are culprits only on another device (a CPU run's GPU
        culprits): information for when the step moves; they do not change the verdict."""
        return _risk_frame(self._risks(applies=False))

    @property
    def bound(self) -> float | None:
        """After clean runs, the smallest per-run probability of divergence they rule out at
        95% confidence (a source showing in more of the runs would have been seen); None when
        something differed or nothing was compared."""
        c = self.comparison
        if c.findings or c.paths or self.errors or c.runs < 2:
            return None
        return rule_out_bound(c.runs)

    @property
    def first_divergence(self) -> FirstDivergence | None:
        """Where the runs first part: the step (the k-th call of the block's training step),
        the op and its location; None when nothing diverged."""
        fd = first_divergence(self._compared_runs(), self.comparison.findings)
        return self.window.place(fd) if self.window is not None else fd

    @property
    def timeline(self) -> list[int]:
        """Divergent op executions per step of the first run (index 0 is step 1); empty when
        the block has no steps."""
        if self.window is not None:
            return list(self.window.timeline)
        return divergence_per_step(self._compared_runs(), self.comparison.findings)

    @property
    def verdict_notes(self) -> list[str]:
        """What a renderer says next to the verdict about what the runs could not show: known
        culprits that ran without diverging, the bound of a clean result, other devices'
        culprits."""
        notes = setup_notes(self._compared_runs())
        if self.mode == "processes":
            notes += [n for n in [shared_hashseed(self._compared_runs())] if n]
        c = self.comparison
        unit = "re-executions" if self.mode == "rerun" else "runs"
        hidden = [r for r in self._risks(applies=True) if not r.observed]
        if hidden:
            names = ", ".join(sorted({r.op_type for r in hidden}))
            env = self.recordings[0].environment if self.recordings else {}
            setting = "on" if env.get("op_determinism") else "off"
            first = hidden[0]
            confirmed = "; ".join(f"{r.op_type}: {r.confirmed}" for r in hidden if r.confirmed)
            notes.append(
                f"no difference seen in {c.runs} {unit} for {names}, but the knowledge base "
                f"lists {'it' if len(hidden) == 1 else 'them'} as non-deterministic on the "
                f"{knowledge.device_kind(first.device) or 'CPU'} with op determinism "
                f"{setting}"
                + (f" (re-executed alone: {confirmed})" if confirmed else "")
                + f": {first.culprit.mechanism} Fix: {first.fix}"
            )
        if self.bound is not None:
            notes.append(describe_bound(c.runs, unit))
        elsewhere = self._risks(applies=False)
        if elsewhere:
            devices = sorted({r.culprit.device for r in elsewhere})
            notes.append(
                f"on a {'/'.join(devices)} these ops would be culprits: "
                + ", ".join(sorted({r.op_type for r in elsewhere}))
                + " (information: they do not change this verdict)"
            )
        w = self.window
        if w is not None:
            where = "the first call that differs" if self.first_divergence else "the last call"
            notes.append(
                f"long runs: all {w.executions:,} op executions of each run were compared as "
                f"digests, call by call; {where} was analysed op by op"
            )
        return notes

    @property
    def not_compared(self) -> list[str]:
        """What could have differed but was not compared (e.g. TF1 graph ops, variables of a
        function called inside a graph but traced before the block; in rerun mode, ops it
        cannot re-execute that can differ by themselves): each keeps ``ok`` False."""
        blind = rerun_blind(self.recordings[0]) if self.mode == "rerun" and self.recordings else []
        if self._nothing_rerun:
            missed = not_rerun(self.recordings[0])
            why = (
                "; ".join(f"{', '.join(types)}: {reason}" for reason, types in missed.items())
                if missed
                else "it ran no op with an output nddebug can read: a TensorList, a dataset "
                "or another variant is compared through the ops that fill and read it"
            )
            blind.insert(
                0,
                f"no op of the step could be re-executed, so nothing was compared ({why}): "
                "repeat the whole step instead (nddebug.check(..., mode='repeat'))",
            )
        return not_compared(self.recordings) + blind

    @property
    def blind_spots(self) -> list[str]:
        """What was not compared that the warnings do not say already (rerun mode's ops it
        could not re-execute), for a renderer to show next to the verdict: the verdict said
        "not everything compared" and nothing said what."""
        return [x for x in self.not_compared if not any(x in w for w in self.warnings)]

    @property
    def verdict(self) -> str:
        c = self.comparison
        if self.errors:
            return "NOT checked"
        sources = [f for f in c.findings if f.role == "source"]
        streams_only = self._by_design_only()
        ac = self.as_compiled
        if ac is not None and ac._by_design_only() and self._compiled_random_only():
            # As compiled, only XLA's counter draws differed; with XLA off, only random ops
            # (unseeded there, a source; under XLA the same counter draws): the program the
            # user runs showed nothing else. The rows of both stay.
            return ac.verdict
        if (c.findings and not streams_only) or c.paths or self._compiled_differs():
            return "NOT reproducible"
        if not c.findings and ac is not None and ac._by_design_only():
            # With XLA off nothing differed; as compiled, only by design (analysis:
            # _xla_counter_draws): the compiled program's own verdict says what was not
            # compared.
            return ac.verdict
        if self._risks(applies=True) or self._compiled_risky():
            return "NOT shown reproducible: a known non-deterministic op ran"
        if streams_only and all(f.kind == "seeded pass" for f in sources):
            # Each run was the next pass of a seeded reshuffle (analysis._seeded_passes).
            return "NOT compared: a seeded shuffle began a new pass in every run"
        if streams_only and any(f.kind == "seeded pass" for f in sources):
            return "NOT compared: seeded random ops and a seeded shuffle moved on in every run"
        if streams_only and all(f.kind == "compiled stream" for f in sources):
            return "NOT compared: XLA-compiled random ops drew on from the process's counter"
        if streams_only:
            # Not non-determinism (analysis._seeded_streams), but nothing it fed was compared.
            return "NOT compared: seeded random ops drew further on in their streams"
        if any(r.status == "interrupted" for r in self._compared_runs()):
            return "no difference seen, but not everything compared"
        return "reproducible" if self.ok else "no difference seen, but not everything compared"

    # The program as compiled (check() of an XLA step) counts as it ended: a difference or an
    # error there is one here; a blind spot there (an XLA call's inner writes) only makes this
    # report "not everything compared" (see ok), not a difference that no run showed.
    def _compiled_differs(self) -> bool:
        ac = self.as_compiled
        return ac is not None and bool(
            ac.errors
            or (ac.comparison.findings and not ac._by_design_only())
            or ac.comparison.paths
            or ac._compiled_differs()
        )

    def _by_design_only(self) -> bool:
        """Every source is a difference by design (a seeded stream drawn on, a seeded pass):
        nothing non-deterministic, but what it fed was not compared."""
        c = self.comparison
        sources = [f for f in c.findings if f.role == "source"]
        return (
            bool(sources)
            and all(f.kind in _BY_DESIGN for f in sources)
            and not any(f.role == "control flow" for f in c.findings)
        )

    def _compiled_random_only(self) -> bool:
        """With XLA off (check() of an XLA step), whether every source is a random op, or
        nothing differed, and the runs took one path."""
        c = self.comparison
        return not c.paths and all(
            f.role == "propagated" or (f.role == "source" and f.kind == "random")
            for f in c.findings
        )

    def _compiled_risky(self) -> bool:
        ac = self.as_compiled
        return ac is not None and bool(ac._risks(applies=True) or ac._compiled_risky())

    @property
    def sources(self) -> pd.DataFrame:
        df = self.culprits
        return df[df["role"] == "source"].reset_index(drop=True)

    @property
    def culprits(self) -> pd.DataFrame:
        """One row per divergent op: sources first, the largest relative divergence
        (``rel_diff``) first and unmeasured ones last, then the rest in execution order. After
        a check of an XLA step, the rows of the step as compiled come first; ``program`` says
        which of the two programs each row belongs to."""
        import pandas as pd

        df = self.own_culprits
        if self.as_compiled is not None:
            df = pd.concat([self.as_compiled.culprits, df], ignore_index=True)
        return df

    @property
    def own_culprits(self) -> pd.DataFrame:
        """The rows of this report's own program only (what a renderer shows in its section)."""
        import pandas as pd

        df = pd.DataFrame([_row(f) for f in self.comparison.findings], columns=COLUMNS)
        df["program"] = self.program
        return df

    @property
    def summary(self) -> dict[str, Any]:
        c = self.comparison
        env = self.recordings[0].environment if self.recordings else environment.capture()
        fd = self.first_divergence
        return {
            "verdict": self.verdict,
            "mode": self.mode,
            "runs": c.runs,
            "ops_traced": c.ops_traced,
            "op_executions_per_run": c.executions
            if self.window is None
            else self.window.executions,
            "sources": sum(f.role == "source" for f in c.findings),
            "propagated": sum(f.role == "propagated" for f in c.findings),
            "control_flow": sum(f.role == "control flow" for f in c.findings),
            "paths_part": len(c.paths),
            "tensorflow": env.get("tensorflow", "?"),
            "devices": ", ".join(env.get("devices", [])),
            "op_determinism": env.get("op_determinism"),
            "first_divergence": dataclasses.asdict(fd) if fd is not None else None,
            "timeline": self.timeline,
            "risks": sorted({r.op_type for r in self._risks(applies=True)}),
            "bound": self.bound,
            "notes": self.verdict_notes,
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
        """Re-run the step with each source's (and risk's) fix applied: per op "fixed", "still
        divergent", "raises here" or "not verified". A check() report re-runs its step in
        this process with the fix switched on and back off; with ``script`` the step runs in
        fresh processes instead (see :func:`nddebug.verify.verify`)."""
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


RISK_COLUMNS = ["op_type", "op_name", "location", "device", "observed", "confirmed", "fix"]


def _risk_frame(rows: list[Risk]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "op_type": r.op_type,
                "op_name": r.op_name,
                "location": r.location,
                "device": r.device,
                "observed": r.observed,
                "confirmed": r.confirmed or ("diverged in these runs" if r.observed else ""),
                "fix": r.fix,
            }
            for r in rows
        ],
        columns=RISK_COLUMNS,
    )


def _evidence(c: knowledge.Culprit) -> str:
    """What backs a known culprit: its measurements (a real GPU's first), when it holds, and
    where its sources disagree."""
    parts = []
    if c.measured_gpu is not None:
        parts.append(f"measured on {c.measured_gpu}")
    if c.measured:
        parts.append(f"measured: {c.measured}")
    if c.condition:
        parts.append(f"holds when: {c.condition}")
    if c.sources_disagree:
        parts.append(f"sources disagree: {c.sources_disagree}")
    return "; ".join(p.rstrip(". ") for p in parts)


def _row(f: Any) -> dict[str, Any]:
    op = f.op
    c: knowledge.Culprit | None = f.culprit
    evidence = ""
    if f.role == "propagated":
        known = c.mechanism if c else ""
        fix = "Fix the source op(s) above; this op only carries their difference."
    elif f.kind in ("other threads", *_BY_DESIGN):
        known = c.mechanism if c and f.kind == "seeded stream" else "not in the known list"
        fix = knowledge.advice(f.kind)
    elif f.entered:
        known = "not in the known list"
        fix = (
            "Find the Python-side value that differs before this op: fix PYTHONHASHSEED (e.g. "
            "nddebug run --hashseed 0), seed Python's random and NumPy, sort sets and dict keys "
            "before turning them into tensors, and list files in sorted order."
        )
    elif op.function in OPAQUE and restored_function(op.op_type) and f.kind != "random":
        known = "not in the known list"
        fix = (
            "A function restored from a SavedModel gave different outputs, or wrote different "
            "variable values, from identical inputs and state; nddebug cannot see inside it "
            "(it has no Python code to retrace). Check the code the SavedModel was made from: "
            "its tf.function passed to nddebug.check() names the op."
        )
    elif op.function in OPAQUE:
        known = "not in the known list"
        fix = knowledge.advice(f.kind)
        if f.kind == "random":
            fix += (
                " The random op runs inside an XLA-compiled function: nddebug.check() checks the "
                "step with XLA off to name it."
                if op.function == "xla"
                else " It runs inside a function restored from a SavedModel: check the code the "
                "SavedModel was made from to name it."
                if restored_function(op.op_type)
                else " " + knowledge.advice("TF1 loop")
                if op.function == TF1_LOOP
                else " " + knowledge.advice("uninstrumented function")
            )
    elif op.op_type == "Step":
        known = "a step recorded as one digest: its ops are not named"
        fix = (
            "Record the first divergent step in full: `nddebug run --bisect SCRIPT` does it in "
            "two more fresh runs; or trace(detail='step:K') in two runs and compare them."
        )
    elif op.op_type == "VariableState":
        known = "not in the known list"
        fix = (
            "Let nddebug see inside: create or first call the tf.function inside "
            "nddebug.trace(), or pass it (or the Keras model as state=) to nddebug.check(), "
            "and switch off jit_compile while debugging."
        )
    elif c is not None:
        known = f"{c.api}: {c.mechanism}"
        fix = c.fix
        evidence = _evidence(c)
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
        "scale": f.scale,
        "rel_diff": f.rel_diff,
        "frac_differing": f.frac_differing,
        "unmeasured": f.unmeasured,
        "known_cause": known,
        "evidence": evidence,
        "fix": fix,
        "graph": op.graph,
        "executions": f.executions,
        "divergent_executions": f.divergent_executions,
        "explanation": f.explanation,
        "key": f.key,
    }


def _attach_magnitudes(comparison: Comparison, captures: list[Recording]) -> None:
    """Fill the magnitudes (max_abs_diff, max_ulp, scale, rel_diff, frac_differing) from the
    full values captured in a second pass (values are captured only for the ops found
    divergent). Each is the largest over the op's executions and outputs; rel_diff is taken
    per output against that output's own scale, so a large output cannot hide a small one's."""
    values = unit_values(captures)
    captured = {unit_key[1] for unit_key, _slot in values}
    for f in comparison.findings:
        measured: list[quantify.Divergence] = []
        for (unit_key, _slot), arrays in values.items():
            if unit_key[1] == f.key and len(arrays) >= 2:
                d = quantify.measure(arrays)
                if d is not None:
                    measured.append(d)
        if measured and max(d.frac_differing for d in measured) > 0:
            # Measured on the capture runs; if the divergence did not recur there, unknown.
            f.max_abs_diff = max(d.max_abs_diff for d in measured)
            f.max_ulp = max(d.max_ulp for d in measured)
            f.scale = max(d.scale for d in measured)
            f.rel_diff = max(d.rel_diff for d in measured)
            f.frac_differing = max(d.frac_differing for d in measured)
        elif captures and f.role == "source":
            f.unmeasured = NOT_CAPTURED if f.key not in captured else NOT_RECURRED


#: Why a source has no magnitudes (OpFinding.unmeasured).
NOT_CAPTURED = (
    "its values were not captured: it is in a function the step calls, which the capture "
    "runs reuse as first traced, without the copies of its values (check that function "
    "itself to measure it)"
)
NOT_RECURRED = "its divergence did not recur in the capture runs"


def _sort_by_magnitude(findings: list[OpFinding]) -> None:
    """Sources by relative divergence, largest first, unmeasured last; the sort is stable, so
    ties keep execution order and the other roles keep the analysis's order."""
    order = {"source": 0, "control flow": 1, "propagated": 2}

    def rank(f: OpFinding) -> float:
        if f.role != "source":
            return 0.0
        rel = f.rel_diff
        return -rel if rel is not None and rel == rel else math.inf

    findings.sort(key=lambda f: (order[f.role], rank(f)))
