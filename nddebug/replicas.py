"""Replicas of a tf.distribute step: which replica ran each op, and whether the replicas agree.

In synchronous data parallelism (MirroredStrategy, MultiWorkerMirroredStrategy) every replica
must hold bitwise-identical variables after the update, so one recorded step is enough to
check it: compare the replicas with each other instead of repeating the step.

Pure functions over :class:`~nddebug.recording.Recording` objects; no TensorFlow. The replica
is derived from what the tracer already records: inside ``strategy.run`` in a ``tf.function``
TensorFlow names replica k's ops ``replica_k/...`` (replica 0 has no prefix) and places them on
replica k's device; ops that run in cross-replica context (all-reduce, the optimizer's update of
each variable component) carry no prefix but run on their replica's device.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nddebug.errors import NotComparableError
from nddebug.recording import PER_REPLICA, UPDATE_NOTE, Event, OpInfo, Recording

__all__ = [
    "COLLECTIVE_OP_TYPES",
    "ReplicaConsistency",
    "ReplicaPart",
    "demote_collectives",
    "is_collective",
    "replica_consistency",
    "replica_of_ops",
    "worker_consistency",
]

#: Op types that combine or move values between replicas (tf.raw_ops, TF 2.21).
COLLECTIVE_OP_TYPES = frozenset(
    {
        "CollectiveAllToAllV2",
        "CollectiveAllToAllV3",
        "CollectiveBcastRecv",
        "CollectiveBcastRecvV2",
        "CollectiveBcastSend",
        "CollectiveBcastSendV2",
        "CollectiveGather",
        "CollectiveGatherV2",
        "CollectivePermute",
        "CollectiveReduce",
        "CollectiveReduceScatterV2",
        "CollectiveReduceV2",
        "CollectiveReduceV3",
        "NcclAllReduce",
        "NcclBroadcast",
        "NcclReduce",
    }
)
_REPLICA = re.compile(r"(?:^|/)replica_(\d+)(?=/|$)")
_NUMBERS = re.compile(r"(\d+)")


def is_collective(op_type: str) -> bool:
    """An op that exchanges values between replicas (all-reduce, all-gather, broadcast)."""
    return op_type in COLLECTIVE_OP_TYPES


def _strip(name: str) -> str:
    """An op or resource name without its ``replica_k/`` component."""
    return _REPLICA.sub("", name).lstrip("/")


def _prefix_replica(op: OpInfo) -> int | None:
    m = _REPLICA.search(op.op_name)
    return int(m.group(1)) if m else None


def replica_of_ops(rec: Recording) -> dict[int, int]:
    """The replica of every graph op that ran under a strategy with two or more replicas.

    An op named ``replica_k/...`` belongs to replica k. An unprefixed op belongs to the
    replica whose device it ran on: each replica's device is the one most of its prefixed
    ops ran on, and replica 0's is the device of the unprefixed twins of those ops. Graphs
    without ``replica_k`` ops (no strategy, or one replica) are left out.
    """
    by_graph: dict[str, list[OpInfo]] = defaultdict(list)
    for op in rec.ops.values():
        if op.graph:
            by_graph[op.graph].append(op)
    out: dict[int, int] = {}
    for ops in by_graph.values():
        prefixed = {op.op_id: k for op in ops if (k := _prefix_replica(op)) is not None}
        if not any(k > 0 for k in prefixed.values()):
            continue
        votes: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        names = {op.op_name: op for op in ops if op.op_id not in prefixed}
        for op in ops:
            k = prefixed.get(op.op_id)
            if k is None or op.op_type == "ReadVariableOp":  # reads are placed on the host
                continue
            votes[op.device][k] += 1
            twin = names.get(_strip(op.op_name))
            if twin is not None and twin.op_type == op.op_type:
                votes[twin.device][0] += 1
        device_replica = {d: max(v, key=lambda k: v[k]) for d, v in votes.items()}
        for op in ops:
            k = prefixed.get(op.op_id)
            if k is None:
                k = device_replica.get(op.device)
            if k is not None:
                out[op.op_id] = k
    return out


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in _NUMBERS.split(name)]


def _align(rec: Recording, replica: dict[int, int]) -> dict[tuple[str, ...], dict[int, int]]:
    """Group the ops that are the same op in different replicas: {group: {replica: op_id}}.

    A ``replica_k/`` op pairs with the op of the same name without the prefix. The rest (the
    collectives, the optimizer's per-device updates) pair by op type and rank in natural name
    order within their replica, where every replica has the same number of them."""
    groups: dict[tuple[str, ...], dict[int, int]] = defaultdict(dict)
    names = {(rec.ops[i].graph, rec.ops[i].op_name): i for i in replica}
    paired: set[int] = set()
    for op_id, k in replica.items():
        op = rec.ops[op_id]
        if k == 0 or _prefix_replica(op) is None:
            continue
        twin = names.get((op.graph, _strip(op.op_name)))
        if twin is not None and replica.get(twin) == 0 and rec.ops[twin].op_type == op.op_type:
            group = groups[("name", op.graph, _strip(op.op_name))]
            group[k], group[0] = op_id, twin
            paired.update((op_id, twin))
    rest: dict[tuple[str, str], dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for op_id, k in replica.items():
        op = rec.ops[op_id]
        if op_id not in paired and _prefix_replica(op) is None:
            rest[(op.graph, op.op_type)][k].append(op_id)
    n = len(set(replica.values()))
    for (graph, op_type), per in rest.items():
        if len(per) != n or len({len(v) for v in per.values()}) != 1:
            continue  # not one of each per replica: cannot be paired safely
        for k, ids in per.items():
            ids.sort(key=lambda i: _natural(rec.ops[i].op_name))
            for rank, op_id in enumerate(ids):
                groups[("rank", graph, op_type, str(rank))][k] = op_id
    return {g: m for g, m in groups.items() if len(m) == n}


@dataclass
class ReplicaPart:
    """An op whose replicas computed different outputs from identical inputs."""

    op: OpInfo  # replica 0's op
    op_names: list[str]  # per replica
    kind: str
    explanation: str
    seq: int  # replica 0's execution order
    advice: str = ""


@dataclass
class ReplicaConsistency:
    """Whether every replica ended the step with the same variables, and if not, why.

    ``consistent`` is True only when every variable update was paired across replicas and all
    pairs agree bit for bit; ``unpaired`` lists updates that could not be compared."""

    replicas: int
    consistent: bool
    updates_compared: int
    variables: list[str] = field(default_factory=list)  # variables whose replicas differ
    sources: list[ReplicaPart] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)
    unit: str = "replica"  # or "worker": what was compared with what

    def __bool__(self) -> bool:
        return self.consistent

    def __str__(self) -> str:
        u = self.unit
        head = f"{self.replicas} {u}s, {self.updates_compared} variable updates compared: "
        if self.consistent:
            return head + f"consistent (every {u} holds the same variables)"
        lines = [head + ("INCONSISTENT" if self.variables else "not fully compared")]
        for v in self.variables:
            lines.append(f"  variable differs between {u}s: {v}")
        for s in self.sources:
            lines.append(
                f"  {u}s part at {s.op.op_type} {s.op.op_name} [{s.kind}]"
                f"{' at ' + s.op.location if s.op.location else ''}: {s.explanation}"
            )
            if s.advice:
                lines.append(f"    fix: {s.advice}")
        for u in self.unpaired:
            lines.append(f"  not compared (no counterpart in every {self.unit}): {u}")
        return "\n".join(lines)


def _variable(op: OpInfo) -> str:
    name = op.resource.split(":", 1)[-1] if op.resource else op.op_name
    return f"the variable captured as {_strip(name)}, updated by {_strip(op.op_name)}"


def replica_consistency(recording: Recording) -> ReplicaConsistency:
    """Compare the replicas of one recorded step with each other (no repeat needed).

    Every variable update must leave the same value in every replica. Where they part, walk
    back from the differing updates through ops whose replicas differ, following each input
    to the op that produced it, and name the ops whose replicas had identical inputs but
    different outputs: a per-replica unseeded random op, a reduction whose order differs per
    replica, a collective that gave the replicas different results.
    """
    if not isinstance(recording, Recording):
        raise TypeError(f"replica_consistency() takes a Recording, got {type(recording).__name__}")
    replica = replica_of_ops(recording)
    if len(set(replica.values())) < 2:
        # A step whose function was traced before the block ran uninstrumented: its replicas'
        # ops are not in the recording, and its own warning says why (probe round 36).
        unseen = [w for w in recording.warnings if "ran uninstrumented" in w][:1]
        raise NotComparableError(
            "the recording has no replicas to compare: trace a step that calls strategy.run "
            "inside a tf.function under a tf.distribute strategy with two or more devices"
            + (f" (the recording says: {unseen[0]})" if unseen else "")
        )
    return _consistency(recording, replica, _align(recording, replica))


def worker_consistency(recordings: list[Recording]) -> ReplicaConsistency:
    """Compare the workers of one multi-worker step with each other: one recording per worker
    process, in worker order (what ``nddebug run --workers N`` records).

    Each worker runs the same program, so its ops pair with the other workers' by their key
    and execution count; its call units by their position. Then as
    :func:`replica_consistency`, with a worker as a replica: every worker must end the step
    with the same variables, and where they part the source is named."""
    if len(recordings) < 2:
        raise NotComparableError("worker_consistency() needs the recordings of 2 or more workers")
    merged = Recording(digest_algorithm=recordings[0].digest_algorithm)
    replica: dict[int, int] = {}
    groups: dict[tuple[str, ...], dict[int, int]] = defaultdict(dict)
    stride = 1 + max(max((*r.ops, *(e.seq for e in r.events), 0)) for r in recordings)
    for k, rec in enumerate(recordings):
        # Call units by position: the seq of a worker's n-th top-level op becomes n.
        calls = {e.seq: i for i, e in enumerate(e for e in rec.events if e.call == e.seq)}
        for op_id, op in rec.ops.items():
            merged.ops[k * stride + op_id] = dataclasses.replace(op, op_id=k * stride + op_id)
            replica[k * stride + op_id] = k
            groups[("key", op.key)][k] = k * stride + op_id
        for e in rec.events:
            merged.events.append(
                dataclasses.replace(
                    e,
                    seq=k * stride + e.seq,
                    op_id=k * stride + e.op_id,
                    call=calls.get(e.call, -1),
                )
            )
    n = len(recordings)
    paired = {g: m for g, m in groups.items() if len(m) == n}
    return _consistency(merged, replica, paired, member="worker")


def _consistency(
    recording: Recording,
    replica: dict[int, int],
    groups: dict[tuple[str, ...], dict[int, int]],
    member: str = "replica",
) -> ReplicaConsistency:
    """The comparison behind :func:`replica_consistency` and :func:`worker_consistency`."""
    from nddebug import knowledge
    from nddebug.analysis import OpFinding, _explain

    n = len(set(replica.values()))
    group_of = {op_id: g for g, m in groups.items() for op_id in m.values()}

    # Executions per (call, group, occurrence) and replica.
    execs: dict[tuple[int, tuple[str, ...], int], dict[int, Event]] = defaultdict(dict)
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for ev in recording.events:
        g = group_of.get(ev.op_id)
        if g is None:
            continue
        occ = counts[(ev.call, ev.op_id)]
        counts[(ev.call, ev.op_id)] += 1
        execs[(ev.call, g, occ)][replica[ev.op_id]] = ev

    def parted(unit: dict[int, Event]) -> bool:
        return len(unit) == n and len({tuple(map(_t, e.digests)) for e in unit.values()}) > 1

    unpaired = sorted(
        {
            f"{op.op_type} {op.op_name}"
            for op_id, op in recording.ops.items()
            if op.note == UPDATE_NOTE
            and op_id in replica
            and op_id not in group_of
            and not op.attrs.get(PER_REPLICA)
        }
    )
    updates = [
        u
        for u in execs.items()
        if recording.ops[_first(u[1]).op_id].note == UPDATE_NOTE
        # Per replica by design (synchronization=ON_READ: a metric's totals): not compared.
        and not recording.ops[_first(u[1]).op_id].attrs.get(PER_REPLICA)
    ]
    # Paired ops, but an execution that ran in only some replicas.
    partial = [recording.ops[_first(unit).op_id] for _, unit in updates if len(unit) != n]
    unpaired += sorted({f"{op.op_type} {_strip(op.op_name)}" for op in partial})
    updates = [u for u in updates if len(u[1]) == n]
    differing = [u for u in updates if parted(u[1])]
    variables = sorted({_variable(recording.ops[u[1][0].op_id]) for u in differing})

    # Producer of a digest within a replica and call: the latest earlier event that output it.
    producers: dict[tuple[int, int, tuple[int, int]], list[Event]] = defaultdict(list)
    unit_of: dict[int, tuple[int, tuple[str, ...], int]] = {}
    for key, unit in execs.items():
        for ev in unit.values():
            unit_of[ev.seq] = key
            for d in ev.digests:
                if d is not None:
                    producers[(replica[ev.op_id], ev.call, _t(d))].append(ev)

    def producer_units(ev: Event) -> Iterable[tuple[int, tuple[str, ...], int]]:
        for d in ev.inputs or []:
            cands = [
                p for p in producers.get((replica[ev.op_id], ev.call, _t(d)), []) if p.seq < ev.seq
            ]
            if cands:
                yield unit_of[max(cands, key=lambda p: p.seq).seq]

    sources: dict[tuple[str, ...], tuple[int, dict[int, Event], bool]] = {}
    seen: set[tuple[int, tuple[str, ...], int]] = set()
    stack = [key for key, _ in differing]
    while stack:
        key = stack.pop()
        if key in seen:
            continue
        seen.add(key)
        unit = execs[key]
        ins = [None if e.inputs is None else tuple(map(_t, e.inputs)) for e in unit.values()]
        upstream = {p for e in unit.values() for p in producer_units(e) if parted(execs[p])}
        # An all-reduce exists to give every replica the same result: if its outputs part,
        # it is where the replicas part, whatever its (per-replica) inputs were.
        collective = is_collective(recording.ops[unit[0].op_id].op_type)
        if collective or (None not in ins and len(set(ins)) == 1) or not upstream:
            # Same inputs, different outputs; or inputs that differ where no traced op of
            # the replicas made them differ (they entered the step apart).
            entered = not collective and not (None not in ins and len(set(ins)) == 1)
            if key[1] not in sources or sources[key[1]][0] > unit[0].seq:
                sources[key[1]] = (unit[0].seq, unit, entered)
            continue
        stack.extend(upstream)

    parts = []
    for seq, unit, entered in sorted(sources.values(), key=lambda s: s[0]):
        op = recording.ops[unit[0].op_id]
        finding = OpFinding(
            key=op.key,
            op=op,
            role="source",
            kind="",
            first_seq=seq,
            runs_differing=n - 1,
            distinct_outputs=len({tuple(map(_t, e.digests)) for e in unit.values()}),
            executions=1,
            divergent_executions=1,
        )
        finding.entered = entered
        _explain(finding)
        advice = finding.culprit.fix if finding.culprit else knowledge.advice(finding.kind)
        if entered:
            finding.explanation = (
                f"its inputs already differed between {member}s where they entered the step "
                f"(per-{member} values from outside the traced ops, or variables that held "
                "different values before the step)"
            )
            advice = (
                f"Find the per-{member} value that reaches this op: a Python number or constant "
                f"that depends on the {member} (task index, device), per-{member} data used after "
                "the all-reduce, or variables that started apart (create them under the "
                "strategy's scope, so that every replica starts from the same value)."
            )
        if op.note == UPDATE_NOTE and finding.kind == "other":
            finding.explanation = (
                f"the update's inputs were identical in every {member}, but the variable held a "
                f"different value in each before it: the {member}s started the step apart"
            )
        if is_collective(op.op_type) and finding.kind != "collective":
            finding.kind = "collective"
        parts.append(
            ReplicaPart(
                op=op,
                op_names=[recording.ops[unit[k].op_id].op_name for k in sorted(unit)],
                kind=finding.kind,
                explanation=finding.explanation,
                seq=seq,
                advice=advice,
            )
        )
    return ReplicaConsistency(
        unit=member,
        replicas=n,
        consistent=not differing and not unpaired and bool(updates),
        updates_compared=len(updates),
        variables=variables,
        sources=parts,
        unpaired=unpaired if updates else [*unpaired, "no variable update was recorded"],
    )


def _t(d: Any) -> Any:
    return tuple(d) if d is not None else None


def _first(unit: dict[int, Event]) -> Event:
    return unit[min(unit)]


def demote_collectives(
    findings: list[Any], recordings: list[Recording], per_run_units: list[dict[Any, Event]]
) -> None:
    """A collective's recorded inputs are only its own replica's contribution, so identical
    inputs do not make it a source when another replica's contribution differed: a
    collective is a source only if every collective of its call had identical inputs in
    every run (then the exchange itself gave a different result)."""
    ops = recordings[0].ops
    for f in findings:
        if f.role != "source" or not is_collective(f.op.op_type):
            continue
        calls = {u[0] for u in f.units}
        for u, ev in per_run_units[0].items():
            if u[0] not in calls or not is_collective(ops[ev.op_id].op_type):
                continue
            ins = {
                None if pu.get(u) is None or pu[u].inputs is None else tuple(map(_t, pu[u].inputs))
                for pu in per_run_units
            }
            if len(ins) > 1 or None in ins:
                f.role = "propagated"
                break
