"""Process-wide tracer state: the table of instrumented graph ops, the switch that tells
instrumented graphs whether a ``trace()`` block is recording, and the re-entrancy guard."""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from nddebug.graph_memo import GraphMemo
from nddebug.recording import OpInfo
from nddebug.switch import Switch


class OpRegistry:
    """Process-wide table of instrumented graph ops: graphs traced once are run many times,
    possibly under several ``trace()`` blocks, so their op ids must outlive any one of them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: dict[int, OpInfo] = {}
        self._ids = itertools.count()
        self.instrumented_functions: set[str] = set()
        # Function name -> the positions of the arguments its body never reads (see
        # instrument.unused_arguments).
        self.unused_arguments: dict[str, frozenset[int]] = {}
        # Function name -> its outputs (by position) that its callers record: values grappler
        # may rewrite with their reader in the caller (instrument.finish_graph).
        self.returned_deferred: dict[str, dict[int, Any]] = {}
        # Function name -> its arguments (by position) that it leaves to its callers' records,
        # with the op type and input position of the one op inside that reads each: the
        # caller folds the argument's own inputs into the call's record where grappler may
        # rewrite its producer with that reader (instrument.note_arguments_left).
        self.arguments_left: dict[str, dict[int, tuple[str, int]]] = {}
        # Function name -> the key of its graph (instrument.graph_key): a call op names the
        # graph whose ops it runs (OpInfo.attrs["callee_key"]), for the analysis of the ops
        # that leave an argument to the call's record.
        self.function_keys: dict[str, str] = {}
        # Forward function of a gradient ("__forward_<name>") -> how many of its outputs the
        # function itself returns; the others are intermediates for the backward function.
        self.forward_outputs: dict[str, int] = {}
        self.xla_graphs: weakref.WeakSet[Any] = weakref.WeakSet()  # seen, not instrumented
        # Names of graphs compiled by XLA (traced in an XLA context, or made into a function
        # with _XlaMustCompile): their backward graphs, "__backward_<name>_<uid>", are too.
        self.xla_graph_names: set[str] = set()
        self.xla_functions: set[str] = set()  # concrete functions made of an XLA graph
        # Python name of an XLA-compiled function -> its branch and loop-body graphs.
        self.xla_nested: dict[str, set[str]] = {}
        # Instrumented function -> what it cannot compare (NOT_COMPARED warnings), said again
        # in every run that calls it.
        self.blind_spots: dict[str, list[str]] = {}
        # (instrumented function, such a warning about the variables an opaque call in it
        # writes) -> those variables, as OpInfo.resource names them: check() compares a
        # variable it holds after every run (VariableState), and a warning whose variables
        # all were is dropped from that run.
        self.blind_variables: dict[tuple[str, str], frozenset[str]] = {}
        # Instrumented function -> the XLA-compiled functions it calls (opaque.xla_called).
        self.xla_called: dict[str, set[str]] = {}
        # per graph: output tensor (by name) -> digest tensor [2] (or None if unreadable)
        self.graph_digests = GraphMemo("digests")
        self.graph_keys: weakref.WeakKeyDictionary[Any, dict[str, int]] = (
            weakref.WeakKeyDictionary()
        )
        # Graph ops instrumented for rerun mode: op id -> (number of copies, whether the host
        # gets the tensors themselves rather than digests and sliced bytes).
        self.reruns: dict[int, tuple[int, bool]] = {}

    def new_id(self) -> int:
        return next(self._ids)

    def graph_cache(self, graph: Any) -> dict[str, Any]:
        """Per-graph memo of what instrumentation built (digest tensors, gate, rerun copies)."""
        return self.graph_digests.setdefault(graph, {})


REGISTRY = OpRegistry()
_local = threading.local()


def busy() -> bool:
    """Whether this thread is inside nddebug's own TF calls (their ops are not recorded)."""
    return getattr(_local, "busy", False)


@contextlib.contextmanager
def inside_nddebug() -> Iterator[None]:
    prev = busy()
    _local.busy = True
    try:
        yield
    finally:
        _local.busy = prev


_GATE = Switch("trace")


def set_gate(on: bool) -> None:
    """Switch every instrumented graph's digests on (a trace block starts) or off: outside
    trace() an instrumented function that runs without a plain twin (nddebug.tracer.plain)
    skips the heavy part of its digests."""
    _GATE.set(on)


def graph_gate(graph: Any) -> Any:
    """The gate as int32 0/1, read once per graph (per loop iteration in a loop body)."""
    import tensorflow as tf
    from tensorflow.python.framework import ops as tf_ops

    cache = REGISTRY.graph_cache(graph)
    if "<gate>" not in cache:
        if not tf_ops.executing_eagerly_outside_functions():
            # A TF1 graph runs its digests only when Session.run fetches their records, which
            # nddebug does inside a trace() block only: no gate (nor an eager variable) needed.
            cache["<gate>"] = tf.constant(1, tf.int32)
        else:
            cache["<gate>"] = _GATE.read(graph)
    return cache["<gate>"]
