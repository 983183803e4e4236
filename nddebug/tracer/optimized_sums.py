"""Sums that grappler's optimized traced step adds otherwise than the untraced one.

Read from the optimized graphs of an instrumented function's first call: sums its memory
optimizer turned into accumulations (below), and merged sums that may take over another
term's buffer (:func:`reordered_sums`).

Where grappler's static estimate of a function's peak memory exceeds 80% of the device's
memory (on the CPU TensorFlow reports 256 MiB, so the threshold is ~215 MB: common for real
training steps), its memory optimizer (``SchedulingPass`` in memory_optimizer.cc) rewrites
each ``AddN`` of more than two tensors that are live at that peak into a temporary variable
and one locked ``AssignAdd`` per term. The terms are then added in the order they arrive,
which can differ from run to run, and in another order than the ``AddN`` kernel would.

Which sums it rewrites depends on the whole graph's memory profile, and nddebug's records
change that profile: the traced step may accumulate sums that the untraced step adds with
``AddN``, or the other way round (keras.applications ResNet50 and ResNet50V2 on the CPU).
nddebug cannot make the choice the same, so it says so: the first call of each instrumented
function in a trace has TensorFlow collect its optimized partition graphs (graph collection,
exported with the run metadata), and a rewritten sum is named in the recording's warnings,
next to the verdict.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from nddebug.recording import ACCUMULATED_SUM, Recording
from nddebug.tracer import ops

#: Function name -> the sums grappler's memory optimizer rewrote in it (checked once per
#: process: a function is optimized once, when it is first called).
_REWRITTEN: dict[str, tuple[str, ...]] = {}
#: Function name -> its sums of three or more terms that may take over another term's buffer
#: than in the plain program (see :func:`reordered_sums`).
_REORDERED: dict[str, tuple[str, ...]] = {}
_LOCK = threading.Lock()
#: The name grappler gives the temporary variable of a rewritten AddN named ``n``.
_SUFFIX = "/tmp_var"


def rewritten_sums(run_metadata: Any) -> tuple[str, ...]:
    """The AddN nodes the memory optimizer rewrote, by name, in the partition graphs of a
    RunMetadata: each left a ``TemporaryVariable`` named ``<AddN>/tmp_var``."""
    names = set()
    for fg in getattr(run_metadata, "function_graphs", ()):
        for graph in fg.partition_graphs:
            for node in graph.node:
                if node.op == "TemporaryVariable" and node.name.endswith(_SUFFIX):
                    names.add(node.name[: -len(_SUFFIX)])
    return tuple(sorted(names))


def reordered_sums(run_metadata: Any) -> tuple[str, ...]:
    """The sums of three or more terms (``AddN``, most made by grappler's AddOpsRewrite from a
    chain of adds) that may add their terms in another order traced than untraced.

    TensorFlow's AddN kernel takes over the buffer of the first term that nothing else holds
    and adds the others to it, so the order it sums in depends on which terms are free when
    it starts; with three or more terms that order changes the bits (taking over the second
    term instead of the first does not: a + b is b + a). A record of nddebug reading a term
    holds it until the record has run. nddebug has each sum read its terms through
    Identities that wait for those records (instrument.digests_first), which grappler
    removes after merging a chain of adds, handing their waits to the merged AddN; this
    check is the net for the records that ordering misses (a term taken from a caller, a
    record in another graph). Without that ordering, ``h + h * 0.5 + tanh(h)`` took over
    another term traced than plain (582 of 1,024 gradient elements a few ULPs away).

    Read from the optimized graphs: a term is free when every other reader of it is among
    the sum's ancestors (it has run), in the program without nddebug's ops and with them; a
    sum is named where the first free term differs beyond that swap."""
    from nddebug.tracer.unneeded import is_ours_name

    found = set()
    for fg in getattr(run_metadata, "function_graphs", ()):
        for graph in fg.partition_graphs:
            nodes = {n.name: n for n in graph.node}
            readers: dict[str, list[tuple[str, bool]]] = {}  # node -> (reader, is ours)
            for n in graph.node:
                mine = n.op.startswith("Nddebug") or is_ours_name(n.name)
                for x in n.input:
                    if not x.startswith("^"):
                        readers.setdefault(x.split(":")[0], []).append((n.name, mine))
            for n in graph.node:
                if n.op != "AddN" or is_ours_name(n.name):
                    continue
                terms = [x.split(":")[0] for x in n.input if not x.startswith("^")]
                if len(terms) < 3 or not any(m for t in terms for _, m in readers.get(t, ())):
                    continue
                wanted = {r for t in terms for r, _ in readers.get(t, ()) if r != n.name}
                before = _ancestors(nodes, n, wanted)
                plain = [
                    all(r in before for r, m in readers.get(t, ()) if r != n.name and not m)
                    for t in terms
                ]
                traced = [
                    free and all(r in before for r, m in readers.get(t, ()) if m)
                    for t, free in zip(terms, plain, strict=True)
                ]
                if _taken(plain) != _taken(traced):
                    found.add(n.name)
    return tuple(sorted(found))


def _taken(free: list[bool]) -> int | None:
    """The term an AddN takes over, as far as its order goes: None where it sums in the
    order of its inputs (no term free, or the first or second)."""
    first = next((i for i, f in enumerate(free) if f), None)
    return None if first is None or first < 2 else first


def _ancestors(nodes: dict[str, Any], node: Any, wanted: set[str]) -> set[str]:
    """Those of ``wanted`` that ``node`` waits for (through data or control edges); the
    search stops once all are found."""
    seen: set[str] = set()
    hit: set[str] = set()
    stack = [node]
    while stack and hit != wanted:
        for x in stack.pop().input:
            name = x.lstrip("^").split(":")[0]
            if name in seen:
                continue
            seen.add(name)
            if name in wanted:
                hit.add(name)
            if name in nodes:
                stack.append(nodes[name])
    return hit


def call_and_check(name: str, call: Callable[[], Any]) -> Any:
    """Run an instrumented function's call; on its first call in this process, collect the
    graphs of that call (its optimization happens then) and note what was rewritten."""
    with _LOCK:
        first = name not in _REWRITTEN
        if first:
            _REWRITTEN[name] = ()
    if not first:
        return call()
    from tensorflow.python.eager import context

    ctx = context.context()
    try:
        # Graphs only (the optimized partition graphs, stored when the function is
        # instantiated): no per-op step statistics, as run metadata would collect.
        ctx.enable_graph_collection()
    except Exception:  # noqa: BLE001 - no context yet: nothing to check, run the call
        return call()
    try:
        out = call()
    finally:
        found, reordered = _collected(ctx)
    with _LOCK:
        _REWRITTEN[name] = found
        _REORDERED[name] = reordered
    return out


def _collected(ctx: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The rewritten sums, and the sums that may be reordered, in the graphs collected since
    graph collection was turned on, which this turns off. Never raises: a failure here must
    not replace the call's own result."""
    try:
        metadata = ctx.export_run_metadata()
    except Exception:  # noqa: BLE001 - nothing collected: nothing to say
        metadata = None
    try:
        ctx.disable_graph_collection()
    except Exception:  # noqa: BLE001
        pass
    if metadata is None:
        return (), ()
    try:
        return rewritten_sums(metadata), reordered_sums(metadata)
    except Exception:  # noqa: BLE001 - a graph it cannot read: nothing to say
        return (), ()


