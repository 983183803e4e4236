"""Compare recordings: align op executions across runs and classify every divergent op.

Pure functions over :class:`~nddebug.recording.Recording` objects; no TensorFlow.

Alignment: top-level (eager) executions are ordered, so their key sequences are matched with
a diff; the first mismatch is where the runs' paths part. Graph ops inside a matched call run
in a thread-dependent order, so they are matched by (op key, occurrence) within the call, and
an op whose outputs differ only in order (same multiset of digests) is not called divergent.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from nddebug import knowledge, replicas
from nddebug.errors import EmptyTraceError, NotComparableError
from nddebug.recording import (
    ACCUMULATED_SUM,
    AFTER_WRITES,
    ARGUMENT_BY_CALLER,
    CALL_OPS,
    CALL_WRITES,
    DATASET_PASSES,
    DATASET_STAGES,
    EMULATION_SCOPE,
    INPUT_FORM,
    LOOP_READS,
    LOOPS_AND_BRANCHES,
    MERGE_OPS,
    NOT_COMPARED,
    OPAQUE,
    OTHER_THREADS,
    PIPELINE_OPS,
    PIPELINE_READERS,
    QUEUE_FILLERS,
    QUEUE_TAKERS,
    RANDOM_OPS,
    RECORDED_BY_CALLER,
    RERUN_INNER,
    SHAPE_ONLY_OPS,
    STATE_FILLERS,
    STATE_READERS,
    STATELESS_RANDOM,
    TABLE_OR_QUEUE_READS,
    TABLE_WRITERS,
    TF1_GRAPH,
    TF1_LOOP,
    TF1_LOOP_NAME,
    UPDATE_NOTE,
    WRITER,
    XLA_NOTE,
    Event,
    OpInfo,
    Recording,
    seeded_random,
    unseen_op_type,
)

# A unit is one op execution identified across runs: (eager index in run 0, key, occurrence).
Unit = tuple[int, str, int]


@dataclass
class OpFinding:
    """What the comparison found for one op (all of its executions)."""

    key: str
    op: OpInfo
    role: str  # "source" | "propagated" | "control flow"
    kind: str
    first_seq: int  # execution order of its first divergent execution in the reference run
    runs_differing: int
    distinct_outputs: int
    executions: int
    divergent_executions: int
    units: list[Unit] = field(default_factory=list)
    culprit: knowledge.Culprit | None = None
    explanation: str = ""
    entered: bool = False  # a source only because its inputs already differed on entry
    # A loop or branch whose compared inputs were equal: the difference came in through an
    # input nddebug cannot compare (a TensorList, a resource handle).
    uncompared_inputs: bool = False
    max_abs_diff: float | None = None
    max_ulp: int | None = None
    frac_differing: float | None = None
    scale: float | None = None  # the largest finite |x| of the op's outputs
    rel_diff: float | None = None  # max |Δ| / max |x|, the figure the report sorts sources by
    unmeasured: str = ""  # why a source has no magnitudes although capture runs were made
    # Every execution of the op that differed (or ran in some runs only), sources or not.
    divergent_units: list[Unit] = field(default_factory=list)
    # A read or update of a variable whose every divergent execution came after a divergent
    # update of it: the difference reached it through the variable, not through its inputs.
    after_write: bool = False


@dataclass
class PathDivergence:
    """Runs executed different ops: where the paths first part."""

    run: int
    position: int
    reference_op: str
    other_op: str
    call_key: str = ""


@dataclass
class Comparison:
    runs: int
    ops_traced: int
    executions: int
    findings: list[OpFinding]
    paths: list[PathDivergence]
    order_only: list[str]
    warnings: list[str]


#: Ops that create variables: a run that made them did work the later runs of one process skip.
VARIABLE_CREATION = frozenset({"VarHandleOp", "VariableV2", "VarIsInitializedOp"})


def _state_read(op: OpInfo) -> list[str]:
    """The state an op's output depends on besides its recorded inputs: the variable (table,
    queue) it reads or updates, and, for an output of a TF1 loop, every one its frame reads
    (the loop's body read the weights an earlier step's update left)."""
    return ([op.resource] if op.resource else []) + list(op.attrs.get(LOOP_READS, []))


def _call_like(op: OpInfo) -> bool:
    """A call, branch or loop, or a value a function returned that its caller recorded with the
    call's inputs: what it outputs, ops inside the function computed. Or an op inside a
    function whose record leaves an argument to the call's record: what it outputs, the
    caller's ops computed too. An eager call of a traced function whose ops nddebug recorded
    is one too."""
    return (
        op.op_type in CALL_OPS
        or op.function == "instrumented"
        or op.note in (RECORDED_BY_CALLER, ARGUMENT_BY_CALLER)
    )


def first_run_setup(findings: list[OpFinding], first_only: set[str]) -> set[str]:
    """The keys of ops that ran in the first run only, when that run created variables and
    the others created none of their own: one first-call setup (Keras builds optimizer slots
    and loss trackers on the first fit) that later runs reused, not a path the program took
    by chance. Where the other runs made variables the first did not, they built their own:
    two recordings of different programs (``fit`` and a custom loop) were told to "make one
    call before recording" (probe round 40)."""
    created = [
        f for f in findings if f.role == "control flow" and f.op.op_type in VARIABLE_CREATION
    ]
    if not any(f.key in first_only for f in created) or any(
        f.key not in first_only for f in created
    ):
        return set()
    return {f.key for f in findings if f.key in first_only and f.role == "control flow"}


def _identity(ev: Event) -> Any:
    """What must be equal for two executions to agree: the output digests, and the shapes
    where they were recorded (eager ops: the same bytes in another shape differ)."""
    shapes = tuple(tuple(s) for s in ev.shapes) if ev.shapes else None
    return tuple(ev.digests), shapes


def _unreadable(ev: Event, op: OpInfo) -> bool:
    """Whether nothing the execution output could be digested: its outputs are resources,
    variants or values the kernel left undefined; or it has none and fills state the step
    reads back (STATE_FILLERS: a table's insert, a queue's enqueue), so its inputs are all
    that shows what it wrote. (Not a call with no outputs: the ops inside it are recorded,
    and some of its inputs, such as a collective's instance keys, change on every call by
    design; nor a summary write, whose step counter differs by design.)"""
    if not ev.digests:
        return bool(op.resource) and bool(STATE_FILLERS.match(op.op_type))
    return all(d is None for d in ev.digests)


def _event_inputs(ev: Event) -> Any:
    if ev.inputs is None:
        return None
    return tuple(tuple(d) if d is not None else None for d in ev.inputs)


UNATTRIBUTED = -1  # graph executions no recorded eager call claimed (still compared)
#: Units of top-level ops that only other runs than the reference made count down from here,
#: one range of _PER_RUN per run (an op that ran in run 1 only was dropped, and the read it
#: changed was blamed instead).
_EXTRA = -2
_PER_RUN = 1 << 40


def extra_origin(call_index: int) -> tuple[int, int] | None:
    """For the unit of a top-level op that only a later run made: that run, and the op's
    index among its top-level ops; None for any other unit."""
    if call_index > _EXTRA:
        return None
    return divmod(_EXTRA - call_index, _PER_RUN)


def _units(
    rec: Recording, ref_index: dict[int, int], ref_keys: list[str] | None = None
) -> dict[Unit, Event]:
    """Map each event of ``rec`` to its unit, given its eager calls' indices in the reference
    (and the reference's keys of them: an eager op aligned with one called from another line
    takes the reference's key)."""
    ref_index = {**ref_index, UNATTRIBUTED: UNATTRIBUTED}
    out: dict[Unit, Event] = {}
    counts: dict[tuple[int, str], int] = defaultdict(int)
    for ev in rec.events:
        op = rec.ops[ev.op_id]
        call_index = ref_index.get(ev.call)
        if call_index is None:
            continue
        if ev.call == ev.seq:  # an eager op: its own unit
            key = ref_keys[call_index] if ref_keys and 0 <= call_index < len(ref_keys) else op.key
            out[(call_index, key, 0)] = ev
            continue
        n = counts[(call_index, op.key)]
        counts[(call_index, op.key)] += 1
        out[(call_index, op.key, n)] = ev
    return out


def _eager(rec: Recording) -> list[Event]:
    return [ev for ev in rec.events if ev.call == ev.seq]


def align(recordings: list[Recording]) -> tuple[list[dict[Unit, Event]], list[PathDivergence]]:
    """Give every event of every run its unit (its identity across runs), relative to the
    first run; also where each run's sequence of top-level ops parts from the first's."""
    ref = recordings[0]
    ref_eager = _eager(ref)
    ref_keys = [ref.ops[e.op_id].key for e in ref_eager]
    paths: list[PathDivergence] = []
    per_run_units: list[dict[Unit, Event]] = []
    for r, rec in enumerate(recordings):
        eager = _eager(rec)
        keys = [rec.ops[e.op_id].key for e in eager]
        index: dict[int, int] = {}
        if r == 0:
            index = {e.seq: i for i, e in enumerate(eager)}
        else:
            blocks, first = _matching_blocks(ref_keys, keys)
            if first is not None:
                # The same top-level ops called from other lines (two trace() blocks one
                # after the other in a script: the line is part of an eager op's key): the
                # same path. Every such compare was "NOT reproducible", all its ops "ran in
                # some runs only" (probe round 38). Only where nothing but lines differ.
                loose, loose_first = _matching_blocks(
                    [_without_line(k) for k in ref_keys], [_without_line(k) for k in keys]
                )
                if loose_first is None:
                    blocks, first = loose, None
            for a, b, size in blocks:
                for k in range(size):
                    index[eager[b + k].seq] = a + k
            for b, e in enumerate(eager):
                # A top-level op the reference run did not make: a unit of its own, so that
                # it (and what it ran) is a finding of the runs that made it.
                index.setdefault(e.seq, _EXTRA - r * _PER_RUN - b)
            if first is not None:
                a, b = first
                paths.append(
                    PathDivergence(
                        run=r,
                        position=a,
                        reference_op=_describe(ref, ref_eager, a),
                        other_op=_describe(rec, eager, b),
                    )
                )
        per_run_units.append(_units(rec, index, ref_keys))
    return per_run_units, paths


#: An eager op's key ("eager:MatMul@train.py:12 (step)") up to its line number.
_EAGER_LINE = re.compile(r"^(eager:[^@]*@.*?):\d+( \(.*\))?$")


def _without_line(key: str) -> str:
    """An eager op's key without the line it ran at (other keys as they are)."""
    return _EAGER_LINE.sub(r"\1\2", key)


def _as_far_as_all_ran(
    recordings: list[Recording],
    per_run_units: list[dict[Unit, Event]],
    paths: list[PathDivergence],
) -> tuple[list[dict[Unit, Event]], list[PathDivergence]]:
    """Runs compared as far as every one ran: a run cut short (Ctrl-C, an exception inside
    the block: status "interrupted") ends after its last complete top-level op, so the
    other runs' later ones, and the graph executions no call claimed (those of the call it
    was cut in), are left out of every run. The complete run's tail was "ran in some runs
    only": 105 control-flow rows and "NOT reproducible" for runs that agreed bit for bit as
    far as both went."""
    lengths = [
        max((u[0] for u in pu if u[0] >= 0), default=-1) + 1
        for rec, pu in zip(recordings, per_run_units, strict=False)
        if rec.status == "interrupted"
    ]
    if not lengths:
        return per_run_units, paths
    cut = min(lengths)

    def kept(u: Unit) -> bool:
        if u[0] >= 0:
            return u[0] < cut
        origin = extra_origin(u[0])
        return origin is not None and origin[1] < cut

    return (
        [{u: ev for u, ev in pu.items() if kept(u)} for pu in per_run_units],
        [p for p in paths if p.position < cut],
    )


