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
from nddebug.recording import (
    AFTER_WRITES,
    CALL_WRITES,
    LOOP_READS,
    NOT_COMPARED,
    STATE_FILLERS,
    TF1_LOOP,
    TF1_LOOP_NAME,
    Event,
    OpInfo,
)
from nddebug.tracer import instrument, opaque, ops
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
                    reads, writes, followed, after = unordered_accesses(executed)
                    # Updates another update of the same variable follows: nothing new can
                    # order the read of the value after them before it (instrument.OVERWRITTEN).
                    cache = REGISTRY.graph_cache(graph)
                    cache.setdefault(instrument.OVERWRITTEN, set()).update(followed)
                    sends = self._instrument(graph, executed)
                    self._note_races(graph, reads, writes)
                    self._note_order(graph, after)
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
            self._record_run(sess, fetches)
        return result

    def _instrument(self, graph: Any, executed: list[Any]) -> list[Any]:
        import tensorflow as tf

        rec = self.recorder
        sends = _SENDS.setdefault(graph, {})
        targets: list[Any] = []
        frames, extra = _loop_plan(graph, executed)
        if frames:
            self._note_loops(graph, executed, frames)
        with graph.as_default():
            for op in executed:
                if op.name in frames:
                    if op.name not in sends:
                        # Inside a TF1 while loop's frame: no op can be added there that a
                        # run would execute (see loop_frames). Its outputs have no digest.
                        cache = REGISTRY.graph_cache(graph)
                        for t in op.outputs:
                            cache.setdefault(t.name, None)
                        sends[op.name] = []
                    continue
                if op.name not in sends:
                    inputs = list(op.inputs)
                    if op.name in extra:
                        # A loop's Exit: what enters the loop; a reader of state a loop
                        # wrote: also that loop's outputs (see loop_inputs).
                        inputs = extra[op.name] + ([] if op.type in _LOOP_EXITS else inputs)
                    sent = instrument.instrument_op(
                        rec, op.type, inputs, attrs_of(op), list(op.outputs), op.name, graph
                    )
                    sends[op.name] = [] if sent is None else [sent]
                    if any(t.dtype._is_ref_dtype for t in [*op.inputs, *op.outputs]):
                        ops.warn_once(
                            rec.recording,
                            f"{NOT_COMPARED}the graph uses reference variables (TF1 "
                            "tf.Variable without use_resource): neither their updates nor "
                            "their reads are compared (a read is the variable's own buffer, "
                            "which an update changes in place, perhaps before a digest reads "
                            "it), only what the ops that read them compute. "
                            "tf.compat.v1.enable_resource_variables() compares each update "
                            "and read.",
                        )
                    loop = _loop_read(op, frames)
                    if loop:
                        self._mark_exit(graph, op, loop)
                targets += sends[op.name]
        calls = [op for op in executed if _calls_function(op) and op.name not in frames]
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

    def _note_loops(self, graph: Any, executed: list[Any], frames: dict[str, str]) -> None:
        """Say once which TF1 while loops a run executes unrecorded, and whether something
        inside them writes a variable (then not everything is compared: the write shows only
        through reads after the loop)."""
        inner = [op for op in executed if op.name in frames]
        writes = sorted({op.type for op in inner if ops.WRITER.match(op.type)})
        loops = sorted(set(frames.values()))
        shown = ", ".join(loops[:4]) + (f" and {len(loops) - 4} more" if len(loops) > 4 else "")
        ops.warn_once(
            self.recorder.recording,
            (NOT_COMPARED if writes else "")
            + f"{len(inner)} op(s) of the TF1 graph run inside tf.compat.v1.while_loop frames "
            f"({shown}; dynamic_rnn, v1 control flow): nddebug cannot add its records there, so "
            "each loop is compared at its outputs (its Exit ops) and the known culprits and "
            "random ops inside it are named with them"
            + (f"; the variables they write ({', '.join(writes)}) are not." if writes else "."),
        )

    def _mark_exit(self, graph: Any, op: Any, loop: str) -> None:
        """An Exit of a loop whose frame was not recorded (or an op that reads state only the
        loop wrote: a TensorArray's gather, a variable) is judged as an opaque call: its
        OpInfo says so, with the op types that ran inside (for the risks and the why), those
        of the loops whose state this loop read among them (a gradient loop pops what its
        forward loop pushed)."""
        memo = _FRAME_OPS.get(graph, {})
        loops = [loop, *_LOOP_DEPENDS.get(graph, {}).get(loop, ())]
        frame_ops = [o for name in loops for o in memo.get(name, {}).values()]
        inside = opaque.ops_of_nodes([o.node_def for o in frame_ops], graph)
        used, written = _LOOP_STATE.get(graph, {}).get(loop, ([], []))
        for info in _infos(graph).get(op.name, ()):
            info.function = TF1_LOOP
            info.attrs["ops_inside"] = list(inside)
            info.attrs[TF1_LOOP_NAME] = loop
            if used:  # what the loop put out depends on them (an Exit, or a gather)
                info.attrs[LOOP_READS] = used
            if written and op.type in _LOOP_EXITS:
                info.attrs[CALL_WRITES] = written

    def _note_order(self, graph: Any, after: dict[str, list[str]]) -> None:
        """Give each read the updates of its variable that the graph orders before it in the
        run (AFTER_WRITES). Records arrive in no fixed order: the read that ``assign_add``
        returns reached the recording before the update's own record, and was named the
        source of what the update wrote."""
        if not after:
            return
        by_name = _infos(graph)
        for op_name, writes in after.items():
            for info in by_name.get(op_name, ()):
                info.attrs[AFTER_WRITES] = writes

    def _note_races(
        self, graph: Any, reads: dict[Any, list[Any]], writes: dict[Any, list[Any]]
    ) -> None:
        """Name every read of a variable that no path orders with a write of it in this run,
        and every write that no path orders with another write of it (see
        :func:`unordered_accesses`)."""
        rec = self.recorder
        for op, others in [*reads.items(), *writes.items()]:
            names = sorted(w.name for w in others)
            for info in _infos(graph).get(op.name, ()):
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

    def _record_run(self, sess: Any, fetches: Any) -> None:
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
        device = _run_device(sess)
        if device and not rec.recording.environment.get("devices"):
            # TF1 graph mode starts no eager runtime to list them: the session's own.
            rec.recording.environment["devices"] = list(_SESSION_DEVICES.get(id(sess), []))
        rec.append(Event(seq=seq, op_id=op_id, call=seq, digests=[]), call_device=device)


