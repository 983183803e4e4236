"""TF1 graphs run by ``tf.compat.v1.Session.run``.

A TF1 graph runs only what a ``Session.run`` fetches, so instrumenting its ops as they are
created (as for a ``tf.function``) would record nothing. Instead each ``Session.run`` inside a
``trace()`` block instruments the ops it is about to execute (whether the graph was built in
the block or before it), adds their record ops to the run's targets, and so one run delivers
every op execution it made; the run itself is the top-level unit its ops belong to.

It also finds what bit-exactness cannot survive in a TF1 graph: a variable read and a write of
the same variable in one run with no data or control path between them (the executor may run
either first), and two writes of one variable with none (the value left depends on their
order: float sums round differently). Such an op carries ``races_with`` and the recording says
so; the report counts it among the risks, so that runs in which the race did not show are not
called reproducible.
"""

from __future__ import annotations

import threading
from typing import Any

from nddebug.graph_memo import GraphMemo
from nddebug.recording import NOT_COMPARED, Event, OpInfo
from nddebug.tracer import instrument, ops
from nddebug.tracer.location import eager_location
from nddebug.tracer.registry import REGISTRY, busy, inside_nddebug

# Per graph: op name -> the record ops of its instrumentation (empty when nothing is recorded).
_SENDS = GraphMemo("session_sends")
_local = threading.local()  # in_run: inside a Session.run that nddebug records