def run_signature(rec: Recording) -> str:
    """A hash of everything the comparison reads from a run: each op execution's op, the
    position of the call it ran in, its digests, input digests and shapes. Two runs with the
    same signature compare equal execution for execution (up to the order of executions
    within a call, which the comparison does not count as a difference), so check() keeps
    one copy of the events of repeats that match."""
    calls = {ev.seq: i for i, ev in enumerate(e for e in rec.events if e.call == e.seq)}
    rows = sorted(
        repr((calls.get(ev.call, -1), rec.ops[ev.op_id].key, ev.digests, ev.inputs, ev.shapes))
        for ev in rec.events
    )
    h = hashlib.sha256()
    for row in rows:
        h.update(row.encode())
    return h.hexdigest()


def unit_values(recordings: list[Recording]) -> dict[tuple[Unit, int], list[Any]]:
    """Captured full values, grouped by (unit, output slot), for units captured in every run."""
    per_run_units, _ = align(recordings)
    out: dict[tuple[Unit, int], list[Any]] = {}
    for u in per_run_units[0]:
        evs = [pu.get(u) for pu in per_run_units]
        if any(ev is None for ev in evs):
            continue
        for slot in range(len(evs[0].digests)):
            names = [f"{ev.seq}:{slot}" for ev in evs]
            if all(name in rec.values for name, rec in zip(names, recordings, strict=False)):
                out[(u, slot)] = [
                    rec.values[name] for name, rec in zip(names, recordings, strict=False)
                ]
    return out


def expand_reruns(rec: Recording) -> list[Recording]:
    """A rerun recording as runs that compare like any others: run j holds every re-executed
    op's j-th re-execution and every other op's only execution. A re-execution read the very
    same input tensors, so an op that differs there is a source by construction and nothing
    downstream of it can differ."""
    k = max((len(ev.reruns) for ev in rec.events if ev.reruns), default=0)
    runs = []
    for j in range(k + 1):
        events = [
            dataclasses.replace(
                ev,
                digests=ev.reruns[j - 1] if j and ev.reruns and j <= len(ev.reruns) else ev.digests,
                reruns=None,
            )
            for ev in rec.events
        ]
        values = {name: v for name, v in rec.values.items() if "@" not in name}
        if j:
            suffix = f"@{j}"
            values.update(
                {name[: -len(suffix)]: v for name, v in rec.values.items() if name.endswith(suffix)}
            )
        runs.append(
            dataclasses.replace(
                rec,
                events=events,
                values=values,
                kind="run" if rec.kind == "rerun" else rec.kind,
                label=f"{rec.label or 'step'}, execution {j}",
                run_id=f"{rec.run_id}:{j}",
            )
        )
    return runs


def not_rerun(rec: Recording) -> dict[str, list[str]]:
    """The op types of a rerun recording that were not re-executed, by reason (calls of
    instrumented functions are left out: the ops inside them were re-executed one by one; a
    call of a function traced before the block, or compiled by XLA, is not: nothing inside
    it was, and an unseeded dropout there made a step "reproducible")."""
    covered = {ev.op_id for ev in rec.events if ev.reruns}
    out: dict[str, set[str]] = defaultdict(set)
    for op_id in {ev.op_id for ev in rec.events} - covered:
        op = rec.ops[op_id]
        if op.op_type in PSEUDO_OPS or op.rerun == RERUN_INNER:
            continue
        if op.function and op.function not in OPAQUE:
            continue
        if op.function == "xla":
            reason = "compiled by XLA: its ops are not re-executed one by one"
        else:
            reason = (
                "" if op.function in OPAQUE else op.rerun
            ) or "traced before the rerun block: its graph has no copies to re-run"
        out[reason].add(op.op_type)
    return {reason: sorted(types) for reason, types in sorted(out.items())}


#: Ops whose values can differ between runs by themselves, whatever their inputs: random
#: ops, a dataset's iterator, Python code, the clock. Rerun mode cannot re-execute them
#: (they change state when run), so it cannot see whether they would.
_VARY_BY_THEMSELVES = ("EagerPyFunc", "PyFunc", "PyFuncStateless", "Timestamp")


def rerun_blind(rec: Recording) -> list[str]:
    """What a rerun recording could not compare, as not-compared lines: ops that can differ
    by themselves and were not re-executed (see :data:`_VARY_BY_THEMSELVES`), and ops in
    functions traced before the block, which have no copies to re-run. A step with an
    unseeded random op was "reproducible" in rerun mode and not in repeated runs."""
    out = []
    missed = not_rerun(rec)
    varying = sorted(
        {
            t
            for types in missed.values()
            for t in types
            if any(h in t for h in (*_RANDOM_HINTS, *PIPELINE_READERS, *_VARY_BY_THEMSELVES))
        }
    )
    if varying:
        out.append(
            "ops that give other values from one run to the next by themselves ("
            + ", ".join(varying)
            + ") ran, and rerun mode cannot re-execute them (running them again changes their "
            "state): repeat the step (check()'s default mode) to compare them"
        )
    xla = missed.get("compiled by XLA: its ops are not re-executed one by one")
    if xla:
        out.append(
            "XLA-compiled functions ("
            + ", ".join(xla[:6])
            + "): their ops are not re-executed one by one; check() in repeat mode compares them"
        )
    before = [reason for reason in missed if reason.startswith("traced before")]
    if before:
        out.append(
            "ops of functions traced before the rerun block ("
            + ", ".join(missed[before[0]][:6])
            + (" …" if len(missed[before[0]]) > 6 else "")
            + "): their graphs have no copies to re-run"
        )
    return out


def _no_shared_op(recordings: list[Recording]) -> str:
    """A warning where two recordings share no op (ops are matched by key: type, where in
    the user's code it was made, in which function): recordings of two programs, or of one
    changed between the runs, got "NOT reproducible" with no source and a path parting at
    op #0, and nothing said why (probe round 44, F5). Runs of one program that took other
    paths still share the ops before the fork."""
    pseudo = ("VariableState", "ReturnValue")

    def ran(r: Recording) -> dict[str, OpInfo]:
        """The ops a run executed, by key, in the order they first ran."""
        return {op.key: op for e in r.events if (op := r.ops[e.op_id]).op_type not in pseudo}

    reference = ran(recordings[0])
    for i, r in enumerate(recordings[1:], start=1):
        other = ran(r)
        if reference and other and not reference.keys() & other.keys():
            a, b = next(iter(reference.values())), next(iter(other.values()))
            return (
                f"runs 0 and {i} share no op: run 0 began with {a.op_type} made at "
                f"{a.location or '?'}, run {i} with {b.op_type} made at {b.location or '?'}. "
                "Ops are matched by type and where they were made, so these are recordings "
                "of two programs, of code changed between the runs, or of the same code on "
                "other lines: that their paths part at the first op says only that"
            )
    return ""


