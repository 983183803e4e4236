"""Sums that grappler's memory optimizer turned into accumulations in the traced step.

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

from nddebug.recording import Recording
from nddebug.tracer import ops

#: Function name -> the sums grappler's memory optimizer rewrote in it (checked once per
#: process: a function is optimized once, when it is first called).
_REWRITTEN: dict[str, tuple[str, ...]] = {}
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
        found = _collected(ctx)
    with _LOCK:
        _REWRITTEN[name] = found
    return out


def _collected(ctx: Any) -> tuple[str, ...]:
    """The rewritten sums in the graphs collected since graph collection was turned on, which
    this turns off. Never raises: a failure here must not replace the call's own result."""
    try:
        metadata = ctx.export_run_metadata()
    except Exception:  # noqa: BLE001 - nothing collected: nothing to say
        metadata = None
    try:
        ctx.disable_graph_collection()
    except Exception:  # noqa: BLE001
        pass
    return rewritten_sums(metadata) if metadata is not None else ()


def note(recording: Recording, name: str) -> None:
    """Say in ``recording``'s warnings which sums of function ``name`` were accumulated."""
    found = _REWRITTEN.get(name, ())
    if not found:
        return
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    ops.warn_once(
        recording,
        f"Grappler's memory optimizer rewrote {len(found)} sum(s) of more than two tensors in "
        f"{ops.function_name(name)} ({shown}) into a temporary variable and one AssignAdd per "
        "term, because its static estimate of peak memory was near the device's (on the CPU "
        "TensorFlow reports 256 MiB). Those terms are added in the order they arrive. Which "
        "sums it rewrites depends on the whole graph, and nddebug's ops change it: the "
        "untraced step may add other sums this way, or none, so its bits can differ from the "
        "traced step's. The verdict is about the traced step.",
    )
