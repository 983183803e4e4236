"""The recorder of one run: installed as TensorFlow's op callback while a ``trace()`` block is
active, it sends each op to the eager or graph path and collects the events they deliver."""

from __future__ import annotations

import itertools
import sys
import threading
from typing import Any

import numpy as np

from nddebug import digest as dg
from nddebug import native
from nddebug.errors import TraceError
from nddebug.recording import NOT_COMPARED, Event, OpInfo, Recording
from nddebug.tracer import (
    calls,
    eager,
    fresh,
    instrument,
    opaque,
    ops,
    plain,
    rerun,
    session,
    transport,
)
from nddebug.tracer.fairlock import FairRLock
from nddebug.tracer.location import hook_autograph, library_dirs
from nddebug.tracer.registry import REGISTRY, busy, inside_nddebug, set_gate
from nddebug.tracer.steps import StepFolder
from nddebug.tracer.threads import ThreadWatch
from nddebug.tracer.unheld import UnheldVariables


def _handed_on(outputs: Any) -> Any:
    """What an op callback that keeps an op's outputs returns: TensorFlow hands the last
    callback's return value to the program in place of the op's outputs, and passes it to the
    next callback (None would drop what an earlier one, nddebug.emulate_gpu, put there). TF
    gives callbacks a tuple, but the op's own outputs are a list, and code mutates them:
    Keras's cuDNN GRU swaps the gates of ``tf.split``'s result in place, which raised
    "'tuple' object does not support item assignment" under trace()."""
    return None if outputs is None else list(outputs)


