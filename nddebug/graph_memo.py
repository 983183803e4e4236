"""Per-graph memos kept on the graph itself.

nddebug remembers, per graph, tensors it made in that graph (digests, the trace switch's read,
emulate_gpu()'s gate). In a ``weakref.WeakKeyDictionary`` keyed by the graph, each value held
its key alive through those tensors (a tensor holds its op, the op its graph), so no
instrumented graph was ever freed, nor the functions its ops keep registered: a Keras fit with
DeterminismCheck kept one rebuilt train function per check (probe round 31, F6). Kept as an
attribute of the graph, a memo is a reference cycle the garbage collector frees with it.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()


class GraphMemo:
    """A mapping from graphs to values, stored on each graph as the attribute
    ``_nddebug_<name>``: it lives exactly as long as its graph."""

    def __init__(self, name: str) -> None:
        self._attr = f"_nddebug_{name}"

    def get(self, graph: Any, default: Any = None) -> Any:
        return getattr(graph, self._attr, default)

    def setdefault(self, graph: Any, default: Any) -> Any:
        value = getattr(graph, self._attr, None)
        if value is not None:  # asked ~16 times per op of a traced function: no lock then
            return value
        with _lock:  # one step, as a dict's setdefault was
            value = getattr(graph, self._attr, None)
            if value is None:
                value = default
                setattr(graph, self._attr, value)
            return value

    def __contains__(self, graph: Any) -> bool:
        return getattr(graph, self._attr, None) is not None

    def __getitem__(self, graph: Any) -> Any:
        value = getattr(graph, self._attr, None)
        if value is None:
            raise KeyError(graph)
        return value

    def __setitem__(self, graph: Any, value: Any) -> None:
        setattr(graph, self._attr, value)