#: Per graph: the executed ops' names -> (loop_frames, loop_inputs) of that run.
_LOOP_PLANS = GraphMemo("session_loop_plans")


def _loop_plan(graph: Any, executed: list[Any]) -> tuple[dict[str, str], dict[str, list[Any]]]:
    """loop_frames and loop_inputs of a run, worked out once per set of executed ops: a
    training loop runs the same Session.run thousands of times."""
    plans = _LOOP_PLANS.setdefault(graph, {})
    key = tuple(op.name for op in executed)
    if key not in plans:
        frames = loop_frames(executed)
        plans[key] = (frames, loop_inputs(executed, frames) if frames else {})
    return plans[key]


#: The ops that hand a TF1 loop's values out of its frame.
_LOOP_EXITS = frozenset({"Exit", "RefExit"})
#: Per graph: a TF1 loop's name -> the ops executed in its frame (for its Exits' OpInfo).
_FRAME_OPS = GraphMemo("session_loop_ops")


def loop_frames(executed: list[Any]) -> dict[str, str]:
    """The ops of ``executed`` that run inside a TF1 ``while_loop`` frame (v1 control flow:
    Enter, the body, the condition, NextIteration; ``dynamic_rnn`` and the gradient loops
    made for them), by name -> the name of the outermost loop holding them.

    No op added after the loop was built can run in its frame: an op outside cannot read a
    tensor inside ("is in a while loop"), an op added inside cannot be fetched, and the
    control edge that would make an iteration wait for it is ignored once a session has
    run the graph. So nothing inside is recorded, and the loop is compared at its Exits."""
    from tensorflow.python.ops import control_flow_util

    out: dict[str, str] = {}
    for op in executed:
        ctxt = op._get_control_flow_context()
        if op.type in _LOOP_EXITS:
            # An Exit belongs to its loop's context, but runs in the frame around it.
            loop = control_flow_util.GetContainingWhileContext(ctxt)
            ctxt = loop.outer_context if loop is not None else ctxt
        ctxt = control_flow_util.GetContainingWhileContext(ctxt)
        if ctxt is None:
            continue
        while True:
            outer = control_flow_util.GetContainingWhileContext(ctxt.outer_context)
            if outer is None:
                break
            ctxt = outer
        out[op.name] = ctxt.name.rstrip("/").removesuffix("/while_context")
    if out:
        graph = executed[0].graph
        memo = _FRAME_OPS.setdefault(graph, {})
        for op in executed:
            if op.name in out:
                memo.setdefault(out[op.name], {})[op.name] = op
    return out