class Recorder:
    """Collects one run; installed as TensorFlow's op callback while active.

    One block at a time in a process, and it records the thread that opened it: TensorFlow's
    op callbacks are per thread, so other threads' eager ops and graph construction are not
    seen; their calls of instrumented functions, whose rows would land in the shared buffer,
    are run apart and their rows dropped (see :meth:`foreign_call`)."""

    active: Recorder | None = None
    _starting = threading.Lock()

    def __init__(self, recording: Recording, rerun: int = 0, detail: str = "ops") -> None:
        self.recording = recording
        # trace(detail=...): every op execution, or one digest per step (see tracer.steps).
        self.steps = StepFolder(detail)
        # Extra executions of every re-executable op on its own inputs (trace(rerun=k)).
        self.rerun = rerun
        self._seq = itertools.count()
        self.lock = threading.Lock()
        # Graph events that arrived since the last eager op: they ran inside the next call.
        self.pending: list[Event] = []
        self.eager_digests: dict[int, dg.Digest | None] = {}  # EagerTensor._id -> digest
        # Variants holding values nothing compared yet (EagerTensor._id -> the op that made
        # them): see eager._track_unopened.
        self.unopened: dict[int, str] = {}
        # Per iterator (eager identity): the stand-in digest of the dataset bound to it (see
        # eager._pipeline_inputs).
        self.iterator_datasets: dict[str, Any] = {}
        # Iterators bound before the block whose dataset was looked for at their first read
        # (see eager._note_read_dataset).
        self.iterators_examined: set[str] = set()
        self.eager_sites: dict[str, int] = {}
        # Per eager site: the resources its ops used, in the order first seen (see on_eager).
        self.eager_site_resources: dict[str, dict[str, int]] = {}
        self.lib_dirs = library_dirs()
        # Op keys whose full output values are kept (second pass of check()).
        self.capture: set[str] | None = None
        # With rerun: the only op keys (without their "#n" suffix) that are re-executed; None
        # for all (check() confirms a suspect op this way, the rest of the step runs as usual).
        self.rerun_only: set[str] | None = None
        # check()'s runs: this thread's eager calls of functions holding seeded random ops go
        # to fresh copies of them (see tracer.fresh); None: to the functions called.
        self.fresh: fresh.FreshCopies | None = None
        # check()'s run: the variables the step writes that check() does not restore
        # otherwise, found as it runs (and put back by check() before each run).
        self.unheld: UnheldVariables | None = None
        # Opaque calls' variables are read before each call by this hook.
        self.pre_call = opaque.PreCallHook(self)
        # TF1 graphs: each Session.run instruments and records the ops it executes.
        self.session_hook = session.SessionHook(self)
        # XLA-compiled functions that ran (top level) or were traced nested inside one.
        self.xla_functions: set[str] = set()
        # This run's warnings about what opaque calls inside functions wrote -> the
        # variables they are about (see eager.record_variables).
        self.blind_variables: dict[str, set[str]] = {}
        self.thread = threading.get_ident()
        # What other Python threads ran meanwhile: not recorded, and said so.
        self.other_threads = ThreadWatch(self.thread)
        # trace(path=...): where events go once a chunk's worth is held (see tracer.stream).
        self.stream: Any = None
        # Held while an instrumented call runs, so another thread's call is never in flight
        # with one of this block's: its rows can then be told apart and dropped.
        self.call_lock = FairRLock()  # first come, first served (see tracer.fairlock)
        self.discarding = False  # pure-TF path: rows arriving now are another thread's
        self._held = 0  # calls of this thread whose rows are not drained yet (own_call)
        self._drains = 0  # eager callbacks of this block's thread so far (own_call)
        self.stopped = False  # set under call_lock once the block no longer records

    def next_seq(self) -> int:
        return next(self._seq)

    def rerun_for(self, key: str) -> int:
        """How many times the op of ``key`` is re-executed (0: not at all)."""
        if not self.rerun or (self.rerun_only is not None and key not in self.rerun_only):
            return 0
        return self.rerun

    def own_call(self, call: Any) -> Any:
        """Run a function call of the recording thread (see :meth:`foreign_call`)."""
        # Bounded: a call that waits for another thread's call (a queue between threads)
        # must not deadlock; it then runs as it would have, and the block says so.
        if not self.call_lock.acquire(timeout=5.0):
            ops.warn_once(self.recording, _MIXED)
            return call()
        drained = self._drains
        try:
            out = call()
        except BaseException:
            self.call_lock.release()
            raise
        if self._drains != drained:
            # The call's eager callback ran inside it (TensorFlow calls op callbacks from
            # its execute): its rows are in. Held on until this thread's next op instead,
            # the lock kept other threads' calls out for the whole of a loop of calls, and
            # a thread the block's thread then waited for (join) ran its call unguarded.
            self.call_lock.release()
            return out
        # Kept until the call's eager callback has drained its rows (release_call): the
        # last rows can reach the buffer just after the call returns, and another thread's
        # call must not start, and have them dropped with its own, before that.
        self._held += 1
        return out

    def release_call(self) -> None:
        """Let other threads' calls run again (see :meth:`own_call`)."""
        while self._held:
            self._held -= 1
            self.call_lock.release()

    def foreign_call(self, call: Any, name: str) -> Any:
        """Run another thread's call of function ``name`` during the block: alone (no call
        of this block in flight), with the rows it leaves in the buffer dropped, and noted
        as not compared (see :mod:`nddebug.tracer.threads`).

        Returns :data:`opaque.STALE` without running it when the block ended while the call
        waited: the call must then go through whatever block is active now (run under this
        one's lock, it would run unguarded beside the next block's calls, and its draining
        would take that block's rows)."""
        if not self.call_lock.acquire(timeout=5.0):
            if self.stopped:
                return opaque.STALE
            ops.warn_once(self.recording, _MIXED)
            self.other_threads.note("call", ops.function_name(name))
            return call()
        try:
            if self.stopped:
                return opaque.STALE
            self.other_threads.note("call", ops.function_name(name))
            self.drain()  # what is there now is the recording thread's
            self.discarding = True
            try:
                return call()
            finally:
                transport.drain_flat()
                self.discarding = False
        finally:
            self.call_lock.release()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        with Recorder._starting:
            active = Recorder.active
            if active is not None:
                if active.thread == self.thread:
                    raise TraceError(
                        "nddebug.trace() blocks cannot be nested (and check() runs its own trace)"
                    )
                raise TraceError(
                    "another thread is inside nddebug.trace() (or check()): one block records "
                    "at a time in a process. Trace in one thread, or one block after the other."
                )
            Recorder.active = self
        try:
            self._start()
        except BaseException:
            Recorder.active = None
            raise

    def _start(self) -> None:
        from tensorflow.python.eager.polymorphic_function import transform as concrete_function
        from tensorflow.python.framework import op_callbacks

        # The call hook first and the switches under the call lock: no other thread's call
        # is in flight, unhooked, once the buffer records.
        self.pre_call.install()
        instrument.hook_graph_ends()
        hook_autograph()
        instrument.hook_pfor()
        instrument.hook_statefulness()
        calls.hook_function_calls()
        plain.hook_saved_model()
        plain.hook_removal()
        calls.listen(self.end_outer_call)
        with self.call_lock:
            # Calls other threads started before the hook was this block's must end first.
            if not opaque.wait_for_calls(timeout=5.0):
                ops.warn_once(self.recording, _MIXED)
            set_gate(True)
            transport.drain_flat()  # rows of no block (there should be none)
            transport.set_active(True)
        if native.problem():
            ops.warn_once(
                self.recording,
                "nddebug's native ops could not be built or loaded, so graph digests use the "
                f"slower pure-TF path with one host callback per op ({native.problem()}). "
                "Run `python -m nddebug.native build` to see why; NDDEBUG_NATIVE=0 silences this "
                "(NDDEBUG_NATIVE_GPU=0 where it is the GPU kernels).",
            )
        self.other_threads.install()
        op_callbacks.add_op_callback(self.callback)
        concrete_function.CONCRETE_FUNCTION_CALLBACKS.append(self._on_function)
        self.session_hook.install()

    def stop(self) -> None:
        from tensorflow.python.eager.polymorphic_function import transform as concrete_function
        from tensorflow.python.framework import op_callbacks

        self.session_hook.uninstall()
        op_callbacks.remove_op_callback(self.callback)
        self.other_threads.uninstall()
        with self.call_lock:
            set_gate(False)
            transport.set_active(False)
            self.drain()
            self.release_call()
            self.stopped = True
        self.pre_call.uninstall()
        calls.listen(None)
        if self._on_function in concrete_function.CONCRETE_FUNCTION_CALLBACKS:
            concrete_function.CONCRETE_FUNCTION_CALLBACKS.remove(self._on_function)
        Recorder.active = None
        with self.lock:
            self.recording.events.extend(self.pending)
            self.pending.clear()
        self.recording.events.sort(key=lambda e: e.seq)
        if self.steps.active:
            self.steps.finish(self)
        self.eager_digests.clear()
        if self.unopened:
            made_by = ", ".join(sorted({ops.function_name(n) for n in self.unopened.values()}))
            ops.warn_once(self.recording, eager.unread_variants(f"what {made_by} made"))
            self.unopened.clear()
        if self.xla_functions:
            ops.warn_once(self.recording, opaque.xla_warning(self.xla_functions))
        elsewhere = self.other_threads.summary()
        if elsewhere:
            ops.warn_once(self.recording, elsewhere)

    def _on_function(self, function: Any) -> None:
        name = ops.as_str(function.name)
        if getattr(function, "graph", None) in REGISTRY.xla_graphs:
            REGISTRY.xla_functions.add(name)
        else:
            REGISTRY.instrumented_functions.add(name)
            graph = getattr(function, "graph", None)
            written: dict[str, frozenset[str]] = {}
            spots = (
                [*opaque.blind_spots(graph, written), *instrument.graph_notes(graph)]
                if graph is not None
                else []
            )
            if spots:
                REGISTRY.blind_spots[name] = spots
            for spot, variables in written.items():
                REGISTRY.blind_variables[(name, spot)] = variables
            xla = opaque.xla_called(graph) if graph is not None else set()
            if xla:
                REGISTRY.xla_called[name] = xla

    # ------------------------------------------------------------------ callback
    def callback(
        self,
        op_type: Any,
        inputs: Any,
        attrs: Any,
        outputs: Any,
        op_name: str | None = None,
        graph: Any = None,
    ) -> Any:
        if busy():
            if graph is None and self._held:
                self.drain()
                self.release_call()
            elif graph is not None:
                instrument.note_seen(graph, op_name)  # nddebug's own: never caught up
            return _handed_on(outputs)
        op_type = fresh.original(ops.as_str(op_type))  # a copy's call is its original's
        with inside_nddebug():
            try:
                if graph is None:
                    # A function call's graph events are in the buffer now (its eager
                    # callback runs after it returns): they get their seq before it does.
                    self.drain()
                    self._drains += 1
                    self.release_call()
                    eager.on_eager(self, op_type, inputs or (), attrs, outputs or ())
                elif instrument.is_v1_graph(graph):
                    pass  # a TF1 graph is instrumented by the Session.run that executes it
                elif not instrument.is_data_graph(graph):
                    instrument.instrument_op(
                        self,
                        op_type,
                        inputs or (),
                        attrs,
                        outputs or (),
                        op_name,
                        graph,
                        sys._getframe(1),  # TensorFlow's, making the op now
                    )
            except Exception as exc:  # noqa: BLE001 - never break the user's program
                # Not compared: what it output is seen only where its readers digest it,
                # and its own row is missing; a verdict cannot be "ok".
                what = " ".join(x for x in (op_type, op_name) if x)
                said = f"{NOT_COMPARED}op {what} could not be recorded: {type(exc).__name__}: {exc}"
                if graph is not None:
                    # Said again whenever the function runs in a later block (see say()).
                    instrument.say(self, graph, said)
                else:
                    self.recording.warnings.append(said)
        return _handed_on(outputs)

    # ------------------------------------------------------------------ events
    def append(self, ev: Event, call_device: str | None = None) -> None:
        """Add an eager event. With ``call_device`` (the event is a function call) the graph
        events delivered while it ran are attributed to it."""
        with self.lock:
            if call_device is not None and self.pending:
                pending, call = self.pending, ev.seq
                for p in pending:
                    p.call = call
                self.recording.events.extend(pending)
                if call_device:
                    for op_id in {p.op_id for p in pending}:
                        self._stamp_device(op_id, call_device)
                self.pending = []
            self.recording.events.append(ev)
            if call_device is not None and self.steps.active:
                if calls.inside_function_call():
                    self.steps.held = True  # one step with the call under way
                else:
                    self.steps.end_step(self)
            if self.stream is not None and (
                call_device is not None or not (self.pending or calls.inside_function_call())
            ):
                # After a call; or after an eager op outside any call's execution (a block
                # of eager ops only is streamed too: nothing of it is lost if the process
                # dies). Inside a call (a py_function's ops) the call's own events are not
                # all in yet, and a chunk holds whole calls.
                self._stream_out()

    def end_outer_call(self) -> None:
        """A tf.function call made on this block's thread returned: the calls it made (its
        own, and TensorFlow's variable initializer before a first call) form one step."""
        if not self.steps.held:
            return
        with self.lock:
            if self.steps.active and self.steps.held:
                self.steps.end_step(self)
                if self.stream is not None:
                    self._stream_out()

    def _stream_out(self) -> None:
        """Write the complete steps held in memory to the block's file once they reach a
        chunk, and drop them here (see :mod:`nddebug.tracer.stream`). Under ``self.lock``."""
        events = self.recording.events
        done = self.steps.start if self.steps.active else len(events)
        if self.stream.due(done) and self.stream.write(events[:done]):
            del events[:done]
            if self.steps.active:
                self.steps.start -= done

    def record_return(self, value: Any) -> None:
        """Digest the step's return value (see :func:`eager.record_return`)."""
        eager.record_return(self, value)

    def record_variables(self, variables: list[Any]) -> None:
        """Digest the values of ``variables`` now (see :func:`eager.record_variables`)."""
        eager.record_variables(self, variables)

    def drain(self) -> None:
        """Take the graph op executions the native buffer holds (see :mod:`transport`): never
        while another thread's call is in flight, whose rows are not this block's."""
        locked = self.call_lock.acquire(timeout=5.0)
        try:
            table = ([], [], []) if self.discarding else transport.drain_columns()
        finally:
            if locked:
                self.call_lock.release()
        self._take(*table)

    def _stamp_device(self, op_id: int, device: str) -> None:
        """Graph ops are placed after tracing: the device of the call that ran an op with no
        device of its own stands in for it. The registry's op, which runs share, takes the
        first call's device; a run whose call ran on another device gets its own copy."""
        op = self.recording.ops[op_id]
        if op.device == device:
            return  # stamped already (every execution after an op's first comes here)
        stamped = _STAMPED.get(op_id)
        if not op.device and stamped is None:
            op.device = device
            _STAMPED[op_id] = device
        elif op.device == stamped:
            op = op.copy()
            op.device = device
            self.recording.ops[op_id] = op

    def _take(
        self,
        op_ids: list[int],
        outputs: list[list[dg.Digest]],
        inputs: list[list[dg.Digest]],
    ) -> None:
        """The drained rows (:func:`transport.drain_columns`) as events, in one pass: a
        traced step delivers one row per op execution (thousands per call), so this is the
        per-call Python work of a trace. Rows of re-executed ops take the general path
        (:meth:`on_graph_event`)."""
        batch: list[Event] = []
        new_ops: dict[int, OpInfo] = {}
        known = self.recording.ops
        # Bound once: a row's Python work here is a third of what a record costs on the CPU
        # and of what it costs a GPU's host (benchmarks/bench_record_cost.py).
        registered, reruns, seq = REGISTRY.ops, REGISTRY.reruns, self._seq
        for op_id, outs, ins in zip(op_ids, outputs, inputs, strict=True):
            op = registered.get(op_id)
            if op is None:
                continue
            if op_id in reruns:
                self._add(batch, new_ops)
                batch, new_ops = [], {}
                self.on_graph_event(op_id, outs, ins)
                continue
            mask = op.digestible
            digests = outs if len(outs) == len(mask) else transport.unpack(outs, mask)
            batch.append(Event(next(seq), op_id, -1, digests, ins))
            if op_id not in known:
                new_ops[op_id] = op
        self._add(batch, new_ops)

    def _add(self, batch: list[Event], new_ops: dict[int, OpInfo]) -> None:
        # The registry's OpInfo itself, not a copy: a registered op's fields are never
        # rebound in place once it is registered (what changes, the caller's note and the
        # call's device, is changed on a copy: see instrument._defer_in_caller and append).
        # A copy per op per block was ~2,600 more objects a step for a 1,300-op step, which
        # kept the cyclic garbage collector's full passes (~0.3 s each over TensorFlow's
        # objects) coming every ~20 traced steps: ~10 ms a step.
        with self.lock:
            for op_id, op in new_ops.items():
                self.recording.ops.setdefault(op_id, op)
            self.pending.extend(batch)

    def on_graph_event(
        self,
        op_id: int,
        outs: np.ndarray | list[list[int]],
        ins: np.ndarray | list[list[int]],
        values: tuple[np.ndarray, ...] = (),
    ) -> None:
        """One graph op execution, delivered by its host callback or a drain."""
        op = REGISTRY.ops.get(op_id)
        if op is None:
            return
        slots = [i for i, readable in enumerate(op.digestible) if readable]
        k, host = REGISTRY.reruns.get(op_id, (0, False))
        ev = Event(
            seq=self.next_seq(),
            op_id=op_id,
            call=-1,
            digests=[None] * len(op.digestible)
            if host
            else transport.unpack(_rows(outs), op.digestible),
            inputs=[(int(row[0]), int(row[1])) for row in _rows(ins)],
        )
        kept: dict[str, np.ndarray] = {}
        if host:
            rerun.host_digests(ev, slots, k, values, kept)
        elif k:
            ev.reruns = rerun.device_digests(op, ev, slots, k, values, kept)
        else:
            for slot, value in zip(slots, values, strict=False):
                array = ops.kept_value(value)
                if array is not None:
                    kept[f"{ev.seq}:{slot}"] = array
        with self.lock:
            self.recording.values.update(kept)
        self._add([ev], {op_id: op})


#: Graph ops whose device is the device of the call that first ran them (op id -> device).
_STAMPED: dict[int, str] = {}

_MIXED = (
    NOT_COMPARED
    + "another thread called instrumented functions while a call of this block was in flight: "
    "their op executions may be mixed into this run."
)


def _rows(x: np.ndarray | list[list[int]]) -> list[list[int]]:
    return x.tolist() if isinstance(x, np.ndarray) else x