def compare_recordings(recordings: list[Recording], in_process: bool = False) -> Comparison:
    """Align and classify; the first recording is the reference. ``in_process``: the runs
    repeated one step in one process (check()), where a seeded random op's kernel goes on
    from run to run (see :func:`_seeded_streams`)."""
    if len(recordings) < 2:
        raise NotComparableError(
            f"comparison needs at least two recordings of the same step, got {len(recordings)}"
        )
    twice = [(i, n) for i, n in Counter(r.run_id for r in recordings).items() if n > 1]
    if twice:
        raise NotComparableError(
            f"run {twice[0][0][:12]} is given {twice[0][1]} times: a run compared with "
            "itself agrees by definition, so nothing would be shown. Compare recordings of "
            "different runs (were two files that hold the same runs given, or one file twice?)"
        )
    algorithms = {r.digest_algorithm for r in recordings}
    if len(algorithms) > 1:
        raise NotComparableError(
            f"recordings use different digest algorithms {sorted(algorithms)}; record them "
            "with the same nddebug version"
        )
    empty = [
        i
        for i, r in enumerate(recordings)
        if not any(r.ops[e.op_id].op_type not in ("VariableState", "ReturnValue") for e in r.events)
    ]
    if empty:
        raise EmptyTraceError(
            f"run(s) {empty} recorded no TensorFlow op: nothing to compare. Put the training "
            "step itself inside nddebug.trace() / the function given to nddebug.check()."
        )
    per_run_units, paths = align(recordings)
    per_run_units, paths = _as_far_as_all_ran(recordings, per_run_units, paths)

    all_units = set().union(*per_run_units)
    by_key: dict[str, list[Unit]] = defaultdict(list)
    for u in all_units:
        by_key[u[1]].append(u)

    run_seqs = [{u: ev.seq for u, ev in pu.items()} for pu in per_run_units]
    resources = _resource_names(recordings, per_run_units)
    ref_seq = run_seqs[0]
    findings: list[OpFinding] = []
    unreadable: set[str] = set()
    first_only: set[str] = set()  # ops that ran in the first run only
    order_only: list[str] = []
    for key, units in by_key.items():
        units.sort()
        op = _op_for(recordings, per_run_units, units[0], resources)
        missing = [u for u in units if any(u not in pu for pu in per_run_units)]
        divergent = []
        source_units = []
        differing_runs: set[int] = set()
        for u in units:
            if u in missing:
                continue
            outs = [_identity(pu[u]) for pu in per_run_units]
            ins = [_event_inputs(pu[u]) for pu in per_run_units]
            if len(set(outs)) == 1:
                if not (_unreadable(per_run_units[0][u], op) and len(set(ins)) > 1):
                    continue
                # Nothing it output can be read (resources, variants) but its inputs differed:
                # what it passed on cannot be compared, so it is a finding, not silence.
                unreadable.add(key)
                differing_runs.update(r for r, i in enumerate(ins) if i != ins[0])
                divergent.append(u)
                continue
            divergent.append(u)
            differing_runs.update(r for r, o in enumerate(outs) if o != outs[0])
            # A graph op's attribute values (OpInfo.attrs["form"]) are inputs too: a function
            # traced again with another Python value (alpha=) has the same op, other attrs.
            forms = {
                rec.ops[pu[u].op_id].attrs.get("form")
                for rec, pu in zip(recordings, per_run_units, strict=False)
            }
            if None not in ins and len(set(ins)) == 1 and len(forms) == 1:
                source_units.append(u)
        if divergent and key not in unreadable and _same_multiset(per_run_units, divergent):
            order_only.append(key)
            continue
        if not divergent and not missing:
            continue
        if divergent:
            role = "source" if source_units else "propagated"
            chosen = source_units or divergent
            per_run = [tuple(tuple(pu[u].digests) for u in divergent) for pu in per_run_units]
            distinct = len(set(per_run))
            counted = divergent
        else:
            role, chosen, distinct, counted = "control flow", missing, 0, []
            differing_runs.update(
                r for r, pu in enumerate(per_run_units) if any(u not in pu for u in missing)
            )
            if all(
                u in per_run_units[0] and not any(u in pu for pu in per_run_units[1:])
                for u in missing
            ):
                first_only.add(key)
        # A unit the reference run does not have is placed by the run that has it (the runs
        # number their executions alike up to where they part).
        first_seq = min(
            (
                ref_seq[u] if u in ref_seq else min(s.get(u, 1 << 62) for s in run_seqs)
                for u in chosen
            ),
            default=1 << 62,
        )
        findings.append(
            OpFinding(
                key=key,
                op=op,
                role=role,
                kind="",
                first_seq=first_seq,
                runs_differing=len(differing_runs),
                distinct_outputs=distinct,
                executions=len(units),
                divergent_executions=len(counted) if counted else len(missing),
                units=sorted(chosen),
                divergent_units=sorted(divergent or missing),
            )
        )
    replicas.demote_collectives(findings, recordings, per_run_units)
    flow = digest_flow(findings, per_run_units)
    _state_propagation(findings, run_seqs, flow)
    _fused_chains(findings)
    _arguments_from_callers(findings)
    _loops_and_branches_carry(findings)
    _steps_after_other_steps(findings, recordings)
    _entry_point(findings, flow)
    findings[:] = _without_emulation_internals(findings)
    if any(f.role == "source" and not _call_like(f.op) for f in findings):
        # A loop, branch or call returns what its body computed: the body's source explains it.
        for f in findings:
            if f.role == "source" and _call_like(f.op):
                f.role = "propagated"
    device = recordings[0].environment.get("emulated_device", "")
    setup = first_run_setup(findings, first_only)
    data_writers = _data_function_writers(recordings)
    loop_writers = _tf1_loop_writers(recordings)
    changed = _changed_by_the_step(recordings)
    stages = _dataset_stages(recordings)
    reshuffled = {it: shuffles for it, (_, shuffles) in _dataset_passes(recordings).items()}
    python_functions = _python_functions(recordings)
    updates = _updates_per_graph(recordings)
    restored = {
        str(op.attrs.get("variable"))
        for op in recordings[0].ops.values()
        if op.op_type == "VariableState" and op.attrs.get("variable")
    }
    # Steps end with top-level calls: a block of eager code alone is one step, and a report
    # of one "step 1" said nothing of why.
    eager_only = not any(
        op.op_type == "Step" and op.attrs.get("callee") for op in recordings[0].ops.values()
    )
    for f in findings:
        _explain(f, device)
        if f.op.op_type == "Step" and eager_only:
            f.explanation += (
                " (this block called no tf.function and ran no Session.run, so its op "
                "executions, all eager, were one step: the step in full is the whole block, "
                "and its first divergence is given by execution)"
            )
        if f.role == "source" and f.op.attrs.get(PIPELINE_OPS):
            _behind_data_functions(f, device)
        if f.role == "source" and f.kind == "input pipeline" and stages:
            _name_dataset_stages(f, stages, reshuffled)
        # The variable a read or check()'s value after the step (VariableState) is of.
        state = f.op.attrs.get("variable") if f.op.op_type == "VariableState" else f.op.resource
        # A dataset op that runs the function itself (ReduceDataset) is explained by what it
        # runs (its stages, its functions' ops), not as a reader of what they write (probe
        # round 48, F4).
        reader = not f.op.op_type.endswith("Dataset")
        if f.role == "source" and state and state in data_writers and reader:
            _written_in_data(f, data_writers[state], device)
            if in_process:
                _seeded_pass_in_data(f, data_writers[state], recordings, device)
        elif f.role == "source" and state and state in loop_writers and f.kind == "other":
            _written_in_loop(f, loop_writers[state], device)
        elif f.role == "source" and in_process and f.op.resource in changed:
            _changed_by_earlier_runs(f, changed[f.op.resource])
        elif f.role == "source" and f.kind == "other" and f.op.resource and python_functions:
            _maybe_written_in_python(f, python_functions)
        elif f.role == "source" and f.kind == "other" and f.op.note == UPDATE_NOTE:
            _maybe_unordered(
                f,
                updates.get((f.op.graph, f.op.resource), 1) - 1,
                restored,
                _writers_elsewhere(recordings, f.op),
            )
        if f.key in setup:
            f.explanation = (
                "ran in the first run only, which created variables (a first call builds the "
                "optimizer's slots, metrics and loss trackers) that the later runs reused: "
                "make one call before recording, or compare runs that each start fresh "
                "(nddebug run)"
            )
        if f.key in unreadable and f.role == "propagated":
            f.explanation = (
                "its inputs differed and what it output could not be compared (resources, "
                "variants such as datasets and lists, values the kernel left undefined, or "
                "no output: it writes state such as a table or a queue): whatever it passed "
                "on is not seen"
            )
    _other_threads(findings, recordings)
    _in_other_settings(findings, recordings)
    _seed_state_reads(findings)
    _generator_state_calls(findings, per_run_units)
    if in_process:
        _seeded_streams(findings, recordings)
        _seeded_passes(findings, recordings)
    # A propagated op carries the kind of the first source upstream of it.
    first_source = min(
        (f for f in findings if f.role == "source"), key=lambda f: f.first_seq, default=None
    )
    if first_source is not None:
        for f in findings:
            if f.role == "propagated":
                f.kind = first_source.kind
    elif any(f.role == "control flow" for f in findings):
        for f in findings:  # what only carried on a difference in the path the runs took
            if f.role == "propagated":
                f.kind = "control flow"
    order = {"source": 0, "control flow": 1, "propagated": 2}
    findings.sort(key=lambda f: (order[f.role], f.first_seq, f.key))
    if paths or any(f.role == "control flow" for f in findings):
        first_source = min((f.first_seq for f in findings if f.role == "source"), default=None)
        for f in findings:
            if f.role == "control flow" and first_source is not None and f.first_seq > first_source:
                f.role = "propagated"
        findings.sort(key=lambda f: (order[f.role], f.first_seq, f.key))
    warnings = sorted({w for r in recordings for w in r.warnings})
    programs = sorted({str(r.environment.get("program") or "") for r in recordings} - {""})
    if len(programs) > 1:
        warnings.insert(
            0,
            f"the runs were recorded by different programs ({', '.join(programs)}): a "
            "comparison says something only between runs of one script (were two scripts' "
            "runs appended to one file with nddebug run -o?)",
        )
    unshared = _no_shared_op(recordings)
    if unshared:
        warnings.insert(0, unshared)
    xla = [w for w in warnings if w.endswith(XLA_NOTE)]
    if len(xla) > 1:  # runs that traced more saw more functions: keep the fullest, once
        warnings = [w for w in warnings if w not in xla or w == max(xla, key=len)]
    emulated = recordings[0].environment.get("emulated_device", "")
    if emulated:
        from nddebug.emulate import FINDING, RECIPES

        warnings.append(
            f"Recorded under nddebug.emulate_gpu(): the advice is for a {emulated}, and the "
            "emulated ops' divergence is the emulation's (reordered accumulation): each such "
            f"source {FINDING}."
        )
        for f in findings:
            if f.role == "source" and f.op.op_type in RECIPES:
                f.explanation += f" — emulated: it {FINDING}"
    return Comparison(
        runs=len(recordings),
        ops_traced=len({op.key for r in recordings for op in r.ops.values()}),
        executions=len(recordings[0].events),
        findings=findings,
        paths=paths,
        order_only=sorted(order_only),
        warnings=warnings,
    )


#: In :func:`digest_flow`, where a differing value no finding output came from: outside the
#: ops compared (Python, NumPy, a file), or through what no digest covers.
OUTSIDE = "<outside the ops compared>"


def digest_flow(
    findings: list[OpFinding], per_run_units: list[dict[Unit, Event]]
) -> dict[str, set[str]]:
    """Per finding, the findings whose differing outputs its first divergent execution read,
    by digest: a value that differs between runs, output by one finding's execution and among
    another's recorded inputs in the same run, went from the one to the other; ``OUTSIDE``
    where no finding output it. (A value equal in every run links nothing: it could have
    come from anywhere.) Graph ops record on
    parallel threads, so the order their records arrive in (``first_seq``) need not be the
    order the value went in: an iterator's element arrived after the Relu that read it, and
    the Relu was named where the difference entered TensorFlow. Only the first divergent
    execution counts: in a training loop a later step reads what the first one's update
    made, which links every op of the step to the update it led to."""
    by_key = {f.key: f for f in findings}
    # What each finding's first divergent execution read that differed between the runs: the
    # values worth looking for among the producers (a value equal in every run, a constant,
    # an axis, an empty tensor's (0, 0), links nothing).
    first: dict[str, Unit] = {}
    wanted: list[dict[tuple, list[str]]] = [defaultdict(list) for _ in per_run_units]
    for g in findings:
        u = _first_unit(g.divergent_units)
        if u is None:
            continue
        first[g.key] = u
        for r, v in _differing_slots([pu[u].inputs if u in pu else None for pu in per_run_units]):
            wanted[r][v].append(g.key)
    upstream: dict[str, set[str]] = {g.key: set() for g in findings}
    if not any(wanted):
        return upstream  # nothing read a differing value: no links
    # Per run, per wanted value: the findings that output it, with the executions that did.
    producers: list[dict[tuple, dict[str, list[Unit]]]] = [defaultdict(dict) for _ in per_run_units]
    for f in findings:
        for u in f.divergent_units:
            outs = [pu[u].digests if u in pu else None for pu in per_run_units]
            for r, v in _differing_slots(outs):
                if v in wanted[r]:
                    producers[r][v].setdefault(f.key, []).append(u)
    for r, values in enumerate(wanted):
        for v, readers in values.items():
            for g in readers:
                made_by = [
                    key
                    for key, units in producers[r].get(v, {}).items()
                    if key != g
                    and _could_feed(by_key[key].op, units, by_key[g].op, first[g])
                    # Not a read of the variable ``g`` writes: it outputs the value ``g``
                    # wrote, it did not make it.
                    and not _reads_what_it_wrote(by_key[key], by_key[g])
                ]
                upstream[g].update(made_by or [OUTSIDE])
    return upstream


def _could_feed(producer: OpInfo, made: list[Unit], reader: OpInfo, read: Unit) -> bool:
    """Whether one of the executions ``made`` of ``producer`` could have fed execution
    ``read`` of ``reader``. Not one from a later top-level call: calls run in order (within
    one, records arrive as threads decide). Nor, for an op made after the reader in the same
    function graph, one of the same or a later execution of that graph: an op's inputs exist
    before it does, and ops are numbered as they are made. The forward ``loss * s`` read
    ``s`` from Python, the gradient's ``1.0 * s`` output the same bits, and the forward op was
    linked to it and called propagated. An earlier execution can (a loop's body feeds its
    next iteration through the loop's variables). Eager ops, one per site that a Python loop
    runs again and again, and a TF1 graph, whose loops feed a merge from an op made after
    it, are linked by call alone."""
    after = producer.graph == reader.graph not in ("", TF1_GRAPH) and producer.op_id > reader.op_id
    for u in made:
        if u[0] > read[0] >= 0:
            continue
        if after and u[0] == read[0] and u[2] >= read[2]:
            continue
        return True
    return False