#: Per graph: a TF1 loop's name -> the loops whose state it reads (see loop_inputs).
_LOOP_DEPENDS = GraphMemo("session_loop_depends")
#: Per graph: a TF1 loop's name -> the state its frame reads and writes (loop_inputs).
_LOOP_STATE = GraphMemo("session_loop_state")
#: Per graph: op name -> the loop whose written state it reads from outside (loop_inputs).
_LOOP_READERS = GraphMemo("session_loop_readers")


def _loop_read(op: Any, frames: dict[str, str]) -> str:
    """The loop whose outputs ``op`` is: an Exit's loop, or the loop that wrote the state an
    op outside every frame reads; "" for any other op."""
    if op.type in _LOOP_EXITS and op.inputs and op.inputs[0].op.name in frames:
        return frames[op.inputs[0].op.name]
    return _LOOP_READERS.get(op.graph, {}).get(op.name, "")


def loop_inputs(executed: list[Any], frames: dict[str, str]) -> dict[str, list[Any]]:
    """What a TF1 loop's outputs are compared against, since its frame is not recorded: per
    Exit, the tensors the loop reads from outside its frame (its Enters' inputs), the values
    that ops outside every frame put into state it reads (a gradient loop reads the
    TensorArray of incoming gradients a scatter filled), and the outputs of the other loops
    whose state it reads (a gradient loop pops the stacks its forward loop pushed); per op
    outside every frame that reads state a loop wrote (a TensorArray's gather after
    dynamic_rnn), that loop's outputs, added to its own inputs. So the first loop whose
    outputs differ from identical inputs is the source, and what it only handed on is
    propagated, as for calls. The variables a loop reads and writes are kept for its Exits'
    OpInfo (see SessionHook._mark_exit): a read after a divergent update is propagated."""
    graph = executed[0].graph
    entering: dict[str, list[Any]] = {}
    exits: dict[str, list[Any]] = {}
    writes: dict[str, set[str]] = {}
    reads: dict[str, set[str]] = {}
    filled: dict[str, list[Any]] = {}  # state -> the ops outside every frame that write it
    fed_by: dict[str, set[str]] = {}  # loop -> the loops whose frame hands it a tensor
    for op in executed:
        loop = frames.get(op.name)
        if op.type in _LOOP_EXITS and op.inputs and op.inputs[0].op.name in frames:
            if loop is None:  # an inner loop's Exit is inside the outer loop's frame
                exits.setdefault(frames[op.inputs[0].op.name], []).append(op)
                continue
        state = ops.state_input(op.type, list(op.inputs))
        writer = state is not None and bool(
            ops.WRITER.match(op.type) or STATE_FILLERS.match(op.type)
        )
        if loop is None:
            if writer:
                filled.setdefault(instrument.variable_identity(graph, state), []).append(op)
            continue
        if op.type in ("Enter", "RefEnter"):
            source = frames.get(op.inputs[0].op.name)
            if source is None:
                entering.setdefault(loop, []).append(op.inputs[0])
            elif source != loop:
                # From inside another loop's frame (a gradient loop takes its forward loop's
                # iteration count): no digest can read it there; that loop's outputs stand
                # in. Digested, it made the Session.run's instrumentation fail (probe round
                # 46: a nested loop's gradient).
                fed_by.setdefault(loop, set()).add(source)
        if state is not None:
            target = writes if writer else reads
            target.setdefault(loop, set()).add(instrument.variable_identity(graph, state))
    state_of = _LOOP_STATE.setdefault(graph, {})
    depends = _LOOP_DEPENDS.setdefault(graph, {})
    readers = _LOOP_READERS.setdefault(graph, {})
    first_exit = {loop: min(o._id for o in ops_) for loop, ops_ in exits.items()}

    def writers_of(resources: set[str], before: int, but: str = "") -> list[str]:
        return sorted(
            m
            for m, written in writes.items()
            if m != but and written & resources and first_exit.get(m, before) < before
        )

    out: dict[str, list[Any]] = {}
    for loop, ops_ in exits.items():
        used = reads.get(loop, set())
        upstream = writers_of(used, first_exit[loop], but=loop)
        upstream += sorted(
            m
            for m in fed_by.get(loop, ())
            if m not in upstream and first_exit.get(m, first_exit[loop]) < first_exit[loop]
        )
        depends[loop] = tuple(upstream)
        state_of[loop] = (sorted(used), sorted(writes.get(loop, set())))
        put = [
            t
            for resource in sorted(used)
            for w in filled.get(resource, [])
            if w._id < first_exit[loop]
            for t in list(w.inputs)[1:]  # what it wrote, not the handle
        ]
        outer = entering.get(loop, []) + put
        outer += [t for m in upstream for e in exits[m] for t in e.outputs]
        for e in ops_:
            out[e.name] = outer
    for op in executed:
        if op.name in frames or op.type in _LOOP_EXITS:
            continue
        state = ops.state_input(op.type, list(op.inputs))
        if state is None:
            continue
        upstream = writers_of({instrument.variable_identity(graph, state)}, op._id)
        if upstream:
            readers[op.name] = upstream[-1]
            out[op.name] = [t for m in upstream for e in exits[m] for t in e.outputs]
    return out