def note(recording: Recording, name: str) -> None:
    """Say in ``recording``'s warnings which sums of function ``name`` were accumulated, and
    which may be summed in another order than in the plain program."""
    reordered = _REORDERED.get(name, ())
    if reordered:
        shown = ", ".join(reordered[:3]) + (
            f" and {len(reordered) - 3} more" if len(reordered) > 3 else ""
        )
        ops.warn_once(
            recording,
            f"{len(reordered)} sum(s) of three or more terms in {ops.function_name(name)} "
            f"({shown}) may add their terms in another order than the untraced step: "
            "TensorFlow's AddN adds the others to the first term whose buffer nothing else "
            "holds, and nddebug's records may still hold one when the sum runs. "
            "Their last bits, and what follows from them, can differ from the untraced "
            "step's; the verdict is about the traced step.",
        )
    found = _REWRITTEN.get(name, ())
    if not found:
        return
    mark_accumulated(recording, ops.function_name(name), found)
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    ops.warn_once(
        recording,
        f"Grappler's memory optimizer rewrote {len(found)} sum(s) of more than two tensors in "
        f"{ops.function_name(name)} ({shown}) into a temporary variable and one AssignAdd per "
        "term, because its static estimate of peak memory was near the device's (on the CPU "
        "TensorFlow reports 256 MiB). Those terms are added in the order they arrive, which "
        "varies from call to call: each such sum is a risk, whether or not these runs showed "
        "it. Which sums it rewrites depends on the whole graph, and nddebug's ops change it: "
        "the untraced step may add other sums this way, or none, so its bits can differ from "
        "the traced step's.",
    )


#: What grappler puts between a merged sum's scope and the name of the chain's last add.
_MERGED = "ArithmeticOptimizer/AddOpsRewrite_"


def mark_accumulated(recording: Recording, function: str, names: tuple[str, ...]) -> None:
    """Mark the recorded ops of ``function`` that the rewritten sums ``names`` (partition-graph
    names) came from, with ``ACCUMULATED_SUM``: a sum added in arrival order is a known
    non-deterministic construct (risks, explanations), not only a difference from the
    untraced step. ResNet50V2's train step was "reproducible" in 2 repeats while 3 of 40
    plain steps from one state differed, and when the repeats caught it the sum was explained
    by a convolution recorded with it (probe round 39).

    A partition graph names a node of the function as the function does, a node of a
    function inlined into it behind the call's name, and a merged chain of adds after its
    last add: a sum is the recorded op (or a kernel recorded with it) whose name ends the
    sum's, else, for those inlined, whose last part is the sum's."""
    wanted = [n.replace(_MERGED, "") for n in names]
    mine = [
        op
        for op in recording.ops.values()
        if op.graph == function or op.graph.startswith(function + "/")
    ]

    def matches(member: str, name: str, exact: bool) -> bool:
        if exact:
            return name == member or name.endswith("/" + member)
        return member.rsplit("/", 1)[-1] == name.rsplit("/", 1)[-1]

    for exact in (True, False):
        found = False
        for op in mine:
            members = [op.op_name, *(k.removeprefix(op.graph + "/") for k in op.fused)]
            hit = sorted({m for m in members for n in wanted if matches(m, n, exact)})
            if hit:
                op.attrs[ACCUMULATED_SUM] = hit
                found = True
        if found:
            return