def _slot_values(per_run: list[Any], i: int) -> list[tuple | None]:
    """Slot ``i`` of a list of digests in each run (None where the run lacks it)."""
    return [
        tuple(d[i]) if d is not None and i < len(d) and d[i] is not None else None for d in per_run
    ]


def _differing_indices(per_run: list[Any]) -> list[int]:
    """The slots of a list of digests (per run; None where the run lacks it) whose value
    differs between the runs that have it."""
    n = max((len(d) for d in per_run if d is not None), default=0)
    return [i for i in range(n) if len({v for v in _slot_values(per_run, i) if v is not None}) > 1]


def _differing_slots(per_run: list[Any]) -> list[tuple[int, tuple]]:
    """(run, digest) of every slot of a list of digests whose value differs between the
    runs that have it (see :func:`_differing_indices`)."""
    found = []
    for i in _differing_indices(per_run):
        values = _slot_values(per_run, i)
        found += [(r, v) for r, v in enumerate(values) if v is not None and v != (0, 0)]
    return found


def _reads_what_it_wrote(reader: OpFinding, writer: OpFinding) -> bool:
    """Whether ``reader`` reads the state ``writer`` writes (so the value it outputs is one
    ``writer`` put there)."""
    return bool(
        reader.op.resource
        and reader.op.resource == writer.op.resource
        and reader.op.op_type in STATE_READERS
        and writer.op.op_type not in STATE_READERS
    )


def downstream(key: str, flow: dict[str, set[str]]) -> set[str]:
    """The findings a difference in finding ``key`` reached (see :func:`digest_flow`)."""
    return _reached(key, _readers(flow))


def _readers(flow: dict[str, set[str]]) -> dict[str, set[str]]:
    """``flow`` turned around: per finding, the findings that read from it."""
    readers: dict[str, set[str]] = defaultdict(set)
    for g, ups in flow.items():
        for f in ups:
            readers[f].add(g)
    return readers