#: Per graph: (the registry's size and last op id, its OpInfos by op name) (see _infos).
_INFOS = GraphMemo("session_infos")


def _infos(graph: Any) -> dict[str, list[OpInfo]]:
    """The registry's OpInfos of ``graph``'s ops by op name, rebuilt only when the registry
    grew: every Session.run looked each op up in all of it."""
    held, by_name = _INFOS.get(graph, (None, {}))
    now = (len(REGISTRY.ops), next(reversed(REGISTRY.ops), None))  # its size and last id
    if held != now:
        name = instrument.graph_name(graph)
        by_name = {}
        for info in list(REGISTRY.ops.values()):
            if info.graph == name:
                by_name.setdefault(info.op_name, []).append(info)
        _INFOS[graph] = (now, by_name)
    return by_name


def _run_device(sess: Any) -> str:
    """Where a Session.run puts the ops it was not told to place: its first GPU, else the CPU
    (TensorFlow's placer; an op with no kernel there goes to the CPU all the same). Its ops
    are stamped with it, as a tf.function call's are with the call's device: unplaced, they
    were "on ?", and the knowledge base's CPU culprits (ResourceScatterAdd) were never
    matched in a TF1 job (probe round 46, F7)."""
    from nddebug import knowledge

    found = _SESSION_DEVICES.get(id(sess))
    if found is None:
        try:
            found = [d.name for d in sess.list_devices()]
        except Exception:  # noqa: BLE001 - a remote or closed session: left unplaced
            found = []
        _SESSION_DEVICES[id(sess)] = found
    gpus = [d for d in found if knowledge.device_kind(d) == "GPU"]
    return gpus[0] if gpus else next((d for d in found if knowledge.device_kind(d) == "CPU"), "")