class SessionHook:
    """Wraps ``BaseSession.run`` while a block records."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self._original: Any = None

    def install(self) -> None:
        from tensorflow.python.client import session

        original = session.BaseSession.run
        hook = self

        def run(
            sess: Any, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata=None
        ) -> Any:
            if busy():
                return original(sess, fetches, feed_dict, options, run_metadata)
            return hook.run(original, sess, fetches, feed_dict, options, run_metadata)

        original_call = session.BaseSession._Callable.__call__
        original_sessionrun = session.BaseSession._call_tf_sessionrun

        def not_recorded() -> None:
            ops.warn_once(
                hook.recorder.recording,
                f"{NOT_COMPARED}a Session callable (Session.make_callable without feed_list, "
                "TF1 Keras backend functions) ran: its ops are not recorded. Call Session.run "
                "instead while debugging.",
            )

        def call(callable_: Any, *args: Any, **kwargs: Any) -> Any:
            if not busy():
                not_recorded()
            return original_call(callable_, *args, **kwargs)

        def sessionrun(sess: Any, *args: Any, **kwargs: Any) -> Any:
            # Session.run reaches this too, but only nddebug's own run() sets the flag.
            if not busy() and not getattr(_local, "in_run", False):
                not_recorded()
            return original_sessionrun(sess, *args, **kwargs)

        self._original = (original, original_call, original_sessionrun)
        session.BaseSession.run = run
        session.BaseSession._Callable.__call__ = call
        session.BaseSession._call_tf_sessionrun = sessionrun

    def uninstall(self) -> None:
        from tensorflow.python.client import session

        if self._original is not None:
            (
                session.BaseSession.run,
                session.BaseSession._Callable.__call__,
                session.BaseSession._call_tf_sessionrun,
            ) = self._original
            self._original = None

    def run(
        self,
        original: Any,
        sess: Any,
        fetches: Any,
        feed_dict: Any,
        options: Any,
        run_metadata: Any,
    ) -> Any:
        rec = self.recorder
        graph = sess.graph
        sends: list[Any] = []
        with inside_nddebug():
            try:
                if rec.rerun:
                    ops.warn_once(
                        rec.recording,
                        f"{NOT_COMPARED}rerun mode does not re-execute the ops of TF1 "
                        "Session.run calls: trace them without rerun= (repeated runs or "
                        "`nddebug run -n N`).",
                    )
                else:
                    executed = closure(graph, fetches, feed_dict)
                    reads, writes, followed = unordered_accesses(executed)
                    # Updates another update of the same variable follows: nothing new can
                    # order the read of the value after them before it (instrument.OVERWRITTEN).
                    cache = REGISTRY.graph_cache(graph)
                    cache.setdefault(instrument.OVERWRITTEN, set()).update(followed)
                    sends = self._instrument(graph, executed)
                    self._note_races(graph, reads, writes)
            except Exception as exc:  # noqa: BLE001 - never break the user's program
                ops.warn_once(
                    rec.recording,
                    f"{NOT_COMPARED}could not instrument a Session.run of a TF1 graph "
                    f"({type(exc).__name__}: {exc}): its ops are not recorded.",
                )
                sends = []
        _local.in_run = True
        try:
            if sends:
                result = original(sess, [fetches, sends], feed_dict, options, run_metadata)[0]
            else:
                result = original(sess, fetches, feed_dict, options, run_metadata)
        finally:
            _local.in_run = False
        with inside_nddebug():
            rec.drain()
            self._record_run(fetches)
        return result

    def _instrument(self, graph: Any, executed: list[Any]) -> list[Any]:
        import tensorflow as tf

        rec = self.recorder
        sends = _SENDS.setdefault(graph, {})
        targets: list[Any] = []
        with graph.as_default():
            for op in executed:
                if op.name not in sends:
                    sent = instrument.instrument_op(
                        rec, op.type, list(op.inputs), attrs_of(op), list(op.outputs), op.name,
                        graph,
                    )  # fmt: skip
                    sends[op.name] = [] if sent is None else [sent]
                    if any(t.dtype._is_ref_dtype for t in [*op.inputs, *op.outputs]):
                        ops.warn_once(
                            rec.recording,
                            f"{NOT_COMPARED}the graph uses reference variables (TF1 "
                            "tf.Variable without use_resource): their updates are compared "
                            "only through the reads that follow them. "
                            "tf.compat.v1.enable_resource_variables() compares each update.",
                        )
                targets += sends[op.name]
        calls = [op for op in executed if _calls_function(op)]
        if calls:
            writes = any(t.dtype == tf.resource for op in calls for t in op.inputs)
            ops.warn_once(
                rec.recording,
                (NOT_COMPARED if writes else "")
                + f"{len(calls)} op(s) of the TF1 graph run functions ("
                + ", ".join(sorted({op.type for op in calls}))
                + "; tf.cond / tf.while_loop bodies, function calls): they are compared at "
                "their outputs, their inner ops are not recorded"
                + (", nor the variables they can write." if writes else "."),
            )
        return targets

    def _note_races(
        self, graph: Any, reads: dict[Any, list[Any]], writes: dict[Any, list[Any]]
    ) -> None:
        """Name every read of a variable that no path orders with a write of it in this run,
        and every write that no path orders with another write of it (see
        :func:`unordered_accesses`)."""
        rec = self.recorder
        for op, others in [*reads.items(), *writes.items()]:
            names = sorted(w.name for w in others)
            for info in REGISTRY.ops.values():
                if info.op_name == op.name and info.graph == instrument.graph_name(graph):
                    info.attrs["races_with"] = names
            if op in reads:
                text = (
                    f"{op.name} reads a variable that {', '.join(names)} also writes in the "
                    "same Session.run with nothing ordering them: the read can see the value "
                    "before or after the write."
                )
            else:
                text = (
                    f"{op.name} and {', '.join(names)} update the same variable in the same "
                    "Session.run with nothing ordering them: the value left depends on the "
                    "order they run in."
                )
            if op in reads or op.name < names[0]:  # updates that race: said once, by the first
                ops.warn_once(rec.recording, text)

    def _record_run(self, fetches: Any) -> None:
        """The run itself, as the top-level unit of the op executions it delivered."""
        rec = self.recorder
        location, site = eager_location(rec.lib_dirs)
        key = f"session:Session.run@{site}"
        op_id = rec.eager_sites.get(key)
        if op_id is None:
            op_id = REGISTRY.new_id()
            rec.eager_sites[key] = op_id
            rec.recording.ops[op_id] = OpInfo(
                op_id=op_id,
                key=key,
                op_type="Session.run",
                op_name=", ".join(_fetch_names(fetches))[:200],
                graph="",
                device="",
                location=location,
                dtypes=[],
                shapes=[],
                digestible=[],
                stateful=True,
            )
        seq = rec.next_seq()
        rec.append(Event(seq=seq, op_id=op_id, call=seq, digests=[]), call_device="")


def attrs_of(op: Any) -> dict[str, Any]:
    """An op's attributes as the op callback gives them (name -> Python value)."""
    out = {}
    for name in op.node_def.attr:
        try:
            out[name] = op.get_attr(name)
        except Exception:  # noqa: BLE001 - an attribute TF cannot convert is not needed
            continue
    return out