def _reached(key: str, readers: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = [key]
    while todo:
        for g in readers.get(todo.pop(), ()):
            if g not in seen and g != key:
                seen.add(g)
                todo.append(g)
    return seen


def _state_propagation(
    findings: list[OpFinding],
    run_seqs: list[dict[Unit, int]],
    flow: dict[str, set[str]] | None = None,
) -> None:
    """Divergence also flows through variables (and other state behind a resource handle:
    tables, queues, iterators) and function calls:
    - a read or an update that follows a divergent update of the same variable differs
      because of it (an update's output is the variable's value after it); a read
      (STATE_READERS) changes nothing, so its divergence explains no later op; an update
      that ran in some runs only (a loop body that ran more times) is a divergent update
      too, placed by the order of a run that made it (``run_seqs``: each run's seq of each
      unit);
    - the value a variable holds after the step (VariableState) differs because of the ops
      found above, when there are any;
    - the call of an instrumented tf.function returns what the ops inside it computed;
    - an op that reads only shapes (SHAPE_ONLY_OPS) differs because a shape upstream did.
    The first run is the reference: its order places a finding (first_seq)."""
    ref_seq = run_seqs[0]
    # Per variable, the seq of its first divergent update in each run (run, None), and in
    # each call of each run (run, call): "any update before u" is "the first one before u".
    first_write: dict[str, dict[tuple[int, int | None], int]] = defaultdict(dict)
    for f in findings:
        # An update, or a call nddebug does not see into that writes variables it captures.
        written = list(f.op.attrs.get(CALL_WRITES, []))
        if f.op.resource and f.op.op_type not in STATE_READERS:
            written.append(f.op.resource)
        # Every divergent update counts, whatever its role: a source's later updates
        # differ because of its first one, and they change the variable all the same.
        for resource in written:
            firsts = first_write[resource]
            for w in f.divergent_units or f.units:
                for r, seqs in enumerate(run_seqs):
                    if w in seqs:
                        for at in ((r, None), (r, w[0])):
                            firsts[at] = min(firsts.get(at, seqs[w]), seqs[w])

    updates = {(f.op.graph, f.op.op_name): f for f in findings if f.op.graph == TF1_GRAPH}

    def written_before(f: OpFinding, u: Unit) -> bool:
        """Whether a divergent update of ``f``'s variable (of one that a TF1 loop reads,
        LOOP_READS) ran before execution ``u`` in a run that made both; in a TF1 graph,
        also an update the graph orders before it in the same Session.run (AFTER_WRITES),
        whose record may have arrived later."""
        for name in f.op.attrs.get(AFTER_WRITES, ()):
            g = updates.get((f.op.graph, name))
            if g is not None and any(w[0] == u[0] for w in g.divergent_units or g.units):
                return True
        for resource in _state_read(f.op):
            # A variable known by its identity (eager:<id>, what eager ops and captured
            # handles are named by) is the same variable in every call and function; eager
            # ops and TF1 session graphs too. A handle known only by its name in one graph
            # (a loop variable) is linked within its call.
            across = not f.op.graph or f.op.graph == TF1_GRAPH or resource.startswith("eager:")
            firsts = first_write.get(resource, {})
            for r, seqs in enumerate(run_seqs):
                first = firsts.get((r, None if across else u[0]))
                if u in seqs and first is not None and first < seqs[u]:
                    return True
        return False

    explained = any(f.op.op_type not in PSEUDO_OPS for f in findings)
    steps = [f for f in findings if f.op.op_type == "Step"]
    first_step = min(steps, key=lambda f: f.first_seq) if steps else None
    for f in findings:
        if f.role != "source":
            continue
        if CONTAINER_OPS.match(f.op.op_type) and f.op.function != TF1_LOOP:
            continue  # see the container rule below; a TF1 loop's is judged as the loop
        if _state_read(f.op) and f.op.op_type != "VariableState":
            # A read of a variable, or an update of it (its output is the value after the
            # update), after a divergent update of it: what the variable held before
            # differed, which its recorded inputs do not show. Only executions that no such
            # update preceded can be where it started.
            first = [u for u in f.units if not written_before(f, u)]
            if not first:
                f.role = "propagated"
                # Only where its first divergent execution too came after such an update
                # (an update whose own inputs differed first is where the difference went in).
                f.after_write = all(written_before(f, u) for u in f.divergent_units or f.units)
                f.units = f.divergent_units or f.units  # what a propagated finding lists
                f.first_seq = min(ref_seq.get(u, 1 << 62) for u in f.units)
            elif len(first) < len(f.units):
                f.units = first
                f.first_seq = min(ref_seq.get(u, 1 << 62) for u in first)
        elif f.op.op_type in SHAPE_ONLY_OPS or f.op.op_type in MERGE_OPS:
            # It reads only shapes: a differing output means a shape upstream differed. A
            # TF1 Merge hands on what a branch made: the difference is the branch's.
            f.role = "propagated"
        elif f.op.op_type == "ReturnValue" and explained:
            f.role = "propagated"
        elif f.op.op_type == "Step" and f is not first_step:
            # Steps after the first divergent one may only carry it on.
            f.role = "propagated"
        elif f.op.function == "instrumented":
            # Its inner ops explain it, when one of them (or anything else) differed; if none
            # did, the difference arose in a part of it that was not recorded (a function
            # traced before the block, or loaded from a SavedModel, called inside it): it
            # stays the source (see _explain).
            if any(g is not f and g.op.op_type not in PSEUDO_OPS for g in findings):
                f.role = "propagated"
        elif f.op.op_type == "VariableState" and explained:
            f.role = "propagated"
    # After the reads above: a read that a divergent update explains explains no container.
    readers = _readers(flow or {})
    for f in findings:
        if (
            f.role == "source"
            and CONTAINER_OPS.match(f.op.op_type)
            and f.op.function != TF1_LOOP  # what filled it is the loop nddebug cannot see
            and explained_elsewhere(f, findings, _reached(f.key, readers))
        ):
            # A TensorList, TensorArray or Optional hands on what was put into it: its
            # handle (a variant, or a TF1 TensorArray's resource) cannot be digested, so
            # "identical inputs" only means its other inputs (an index, a shape) were; the
            # source is what filled it.
            f.role = "propagated"


#: Pseudo-ops check() adds after the step: the variables' values and the step's return value.
PSEUDO_OPS = ("VariableState", "ReturnValue", "Step")

#: Ops that take a container (a variant: TensorList, TensorArray, Optional, TensorMap) and hand
#: on what it holds.
CONTAINER_OPS = re.compile(r"^(TensorList|TensorArray|Optional|TensorMap)")


def _fused_chains(findings: list[OpFinding]) -> None:
    """An op recorded together with the ops grappler fuses into it (OpInfo.fused) holds their
    inputs as its own. Where one of them was recorded as well (another consumer read it) and
    is a source in the same executions (same call, same occurrence), the chain's difference
    starts there: the fused record only carries it. A source execution of the chain that no
    source execution of a member explains keeps it a source."""
    sources = {f.key: f for f in findings if f.role == "source"}
    for f in findings:
        if f.role != "source" or not sources.keys() & f.op.fused.keys():
            continue
        explained = {(u[0], u[2]) for k in f.op.fused if k in sources for u in sources[k].units}
        if all((u[0], u[2]) in explained for u in f.units):
            f.role = "propagated"


def _without_emulation_internals(findings: list[OpFinding]) -> list[OpFinding]:
    """The findings less emulate_gpu()'s own ops that only carried a difference: the
    gradients TensorFlow makes of its masks (".../UnsortedSegmentSum/emulate_gpu/
    SelectV2_grad/SelectV2") were listed as propagated ops of the user's step (probe round
    38). An emulated op's source is recorded as the op it emulates, and is kept."""
    return [f for f in findings if f.role == "source" or EMULATION_SCOPE not in f.op.op_name]


def explained_elsewhere(
    f: OpFinding, findings: list[OpFinding], after: set[str] = frozenset()
) -> bool:
    """Whether another op, not a container op, diverged at or before ``f``'s first divergent
    execution, or is a source: something that could have put the difference into the
    container. Not an op that read what the container handed on (``after``, the findings
    :func:`downstream` of it): its record can arrive first, and the container was demoted in
    favour of its own reader."""
    return any(
        g is not f
        and g.role in ("source", "propagated")
        and not CONTAINER_OPS.match(g.op.op_type)
        # A source (inputs equal, outputs not) whose record came later counts too.
        and (g.first_seq <= f.first_seq or g.role == "source")
        and g.key not in after
        and not g.after_write
        for g in findings
    )


def _arguments_from_callers(findings: list[OpFinding]) -> None:
    """An op inside a nested function whose record leaves out an argument of the function
    (ARGUMENT_BY_CALLER: the call's record holds it) sees equal recorded inputs when only
    that argument differed. Where a call of its function had inputs that differed (role
    "propagated"), the difference came in through them: the op only carries it. Otherwise
    (the call's inputs were equal) it arose inside the function, and the op stays a source."""
    carried = {
        f.op.attrs["callee_key"] + "/"
        for f in findings
        if f.role == "propagated" and f.op.attrs.get("callee_key")
    }
    for f in findings:
        if f.role == "source" and f.op.note == ARGUMENT_BY_CALLER:
            if any(f.op.key.startswith(prefix) for prefix in carried):
                f.role = "propagated"


def _loops_and_branches_carry(findings: list[OpFinding]) -> None:
    """A loop or a branch returns what the ops of its bodies computed, and those are recorded.
    Seen as a source (the inputs nddebug compared were equal, the outputs were not) while no
    op inside it is one, the difference came in through an input no digest covers: a
    TensorList or another variant (an LSTM's gradient loop takes the upstream gradient as a
    list), or a variable's handle. It only carries it. (Labels that differed between runs were
    blamed on an LSTM's gradient loop, as a non-deterministic kernel.) If nothing else
    diverged first, the entry point names where the difference was first seen. Not in a TF1
    graph: Session.run records the graph's own ops, not its bodies' (docs/tf1-sessions.md),
    so there its outputs are all nddebug saw."""
    for f in findings:
        if f.role == "source" and f.op.op_type in LOOPS_AND_BRANCHES and f.op.graph != TF1_GRAPH:
            f.role = "propagated"
            f.uncompared_inputs = True


def _steps_after_other_steps(findings: list[OpFinding], recordings: list[Recording]) -> None:
    """Runs recorded with ``trace(detail="steps")`` that made different numbers of steps (an
    early stop, a time budget): the eager ops after each run's last call fold into one last
    step with no call, and those last steps are matched with each other though one follows
    47 steps and the other 49. What they hold differs because the runs did, not by itself:
    it only carries the difference, and the runs part at the first step only some made (a
    control-flow difference). It was named a source at step 47, and "steps 1 to 46 agree"."""
    trailing = [
        f
        for f in findings
        if f.role == "source" and f.op.op_type == "Step" and not f.op.attrs.get("callee")
    ]
    if not trailing:
        return
    from nddebug.timeline import step_calls

    if len({len(step_calls(r)) for r in recordings}) > 1:  # counted as reports count steps
        for f in trailing:
            f.role = "propagated"


def _entry_point(findings: list[OpFinding], flow: dict[str, set[str]] | None = None) -> None:
    """Divergent ops but no source: the difference entered TensorFlow from outside (Python or
    NumPy values, files, iteration order that depends on PYTHONHASHSEED). The first op it
    reached is where to look: the first in arrival order among those that read no differing
    value from another finding (``flow``, :func:`digest_flow`). A batch that changed enters
    through its features and its labels, a Python scale factor through each op that reads
    it: every op of the same call that read a differing value no finding output is an entry
    too (only the labels' ``Cast`` was named when a data order changed, and the model's
    input was called propagated). Not one whose compared inputs were equal: a list or a
    loop whose difference came in through what no digest covers only carries it, and so do
    a call (its body's ops read what it passed on) and a record of ops grappler fuses that
    holds another entry's inputs as its own (``_fused_chains``)."""
    if not findings or any(f.role in ("source", "control flow") for f in findings):
        return
    keys = {f.key for f in findings}
    roots = [f for f in findings if not f.after_write and not (flow or {}).get(f.key, set()) & keys]
    first = min(roots or findings, key=lambda f: f.first_seq)
    call = _first_call(first)
    for f in findings:
        outside = OUTSIDE in (flow or {}).get(f.key, ())
        also = outside and not f.after_write and not _call_like(f.op) and _first_call(f) == call
        if f is first or also:
            f.role = "source"
            f.entered = True
    _fused_chains(findings)  # a record that holds an entry's inputs as its own only carries it


def flat_environment(d: Any, prefix: str = "") -> dict[str, Any]:
    """A recording's environment as dotted keys (``threads.intra_op``) to plain values."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flat_environment(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


#: Environment keys (and key prefixes) that choose what a kernel computes: its version and
#: build, the devices, oneDNN, the thread pools a kernel splits its work over, op determinism
#: and the switches read from the process's environment variables.
KERNEL_SETTINGS = (
    "tensorflow",
    "build.",
    "devices",
    "onednn",
    "threads.",
    "op_determinism",
    "env.",
    "platform",
)


def kernel_setting_changes(recordings: list[Recording]) -> list[str]:
    """ "threads.intra_op: 1 -> 2" for each kernel setting (``KERNEL_SETTINGS``) in which a run
    differs from the first."""
    first = flat_environment(recordings[0].environment or {})
    changes = []
    for rec in recordings[1:]:
        other = flat_environment(rec.environment or {})
        for k in sorted(set(first) | set(other)):
            if k == "env.PYTHONHASHSEED" or not k.startswith(KERNEL_SETTINGS):
                continue  # Python's hashing chooses no kernel
            if first.get(k) != other.get(k):
                line = f"{k}: {first.get(k, '(absent)')} -> {other.get(k, '(absent)')}"
                if line not in changes:
                    changes.append(line)
    return changes


def _in_other_settings(findings: list[OpFinding], recordings: list[Recording]) -> None:
    """Runs whose kernel settings differ (``nddebug diff`` of two machines, thread counts or
    versions): an op with the same inputs and another output may compute what those settings
    choose (a MatMul split over 2 threads sums in another order than over 1), not at random.
    It was "the kernel itself is non-deterministic", and check() in one setting said
    reproducible (probe round 43, F2)."""
    changes = kernel_setting_changes(recordings)
    if not changes:
        return
    for f in findings:
        if f.role == "source" and f.kind == "numerical" and f.culprit is None:
            f.explanation = (
                "same inputs, different output, in runs whose kernel settings differ ("
                + "; ".join(changes[:3])
                + "): what the kernel computes may depend on them (how many threads split a "
                "sum, which kernel a version or a CPU picks) rather than vary by itself; "
                "compare runs made with the same settings to tell which"
            )


def _first_unit(units: list[Unit]) -> Unit | None:
    """The first of an op's executions: its own calls before executions no call claimed."""
    own = [u for u in units if u[0] >= 0] or units
    return min(own, key=lambda u: (u[0], u[2])) if own else None


def _first_call(f: OpFinding) -> int:
    """The top-level call of a finding's first divergent execution."""
    u = _first_unit(f.divergent_units)
    return UNATTRIBUTED if u is None else u[0]


def _same_multiset(per_run_units: list[dict[Unit, Event]], units: list[Unit]) -> bool:
    """Executions of one op that differ only in the order they ran within each call (graph
    ops on parallel threads, loop iterations): every run computed the same bag of values."""
    key = units[0][1]
    calls: dict[int, set[Unit]] = defaultdict(set)
    for pu in per_run_units:
        for u in pu:
            if u[1] == key:
                calls[u[0]].add(u)
    for c in {u[0] for u in units}:
        if len(calls[c]) < 2:
            return False  # a single execution cannot have been reordered
        bags = [sorted(tuple(pu[u].digests) for u in calls[c] if u in pu) for pu in per_run_units]
        if any(b != bags[0] for b in bags):
            return False
    return True


def _matching_blocks(
    ref: list[str], other: list[str]
) -> tuple[list[tuple[int, int, int]], tuple[int, int] | None]:
    """Where two runs' sequences of top-level op keys match (blocks of (ref position, other
    position, length)), and the positions where they first part (None: they do not). The
    common head and tail are matched as they are and only what lies between goes through
    difflib, whose cost grows with the square of a sequence of repeated keys: two runs of a
    72,000-op eager loop took 344 s to compare."""
    n = min(len(ref), len(other))
    head = 0
    while head < n and ref[head] == other[head]:
        head += 1
    if head == len(ref) == len(other):
        return [(0, 0, head)], None
    tail = 0
    while tail < n - head and ref[-1 - tail] == other[-1 - tail]:
        tail += 1
    blocks = [(0, 0, head)] if head else []
    sm = difflib.SequenceMatcher(
        None, ref[head : len(ref) - tail], other[head : len(other) - tail], autojunk=False
    )
    blocks += [(a + head, b + head, size) for a, b, size in sm.get_matching_blocks() if size]
    if tail:
        blocks.append((len(ref) - tail, len(other) - tail, tail))
    return blocks, (head, head)


def _describe(rec: Recording, eager: list[Event], i: int) -> str:
    if i >= len(eager):
        return "(end of run)"
    op = rec.ops[eager[i].op_id]
    return f"{op.op_type} at {op.location or '?'}"


def _op_for(
    recordings: list[Recording],
    per_run_units: list[dict[Unit, Event]],
    u: Unit,
    resources: list[dict[str, str]],
) -> OpInfo:
    """The op of unit ``u``, from the first run that made it. An op of a later run names the
    state it uses as the reference run does (``resources``, see :func:`_resource_names`)."""
    for r, (rec, pu) in enumerate(zip(recordings, per_run_units, strict=False)):
        if u in pu:
            op = rec.ops[pu[u].op_id]
            if r and op.resource in resources[r]:
                op = dataclasses.replace(op, resource=resources[r][op.resource])
            return op
    raise KeyError(u)


def _resource_names(
    recordings: list[Recording], per_run_units: list[dict[Unit, Event]]
) -> list[dict[str, str]]:
    """Per run, its names of variables (and other state) -> the reference run's names, from
    the ops both runs made. An eager variable is named by its handle's id, which differs
    between processes and when a run builds its model again: an assignment only run 1 made
    was not linked to the read of the same variable that it changed, and the read was blamed
    ("changed outside the traced block")."""
    ref_units = per_run_units[0]
    names: list[dict[str, str]] = [{}]
    for rec, pu in zip(recordings[1:], per_run_units[1:], strict=False):
        mine: dict[str, str] = {}
        for u, ev in pu.items():
            theirs = ref_units.get(u)
            if theirs is None:
                continue
            a, b = recordings[0].ops[theirs.op_id].resource, rec.ops[ev.op_id].resource
            if a and b:
                mine.setdefault(b, a)
        names.append(mine)
    return names


_RANDOM_HINTS = ("Random", "Multinomial", "Stateful", "TruncatedNormal", "RngReadAndSkip")


def _explain_opaque(f: OpFinding, device: str) -> None:
    """A call nddebug could not see inside (an XLA cluster, a function traced before the block)
    is the source: say what its op list tells about why, since its ops were not recorded."""
    op = f.op
    what, f.kind = {
        "xla": ("an XLA-compiled function (cluster)", "XLA cluster"),
        TF1_LOOP: (
            ("an output of" if op.op_type in ("Exit", "RefExit") else "a read of what was put in")
            + f" the TF1 while loop {op.attrs.get(TF1_LOOP_NAME, '')!r} (v1 control flow, "
            "tf.nn.dynamic_rnn: nddebug cannot record the ops inside its frame)",
            "TF1 loop",
        ),
    }.get(
        op.function,
        (
            "a tf.function traced before nddebug.trace() (its inner ops were not recorded)",
            "uninstrumented function",
        ),
    )
    random, known = _unseen_ops(op.attrs.get("ops_inside", []), device)
    more = len(op.written) - 4
    shown = ", ".join(op.written[:4]) + (f" and {more} more" if more > 0 else "")
    state = f" and the variables it captures ({shown})" if op.written else ""
    f.explanation = (
        f"{what}: its outputs{state} were compared after each call, and differ although its "
        "inputs (and those variables before the call) were identical"
    )
    if random:
        f.kind = "random"
        f.explanation += f"; it holds stateful random op(s): {', '.join(random)}"
    elif known:
        f.explanation += f"; known culprits inside it: {', '.join(known[:6])}"


def _unseen_ops(inside: list[str], device: str) -> tuple[list[str], list[str]]:
    """Of the op types of code nddebug did not record (``opaque.ops_inside``): its stateful
    random ops, and the others the knowledge base lists as culprits on this device (a CPU
    run's GPU culprits made an XLA call's counter draws look like a kernel's, probe round 42,
    F2)."""
    random = sorted(
        t.replace("(unseeded)", " (no seed)").replace("(random)", "")
        for t in inside
        if t.endswith(("(unseeded)", "(random)"))
    )
    here = knowledge.device_kind(device) or "CPU"
    known = set()
    for t in inside:
        op_type = unseen_op_type(t)
        c = knowledge.lookup(op_type, device)
        if c is None or c.kind == "random" or c.device not in (here, "any"):
            continue  # a GPU culprit inside a call that ran on the CPU explains nothing here
        if not (c.integer_outputs_exact and op_type != t):  # sums of integers: in any order
            known.add(op_type)
    return random, sorted(known)


def _behind_data_functions(f: OpFinding, device: str) -> None:
    """A source that hands on or runs a dataset whose tf.data functions nddebug does not see
    into (OpInfo.attrs[PIPELINE_OPS]; a `for x in dataset` loop's body inside a tf.function
    is one): what they hold is where the difference may have arisen. A random op in the
    loop's body was blamed on "the input pipeline" and the advice was to seed the shuffle."""
    inside = f.op.attrs.get(PIPELINE_OPS, [])
    random, known = _unseen_ops(inside, device)
    writes = sorted({unseen_op_type(t) for t in inside if WRITER.match(t)})
    if not (random or known or writes):
        return
    held = []
    if random:
        held.append(f"stateful random op(s) {', '.join(random)}")
    if known:
        held.append(f"known culprits {', '.join(known[:6])}")
    if writes:
        held.append(f"variable updates ({', '.join(writes[:4])})")
    f.explanation += (
        "; the dataset runs tf.data functions nddebug does not record (the body of a "
        "`for ... in dataset` loop inside a tf.function, or a map/filter/scan function), "
        f"which hold {'; '.join(held)}: the difference may have arisen there"
        + (
            ", or in a variable they read and update that already held another value when "
            "the runs began (restore every one: pass the model and the optimizer as state=)"
            if writes
            else ""
        )
    )
    if random and f.kind == "input pipeline":
        f.kind = "random"


def not_compared(recordings: list[Recording]) -> list[str]:
    """What the runs could not compare (from their recorders): a verdict cannot be "ok"."""
    return sorted(
        {
            w[len(NOT_COMPARED) :]
            for r in recordings
            for w in r.warnings
            if w.startswith(NOT_COMPARED)
        }
    )


def _other_threads(findings: list[OpFinding], recordings: list[Recording]) -> None:
    """Sources whose difference came in from outside what was recorded (inputs that already
    differed, state read through a handle), in runs where other threads did TensorFlow work
    that nddebug does not record: that work is where it may have arisen. Threads that each
    compute a part and hand it back in the order they finish made the block's sum the source
    "from Python or NumPy values", with advice about PYTHONHASHSEED."""
    if not any(w.startswith(OTHER_THREADS) for r in recordings for w in r.warnings):
        return
    for f in findings:
        if f.role == "source" and f.kind == "other" and (f.entered or f.op.resource):
            f.kind = "other threads"
            f.explanation += (
                "; other threads did TensorFlow work during the block, which nddebug does not "
                "record (see the warning): if they made these inputs or wrote this state, the "
                "difference arose there (results handed back in the order the threads finish, "
                "or an op of theirs)"
            )


def _data_function_writers(recordings: list[Recording]) -> dict[str, OpInfo]:
    """The state (by resource identity) that a tf.data function of the step can write: a
    dataset op that takes a variable's handle (a Python ``for`` loop over a dataset inside a
    tf.function becomes ``ScanDataset`` and ``ReduceDataset``, its body a tf.data function).
    tf.data runs those functions where nddebug does not record, so their writes are seen
    only where the step reads the variable."""
    return {
        op.resource: op
        for r in recordings
        for op in r.ops.values()
        if op.resource and op.op_type.endswith("Dataset")
    }


def _tf1_loop_writers(recordings: list[Recording]) -> dict[str, OpInfo]:
    """The state (by resource identity) that a TF1 while loop of the runs writes inside its
    frame (CALL_WRITES of its Exits), which nddebug cannot record: seen only where a later
    op reads it."""
    return {
        resource: op
        for r in recordings
        for op in r.ops.values()
        if op.function == TF1_LOOP
        for resource in op.attrs.get(CALL_WRITES, [])
    }


def _written_in_loop(f: OpFinding, loop: OpInfo, device: str) -> None:
    """A read of a variable that a TF1 while loop writes: the difference arose in the loop's
    frame, not in state carried over between runs (read in a later Session.run, it was
    "state carried over", with the advice to restore state the runs had restored; probe
    round 46, F3). Its random ops and known culprits are named."""
    random, known = _unseen_ops(loop.attrs.get("ops_inside", []), device)
    f.kind = "random" if random else "TF1 loop"
    held = [f"stateful random op(s) {', '.join(random)}"] if random else []
    held += [f"known culprits {', '.join(known[:6])}"] if known else []
    f.explanation = (
        f"the variable is written inside the TF1 while loop "
        f"{loop.attrs.get(TF1_LOOP_NAME, '')!r} (v1 control flow), whose ops nddebug cannot "
        "record: the difference arose there" + (f"; it holds {'; '.join(held)}" if held else "")
    )


def _dataset_stages(recordings: list[Recording]) -> dict[str, list[str]]:
    """What in each dataset an iterator of the block was made from can make its elements
    differ (``MakeIterator``'s ``DATASET_STAGES``), by the iterator's identity."""
    found: dict[str, list[str]] = {}
    for r in recordings:
        for op in r.ops.values():
            for iterator, stages in (op.attrs.get(DATASET_STAGES) or {}).items():
                found.setdefault(iterator, list(stages))
    return found


def _name_dataset_stages(
    f: OpFinding, stages: dict[str, list[str]], reshuffled: dict[str, list[str]]
) -> None:
    """An input pipeline that differed, with what its dataset holds that makes elements
    differ: the iterator it reads, or, for a read that cannot say which iterator (one passed
    to the function as an argument, a read of what an iterator handed out), the one pipeline
    the block bound an iterator to that holds any.
    The explanation listed every possible cause (probe round 33, finding 3)."""
    if f.op.key in stages:  # an op that ran a dataset built in the step (ReduceDataset)
        own = stages[f.op.key]
    elif f.op.resource.startswith("eager:"):  # a read of a known iterator: its own dataset
        own = stages.get(f.op.resource)
    else:  # an iterator passed in as an argument (Keras's fit), or what one handed out
        distinct = {tuple(v) for v in stages.values() if v}
        # Only what one pipeline holds: that no stage is there is said of the read's own.
        own = list(next(iter(distinct))) if len(distinct) == 1 else None
    if own:
        f.explanation = (
            "the dataset behind it holds what makes its elements differ from run to run: "
            + "; ".join(own)
            + f". In general, {f.explanation[:1].lower()}{f.explanation[1:]}"
        )
    elif own is not None and f.op.resource in reshuffled:
        f.explanation = (
            "the dataset behind it holds no stage that reorders or draws by chance, but it "
            f"reshuffles with its seed on every pass ({'; '.join(reshuffled[f.op.resource])}): "
            "runs made in one process (two trace() blocks, or check()) see its next pass, in "
            "another order by design, while fresh processes make the same passes. If these "
            "runs were separate processes, the values it was made from differed instead (an "
            "unseeded NumPy or Python draw, files or a set listed in another order)"
        )
    elif own is not None:
        f.explanation = (
            "the dataset behind it holds no stage that reorders or draws (no parallel stage "
            "with deterministic=False, no unseeded shuffle or random op, no Python code): the "
            "values it was made from differed, data loaded or computed before the dataset was "
            "built (an unseeded NumPy or Python draw, files or a set listed in another order, "
            "a table built in another order)"
        )


def _changed_by_the_step(recordings: list[Recording]) -> dict[str, OpInfo]:
    """Per table or queue (its resource identity) that outlives a run, the same object in
    every run (one the step creates is a new one in each), an op of the step that changes
    it: a table's insert, import or remove, a queue's enqueue or dequeue; in the order first
    seen."""
    per_run = [
        {op.resource: op for op in r.ops.values() if op.resource and _changes(op.op_type)}
        for r in recordings
    ]
    kept = set.intersection(*(set(run) for run in per_run)) if per_run else set()
    found: dict[str, OpInfo] = {}
    for run in per_run:
        for resource, op in run.items():
            if resource in kept:
                found.setdefault(resource, op)
    return found


def _changes(op_type: str) -> bool:
    return bool(
        TABLE_WRITERS.match(op_type) or QUEUE_TAKERS.match(op_type) or QUEUE_FILLERS.match(op_type)
    )


def _changed_by_earlier_runs(f: OpFinding, changer: OpInfo) -> None:
    """A source that reads a table or queue the step itself changes, the same object in
    every run repeated in one process: every fill of this run had equal inputs (else the read
    would be propagated), so the contents it found were what the runs before left: carried
    over between runs, not a vocabulary built in another order nor a queue filled by racing
    threads (probe round 35: a MutableHashTable left out of state=, a FIFOQueue each repeat
    took the next element of). A table or queue the step makes anew in each run is not this
    (see _changed_by_the_step): its own culprit stands (an unseeded RandomShuffleQueue)."""
    if not TABLE_OR_QUEUE_READS.match(f.op.op_type):
        return
    queue = f.op.op_type.startswith("Queue")
    where = f" at {changer.location}" if changer.location else ""
    f.kind = "other"
    f.culprit = None
    f.explanation = (
        f"it reads a {'queue' if queue else 'lookup table'} that the step itself changes "
        f"({changer.op_type}{where}), and every run found it as the runs before left it: "
        + (
            "each took the next elements, which nothing can put back"
            if queue
            else "its contents carried over between runs (state= holds a mutable table and "
            "puts it back before every run)"
        )
    )


def _written_in_data(f: OpFinding, dataset: OpInfo, device: str) -> None:
    """A source that reads state a tf.data function writes: the difference arose in that
    function, not in state carried over between runs. The random ops and known culprits the
    function holds are named (a random op in a loop's body is kind random)."""
    random, known = _unseen_ops(dataset.attrs.get(PIPELINE_OPS, []), device)
    f.kind = "random" if random else "input pipeline"
    where = f" at {dataset.location}" if dataset.location else ""
    held = [f"stateful random op(s) {', '.join(random)}"] if random else []
    held += [f"known culprits {', '.join(known[:6])}"] if known else []
    f.explanation = (
        f"the variable is written inside a tf.data function ({dataset.op_type}{where}: a "
        "Python for loop over a dataset inside a tf.function, or Dataset.scan/reduce/map), "
        "which nddebug does not see into: the difference arose there, from the data the "
        "loop was given (its order: an unseeded shuffle) or from an op inside its body"
        + (f", which holds {'; '.join(held)}" if held else "")
    )


#: Ops that run the step's own Python code (tf.py_function, tf.numpy_function), which can
#: write variables nddebug does not see written.
_PYTHON_FUNCTIONS = ("EagerPyFunc", "PyFunc")


def _python_functions(recordings: list[Recording]) -> list[OpInfo]:
    """The Python functions the runs called inside the step (see :data:`_PYTHON_FUNCTIONS`),
    in the order first seen."""
    ran = {ev.op_id for r in recordings for ev in r.events}
    found: dict[str, OpInfo] = {}
    for r in recordings:
        for op_id, op in r.ops.items():
            if op.op_type in _PYTHON_FUNCTIONS and op_id in ran:
                found.setdefault(op.key, op)
    return list(found.values())


def _maybe_written_in_python(f: OpFinding, functions: list[OpInfo]) -> None:
    """A source that reads state (a variable already different when read) in runs that
    called Python code inside the step: that code can write variables (``v.assign`` in a
    tf.py_function's body runs eagerly on TensorFlow's thread, which nddebug does not
    record), so the difference may have arisen there, not in state carried over between
    runs. It was blamed on the read alone, and ``check(state=[...])``, which restores that
    variable itself, said the same."""
    shown = ", ".join(
        f"{op.op_type}" + (f" at {op.location}" if op.location else "") for op in functions[:3]
    )
    more = f" and {len(functions) - 3} more" if len(functions) > 3 else ""
    f.explanation += (
        f"; or written by Python code the step ran: {shown}{more} (tf.py_function, "
        "tf.numpy_function) can assign variables, which nddebug does not record; if it wrote "
        "this one, the difference arose there (NumPy's or Python's random state, the clock, "
        "a file)"
    )


def _writers_elsewhere(recordings: list[Recording], update: OpInfo) -> int:
    """What else may write the variable an update writes: its updates outside the update's
    graph (eager ones, other functions') and calls nddebug does not see inside (an eager
    one's OpInfo.written, a graph's call of an uninstrumented or XLA function, a TF1
    loop)."""
    return sum(
        1
        for op in recordings[0].ops.values()
        if op.written
        or op.function in OPAQUE
        or (op.note == UPDATE_NOTE and op.resource == update.resource and op.graph != update.graph)
    )


def _updates_per_graph(recordings: list[Recording]) -> Counter[tuple[str, str]]:
    """How many update ops of each variable each graph has (eager updates left out: Python
    runs them one after another)."""
    return Counter(
        (op.graph, op.resource)
        for op in recordings[0].ops.values()
        if op.note == UPDATE_NOTE and op.resource and op.graph
    )


def _maybe_unordered(f: OpFinding, others: int, restored: set[str], elsewhere: int = 0) -> None:
    """An update whose inputs were identical but whose variable held a different value before
    it. With other updates of that variable in the same graph, nothing may order them (they
    race); where check() restored the variable before each run (``restored``: the variables
    it records as VariableState), state carried over is ruled out and the race is the
    reason. A race of eight unordered float updates of one variable, passed as state= and
    restored, was explained as "state was not restored", with that advice.

    With no other writer at all (``elsewhere``: its updates outside this graph, and calls
    that write variables unseen) and the variable restored, the update started from the
    same value with the same inputs in every run: the kernel is the reason. The CPU kernel
    of ResourceSparseApplyAdagrad, whose threads update rows that several indices share,
    was explained as "state was not restored (pass it as state=)" to a user who had
    (probe round 48, F1)."""
    if others < 1:
        if f.op.resource in restored and elsewhere < 1:
            f.kind = "numerical"
            f.explanation = (
                "the update's inputs were identical, check() restored the variable before each "
                "run, and nothing else in the step writes it: from the same inputs and the "
                "same value it left another value, so the kernel itself is non-deterministic "
                "(a new finding; an update kernel that splits its rows over threads adds the "
                "rows several indices share in another order)"
            )
        return
    race = (
        f"{others} other update(s) of the same variable run in this graph: unless a data or "
        "control dependency orders them, they run in whatever order the threads take, and a "
        "sum in another order rounds differently"
    )
    if f.op.resource in restored:
        f.kind = "unordered updates"
        f.explanation = (
            "the update's inputs were identical, and check() restored the variable before "
            f"each run, but it held a different value before this update: {race}"
        )
    else:
        f.explanation += f"; or {race}"


def _seed_state_reads(findings: list[OpFinding]) -> None:
    """A source that reads a variable holding a random seed's state (an int64 pair, a Keras
    SeedGenerator's [seed, counter], drawn from by stateless random ops that differ too) is
    a random source: a SeedGenerator made without a seed takes a random one in each process,
    and across processes (nddebug run) every augmentation layer's read was blamed on "state
    carried over", with the advice to pass state= to check()."""
    if not any(f.op.op_type.startswith(STATELESS_RANDOM) for f in findings):
        return
    unseeded = (
        "a SeedGenerator made without a seed (a random layer or keras.random call given no "
        "seed=, with no keras.utils.set_random_seed before the model was built) takes a "
        "random one in each process"
    )
    for f in findings:
        op = f.op
        if not (
            f.role == "source"
            and f.kind == "other"
            and op.dtypes == ["int64"]
            and op.shapes == [[2]]
        ):
            continue
        f.kind = "random"
        if op.op_type == "ReadVariableOp":
            f.explanation = (
                "reads a random seed's state (an int64 pair, as a Keras SeedGenerator keeps "
                "[seed, counter]; the stateless random ops drawn from it differ too) that "
                f"already held a different value: {unseeded}; within one process, the step "
                "advances it"
            )
        else:
            # The seed made where the model is built inside the block (nddebug run --all):
            # the eager Cast of [seed, 0] was "other", with the advice to fix PYTHONHASHSEED
            # (probe round 44, F3).
            f.entered = False  # a seed, not a Python value to hunt down: the random advice
            f.explanation = (
                "makes a random seed's state (an int64 pair, as a Keras SeedGenerator starts "
                "from [seed, 0]; the stateless random ops drawn from it differ too) from a "
                f"value that already differed when it entered TensorFlow: {unseeded}, from "
                "Python's random module"
            )


def _generator_state_calls(
    findings: list[OpFinding], per_run_units: list[dict[Unit, Event]]
) -> None:
    """A call nddebug did not see inside (a function traced before the block, XLA) whose only
    differing inputs are the variables it captures, read before the call, where it draws from
    a random state (``RngReadAndSkip`` and the other ``tf.random.Generator`` ops the knowledge
    base lists as random): the state was a generator's, and it differed before the block. A
    pre-traced step drawing from ``Generator.from_non_deterministic_state()`` was "other",
    with the advice to fix PYTHONHASHSEED (probe round 44, F2)."""
    for f in findings:
        op = f.op
        if not (f.role == "source" and f.kind == "other" and f.entered):
            continue
        if op.function not in OPAQUE:
            continue
        draws = sorted(
            {
                t
                for t in map(unseen_op_type, op.attrs.get("ops_inside", []))
                if t.startswith(STATELESS_RANDOM)
                or (
                    t not in RANDOM_OPS
                    and (c := knowledge.lookup(t, op.device)) is not None
                    and c.kind == "random"
                )
            }
        )
        u = _first_unit(f.divergent_units)
        if not draws or u is None:
            continue
        ins = [pu[u].inputs if u in pu else None for pu in per_run_units]
        first = next((x for x in ins if x), [])
        # The call's inputs: its arguments, the form of the call (INPUT_FORM), then the
        # captured variables' values before it.
        form = next((i for i, d in enumerate(first) if d and d[1] == INPUT_FORM), None)
        differing = _differing_indices(ins)
        if form is None or not differing or differing[0] <= form:
            continue  # an argument differed too: not the captured state alone
        f.kind = "random"
        f.entered = False
        shown = ", ".join(draws[:4]) + (f" and {len(draws) - 4} more" if len(draws) > 4 else "")
        f.explanation = (
            "a call nddebug could not see inside whose arguments were identical but whose "
            "captured variables already differed before the call, and which draws random "
            f"numbers ({shown} inside it) from a state it captures: a tf.random.Generator "
            "made with from_non_deterministic_state() (or the global generator with no "
            "tf.random.set_seed) starts from the operating system's entropy, and a Keras "
            "SeedGenerator made without a seed (a Dropout or random layer given no seed=) "
            "from Python's random, in each process; within one process, every draw "
            "advances them"
        )


def _seeded_streams(findings: list[OpFinding], recordings: list[Recording]) -> None:
    """In runs of one process: an eager random op with a seed (``tf.random.uniform(shape,
    seed=5)``, or an op seed drawn from the global seed, which check() draws alike in every
    run) that differs from identical inputs and the same seeds in every run has drawn further
    on in its seeded stream: TensorFlow keeps one kernel per seed for the process, and each
    call draws the next numbers, while a fresh process draws the same ones again. That is not
    non-determinism, and "seed it" was wrong advice; check() gives fresh kernels to such ops
    inside the functions it calls (tracer.fresh), not to eager ones. Seeds that differ
    between the runs (drawn from Python or the clock) stay a random source, and so does a
    seeded op inside a graph (a loop's iterations can race for its kernel)."""
    for f in findings:
        op = f.op
        if f.role == "source" and _xla_counter_draws(f):
            random, _ = _unseen_ops(f.op.attrs.get("ops_inside", []), f.op.device)
            unseeded = [t.removesuffix(" (no seed)") for t in random if t.endswith("(no seed)")]
            f.kind = "compiled stream"
            f.explanation = (
                "an XLA-compiled function with stateful random ops inside: XLA ignores their "
                "seeds and draws from a counter of the process that every call advances, so "
                "the runs drew different numbers while fresh processes draw the same (seen "
                "on the CPU); not non-determinism, but what it feeds could not be compared"
            )
            if unseeded:
                f.explanation += (
                    f" ({', '.join(unseeded)} without a seed: the same under XLA, but with "
                    "XLA off each would draw other numbers in every process: seed them before "
                    "turning XLA off)"
                )
            continue
        if f.role != "source" or op.graph or not seeded_random(op):
            continue
        seeds = {
            (o.attrs.get("seed"), o.attrs.get("seed2"))
            for rec in recordings
            for o in rec.ops.values()
            if o.key == op.key
        }
        if len(seeds) != 1:
            continue
        f.kind = "seeded stream"
        f.explanation = (
            "a seeded random op drew further on in its stream: its kernel, kept by "
            "TensorFlow for the process, gives the next numbers at each call, so the runs "
            "drew different ones from the same seeds while fresh processes draw the same; "
            "not non-determinism, but what it feeds could not be compared"
        )


def _xla_counter_draws(f: OpFinding) -> bool:
    """Whether a source is an XLA call whose only explanation is its stateful random ops
    (probe round 37: a jit_compile step with tf.nn.dropout(seed=3) was "NOT reproducible",
    with the advice to seed what was seeded, though fresh processes agreed bit for bit)."""
    if f.op.function != "xla" or f.kind != "random":
        return False
    random, known = _unseen_ops(f.op.attrs.get("ops_inside", []), f.op.device)
    # Unseeded ops too (probe round 42, F1): XLA draws them from the same counter, and fresh
    # processes agreed bit for bit, seeded or not; with XLA off (as check() also runs it)
    # an unseeded one is a random source, which that comparison names.
    return bool(random) and not known


def _dataset_passes(recordings: list[Recording]) -> dict[str, tuple[str, list[str]]]:
    """Per iterator bound in the runs (``DATASET_PASSES``): the identity of the reshuffling
    dataset it reads and its seeded shuffles, one sentence each."""
    found: dict[str, tuple[str, list[str]]] = {}
    for r in recordings:
        for op in r.ops.values():
            for iterator, entry in (op.attrs.get(DATASET_PASSES) or {}).items():
                if isinstance(entry, dict):
                    found[iterator] = (str(entry.get("dataset")), list(entry.get("shuffles", [])))
    return found


def _seeded_passes(findings: list[OpFinding], recordings: list[Recording]) -> None:
    """In runs of one process: an iterator's read that differs where every run made a new
    iterator over one dataset object that reshuffles with a seed on every pass
    (``DATASET_PASSES``, kept where an iterator is bound): each run was the next pass, which
    comes in another order by design, while fresh processes make the same passes. A step that
    loops over such a dataset (``for x in ds``) was "NOT reproducible", blamed on the data
    (probe round 35, finding 7). A dataset built in each run is a new object whose first
    pass is the same: not this. Only where the dataset holds nothing else that makes elements
    differ (its stages read through, none found): otherwise that stays the cause, and the
    reshuffle is said besides."""
    bound = _dataset_passes(recordings)
    stages = _dataset_stages(recordings)
    for f in findings:
        if f.role != "source" or not f.op.op_type.startswith("IteratorGetNext"):
            continue
        own = bound.get(f.op.resource)
        if own is None:
            continue
        iterators = {it for it, (dataset, _) in bound.items() if dataset == own[0]}
        if len(iterators) < 2:  # one iterator, read on: not a new pass per run
            continue
        _a_seeded_pass(f, own[1], alone=stages.get(f.op.resource) == [], lead="")


def _seeded_pass_in_data(
    f: OpFinding, dataset: OpInfo, recordings: list[Recording], device: str
) -> None:
    """:func:`_seeded_passes` for a loop over a dataset inside a tf.function (the loop body is
    a tf.data function, see :func:`_written_in_data`): where the dataset it loops over was
    made before the function and reshuffles with a seed on every pass, and every run looped
    over that one object, each run was its next pass. Only where the loop body holds no random
    op and no known culprit: otherwise the body stays the cause."""

    def entry(op: OpInfo) -> dict[str, Any]:
        found = (op.attrs.get(DATASET_PASSES) or {}).get("function")
        return found if isinstance(found, dict) else {}

    own = entry(dataset)
    same = {
        str(entry(o).get("dataset"))
        for r in recordings
        for o in r.ops.values()
        if o.key == dataset.key
    }
    if not own or len(same) != 1:
        return
    random, known = _unseen_ops(dataset.attrs.get(PIPELINE_OPS, []), device)
    where = f" at {dataset.location}" if dataset.location else ""
    lead = (
        f"the variable is written inside a tf.data function ({dataset.op_type}{where}: a "
        "Python for loop over a dataset inside a tf.function), and "
    )
    alone = own.get("alone") is True and not (random or known)  # the dataset's stages too
    _a_seeded_pass(f, own.get("shuffles", []), alone=alone, lead=lead)


def _a_seeded_pass(f: OpFinding, shuffles: list[str], alone: bool, lead: str) -> None:
    """Say that every run began a new pass of a seeded reshuffle: as the cause (kind
    ``seeded pass``, not non-determinism) where nothing else in the pipeline can explain the
    difference (``alone``), else besides the cause already found."""
    passes = (
        "every run began a new pass over one dataset made before the check that reshuffles on "
        f"every pass ({'; '.join(shuffles)}): each pass comes in another order by design, while "
        "fresh processes make the same passes"
    )
    if not alone:
        f.explanation += f"; besides, {passes}"
        return
    f.kind = "seeded pass"
    f.culprit = None
    f.explanation = f"{lead}{passes}; not non-determinism, but what it feeds could not be compared"


def _explain(f: OpFinding, device: str = "") -> None:
    """Attach the knowledge-base entry, the kind and a plain-words reason. ``device`` stands
    in for the ops' own device when the run emulated another (nddebug.emulate_gpu)."""
    op = f.op
    device = device or op.device
    f.culprit = knowledge.lookup(op.op_type, device)
    if op.attrs.get(ACCUMULATED_SUM):
        # A sum grappler made one AssignAdd per term (tracer.optimized_sums): that, not a
        # kernel recorded with it, is why it varies.
        f.culprit = knowledge.by_topic(knowledge.ACCUMULATED_TOPIC) or f.culprit
    for member in op.fused.values():  # a kernel fused into this op's record may be known
        f.culprit = f.culprit or knowledge.lookup(member, device)
    if f.role == "control flow":
        f.kind = "control flow"
        f.explanation = "ran in some runs and not in others: the runs took different paths"
        return
    if f.role == "propagated":
        f.kind = f.culprit.kind if f.culprit else "numerical"
        if op.op_type == "VariableState":
            f.explanation = "the variable's value after the step: changed by the ops above"
        elif op.op_type == "Step":
            f.explanation = "a later step, after the first divergent one: it may only carry it on"
        elif op.op_type == "ReturnValue":
            f.explanation = "what the step returned: computed from the ops above"
        elif op.function or op.op_type in CALL_OPS:
            f.explanation = "a call, loop or branch: it returns what the ops inside it computed"
        elif op.op_type == "ReadVariableOp":
            f.explanation = "reads a variable that a divergent update wrote"
        elif op.resource:
            f.explanation = (
                "reads or writes state (a variable, a table, a queue) that an op above "
                "changed, or one of its inputs differs"
            )
        else:
            f.explanation = "differs because one of its inputs differs"
        return
    if f.entered and f.uncompared_inputs:
        f.kind = "other"
        f.explanation = (
            "a loop or branch whose inputs that nddebug compared were equal and whose outputs "
            "were not, with nothing inside it differing first: the difference came in through "
            "an input it cannot compare (a TensorList or another variant, a variable's handle), "
            "made before the block or outside TensorFlow"
        )
        return
    if f.entered:
        f.kind = "other"
        f.explanation = (
            "the first TensorFlow op the difference reached: its inputs already differed when "
            "they entered TensorFlow (Python or NumPy values, an attribute Python gave the op "
            "such as alpha= or strides=, file order, set or dict iteration order that depends "
            "on PYTHONHASHSEED, time)"
        ) + _chain_note(op)  # a fused Relu read the batch through its MatMul (round 43, F3)
        return
    if op.function in OPAQUE:
        _explain_opaque(f, device)
        return
    if op.function == "instrumented":
        f.kind = "uninstrumented function"
        f.explanation = (
            "a call of a function nddebug instrumented gave different outputs from identical "
            "inputs, but none of the ops recorded inside it differed: the difference arose in "
            "a part it could not record (a function traced before the block, or loaded from a "
            "SavedModel, called inside it: see the warnings)"
        )
        return
    if op.op_type == "Step":
        f.kind = "other"
        f.explanation = (
            "the op executions of this step differ (recorded as one digest per step): record "
            "this step in full to name the op — `nddebug run --bisect` does it for you"
        )
        return
    if op.op_type == "ReturnValue":
        f.kind = "other"
        f.explanation = (
            "the step's return value differs, but no traced op explains it: it was computed "
            "in Python (random, time, a file, set or dict order) or by a call nddebug could "
            "not see inside"
        )
        return
    if op.op_type == "VariableState":
        f.kind = "other"
        f.explanation = (
            "the variable's value after the step differs, but no traced op explains it: it was "
            "updated inside a function that ran uninstrumented (traced before the block, or "
            "XLA-compiled), or the runs started from different values"
        )
        return
    if op.attrs.get("races_with") and op.note == UPDATE_NOTE:
        f.culprit = None
        f.kind = "unordered updates"
        f.explanation = (
            f"updates a variable that {', '.join(op.attrs['races_with'])} also updates in the "
            "same Session.run, with no data or control dependency between them: they run in "
            "whatever order the threads take, and the value left depends on it (a float sum "
            "in another order rounds differently)"
        )
        return
    if op.attrs.get("races_with"):
        f.culprit = None
        f.kind = "race"
        f.explanation = (
            f"reads a variable that {', '.join(op.attrs['races_with'])} also writes in the same "
            "Session.run, with no data or control dependency between the two: the runs read it "
            "before and after the write"
        )
        return
    on_its_device = f.culprit is not None and f.culprit.device in (
        "any",
        knowledge.device_kind(device),
    )
    if op.note == UPDATE_NOTE and not on_its_device:
        f.culprit = None  # an entry for another device would give the wrong advice
        f.kind = "other"
        f.explanation = (
            "the update's inputs were identical but the variable it updated held a different "
            "value before: state was not restored between runs (pass it as state=) or an "
            "earlier untraced update changed it"
        )
        return
    here = knowledge.device_kind(device)
    if f.culprit is not None and here and not on_its_device and f.culprit.kind == "numerical":
        # Known on another device only: its mechanism (a GPU kernel's atomics) is not what
        # happened here, and the table's measurement on this device says it did not differ.
        f.kind = "numerical"
        f.explanation = (
            f"same inputs, different output on the {here}: a new finding. The known "
            f"non-determinism of this op is on the {f.culprit.device}"
            + (f" (measured here: {f.culprit.measured})" if f.culprit.measured else "")
            + f"; there: {f.culprit.mechanism}"
        )
    elif f.culprit is not None:
        f.kind = f.culprit.kind
        f.explanation = f.culprit.mechanism
    elif any(h in op.op_type for h in _RANDOM_HINTS) or "seed" in op.attrs:
        f.kind = "random"
        f.explanation = "a random op whose state or seed differs between runs"
    elif any(h in op.op_type for h in PIPELINE_READERS):
        f.kind = "input pipeline"
        f.explanation = "the input pipeline produced different data"
    elif op.op_type == "ReadVariableOp":
        f.kind = "other"
        f.explanation = (
            "the variable already held a different value when it was read: state carried over "
            "between runs, or changed outside the traced block"
        )
    elif op.resource:
        f.kind = "other"
        f.explanation = (
            "its tensor inputs were identical, but it also reads state through a resource "
            "handle (a variable, a lookup table, a queue), which nddebug compares only through "
            "the ops that fill it: that state already held different contents when it was "
            "read (carried over between runs, or built or changed outside the traced block)"
        )
    else:
        f.kind = "numerical"
        f.explanation = "same inputs, different output: the kernel itself is non-deterministic"
    if f.kind == "random" and op.attrs.get("seed", 0) == 0 and op.attrs.get("seed2", 0) == 0:
        f.explanation += " (this op has no seed)"
    if op.note == RECORDED_BY_CALLER:
        f.explanation += (
            " [its value is recorded where the function that returns it is called, with the "
            "call's inputs as its inputs: the difference arose in that function]"
        )
    elif op.note == ARGUMENT_BY_CALLER:
        f.explanation += (
            " [one of its inputs is an argument of its function that is recorded where the "
            "function is called, not here: the difference is in this op or in that argument]"
        )
    f.explanation += _chain_note(op)


def _chain_note(op: OpInfo) -> str:
    """What a source's explanation says of the kernels recorded with it (OpInfo.fused)."""
    if not op.fused:
        return ""
    chain = " -> ".join([*op.fused.values(), op.op_type])
    return (
        f" [recorded as one unit, {chain}: grappler rewrites these together, so nddebug "
        "does not digest between them; the difference is in one of them]"
    )