#: A session's devices by id(session) (listing them asks the runtime each time).
_SESSION_DEVICES: dict[int, list[str]] = {}


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
) -> tuple[dict[Any, list[Any]], dict[Any, list[Any]], set[str], dict[str, list[str]]]:
    """The accesses of a variable in ``executed`` that no path orders with a write of it:
    read op -> those writes, and write op -> the other writes; the names of the writes
    that another write of the same variable follows (ordered after them); and per read, the
    names of the writes of its variable that a path orders before it (see AFTER_WRITES)."""
    by_var: dict[str, tuple[list[Any], list[Any]]] = {}
    for op in executed:
        if not op.inputs or not ops.reads_or_writes_variable(op.type):
            continue
        handle = op.inputs[0]
        reads, writes = by_var.setdefault(_variable(handle), ([], []))
        (writes if ops.WRITER.match(op.type) else reads).append(op)
    above = _Ancestors()

    def unordered(a: Any, b: Any) -> bool:
        return a.name not in above(b) and b.name not in above(a)

    out: dict[Any, list[Any]] = {}
    updates: dict[Any, list[Any]] = {}
    followed: set[str] = set()
    after: dict[str, list[str]] = {}
    for reads, writes in by_var.values():
        for r in reads:
            racing = [w for w in writes if unordered(r, w)]
            if racing:
                out[r] = racing
            before = sorted(w.name for w in writes if w.name in above(r))
            if before:
                after[r.name] = before
        for w in writes:
            racing = [x for x in writes if x is not w and unordered(w, x)]
            if racing:
                updates[w] = racing
            if any(x is not w and w.name in above(x) for x in writes):
                followed.add(w.name)
    return out, updates, followed, after


class _Ancestors:
    """``above(op)``: the names of the ops ``op`` waits for, through data and control edges.

    A TF1 while loop's back edge (NextIteration -> Merge) makes a cycle, and the search for
    ancestors of an op inside a loop never ended (a traced Session.run of a dynamic_rnn
    hung). So the ops are grouped into strongly connected components (Tarjan's algorithm,
    iterative: a deep graph would overflow Python's stack); the ops of one loop's cycle are
    each other's ancestors, and a component's ancestors are its parents' and theirs."""

    def __init__(self) -> None:
        self._component: dict[str, int] = {}
        self._above: list[set[str]] = []

    def __call__(self, op: Any) -> set[str]:
        if op.name not in self._component:
            self._visit(op)
        return self._above[self._component[op.name]]

    def _visit(self, root: Any) -> None:
        index: dict[str, int] = {root.name: 0}
        low: dict[str, int] = {root.name: 0}
        stack: list[Any] = [root]
        on_stack: set[str] = {root.name}
        work = [(root, iter(_parents(root)))]
        while work:
            op, parents = work[-1]
            deeper = None
            for p in parents:
                if p.name in self._component:
                    continue  # a finished component
                if p.name not in index:
                    deeper = p
                    break
                if p.name in on_stack:
                    low[op.name] = min(low[op.name], index[p.name])
            if deeper is not None:
                index[deeper.name] = low[deeper.name] = len(index)
                stack.append(deeper)
                on_stack.add(deeper.name)
                work.append((deeper, iter(_parents(deeper))))
                continue
            work.pop()
            if work:
                caller = work[-1][0]
                low[caller.name] = min(low[caller.name], low[op.name])
            if low[op.name] == index[op.name]:
                self._close(op, stack, on_stack)

    def _close(self, op: Any, stack: list[Any], on_stack: set[str]) -> None:
        """Pop the component ``op`` roots and give it its ancestors."""
        members = []
        while True:
            m = stack.pop()
            on_stack.discard(m.name)
            members.append(m)
            if m is op:
                break
        names = {m.name for m in members}
        cyclic = len(members) > 1 or any(p.name == op.name for p in _parents(op))
        above: set[str] = set(names) if cyclic else set()
        for m in members:
            for p in _parents(m):
                if p.name not in names:
                    above.add(p.name)
                    above |= self._above[self._component[p.name]]
        c = len(self._above)
        self._above.append(above)
        for name in names:
            self._component[name] = c


def _parents(op: Any) -> list[Any]:
    return [t.op for t in op.inputs] + list(op.control_inputs)


def _variable(handle: Any) -> str:
    """The variable a resource handle tensor refers to (through Identity-like ops)."""
    t = handle
    # Through identities and TF1 control flow (a handle entering a loop's frame).
    while (t.op.type in ops.ALIAS_OPS or t.op.type in ops.HANDLE_ROUTING) and t.op.inputs:
        t = t.op.inputs[0]
    return t.name