def _calls_function(op: Any) -> bool:
    from tensorflow.core.framework import attr_value_pb2

    def has_func(value: attr_value_pb2.AttrValue) -> bool:
        return value.HasField("func") or any(True for _ in value.list.func)

    return any(has_func(v) for v in op.node_def.attr.values())


def _graph_elements(graph: Any, fetches: Any) -> list[Any]:
    import tensorflow as tf

    out = []
    for f in tf.nest.flatten(fetches):
        if f is None:
            continue
        element = graph.as_graph_element(f, allow_tensor=True, allow_operation=True)
        out.append(element)
    return out


def _fetch_names(fetches: Any) -> list[str]:
    import tensorflow as tf

    return [getattr(f, "name", str(f)) for f in tf.nest.flatten(fetches) if f is not None]


def closure(graph: Any, fetches: Any, feed_dict: Any) -> list[Any]:
    """The ops a Session.run of ``fetches`` executes, in creation order (a topological order
    of a TF1 graph): everything the fetches need through data and control edges, except
    the producers of fed tensors."""
    fed = {graph.as_graph_element(k).name for k in (feed_dict or {})}
    # A fetched tensor runs its op; a fetched op (a train op) runs itself.
    stack = [getattr(e, "op", e) for e in _graph_elements(graph, fetches)]
    seen: dict[str, Any] = {}
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen[op.name] = op
        stack += [t.op for t in op.inputs if t.name not in fed]
        stack += list(op.control_inputs)
    return sorted(seen.values(), key=lambda o: o._id)


def unordered_accesses(
    executed: list[Any],
) -> tuple[dict[Any, list[Any]], dict[Any, list[Any]], set[str]]:
    """The accesses of a variable in ``executed`` that no path orders with a write of it:
    read op -> those writes, and write op -> the other writes; and the names of the writes
    that another write of the same variable follows (ordered after them)."""
    by_var: dict[str, tuple[list[Any], list[Any]]] = {}
    for op in executed:
        if not op.inputs or not ops.reads_or_writes_variable(op.type):
            continue
        handle = op.inputs[0]
        reads, writes = by_var.setdefault(_variable(handle), ([], []))
        (writes if ops.WRITER.match(op.type) else reads).append(op)
    ancestors: dict[str, set[str]] = {}

    def above(op: Any) -> set[str]:
        # Iterative: a deep graph would overflow Python's stack.
        todo = [op]
        while todo:
            o = todo[-1]
            if o.name in ancestors:
                todo.pop()
                continue
            parents = [t.op for t in o.inputs] + list(o.control_inputs)
            missing = [p for p in parents if p.name not in ancestors]
            if missing:
                todo += missing
                continue
            s: set[str] = set()
            for p in parents:
                s.add(p.name)
                s |= ancestors[p.name]
            ancestors[o.name] = s
            todo.pop()
        return ancestors[op.name]

    def unordered(a: Any, b: Any) -> bool:
        return a.name not in above(b) and b.name not in above(a)

    out: dict[Any, list[Any]] = {}
    updates: dict[Any, list[Any]] = {}
    followed: set[str] = set()
    for reads, writes in by_var.values():
        for r in reads:
            racing = [w for w in writes if unordered(r, w)]
            if racing:
                out[r] = racing
        for w in writes:
            racing = [x for x in writes if x is not w and unordered(w, x)]
            if racing:
                updates[w] = racing
            if any(x is not w and w.name in above(x) for x in writes):
                followed.add(w.name)
    return out, updates, followed


def _variable(handle: Any) -> str:
    """The variable a resource handle tensor refers to (through Identity-like ops)."""
    t = handle
    while t.op.type in ops.ALIAS_OPS and t.op.inputs:
        t = t.op.inputs[0]
    return t.name
