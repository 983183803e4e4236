"""Records a digest of every op's outputs (and inputs) through TensorFlow's op callbacks.

Eager ops are digested when the callback sees them. Graph ops (``tf.function``, Keras train
functions, cond/while bodies, gradients, optimizer updates) are instrumented when they are
created: the digest ops are added next to the op, and one small host callback per op
execution hands the digests (a few int64 values) to the active recorder. An instrumented
graph stays instrumented; outside ``trace()`` a process-wide switch makes its digests skip
their heavy part and its host callbacks return at once (about 1.3x the plain step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import re
import sys
import sysconfig
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from nddebug import digest as dg
from nddebug.errors import TraceError
from nddebug.recording import CALL_OPS, RERUN_INNER, Event, OpInfo, Recording

# Ops whose outputs are their inputs' bytes: not digested again (the digest is over bytes).
ALIAS_OPS = {
    "Identity": None,  # output i <- input i
    "IdentityN": None,
    "Snapshot": None,
    "StopGradient": None,
    "PreventGradient": None,
    "EnsureShape": None,
    "Bitcast": None,
    "Reshape": 0,  # output 0 <- input 0 (other inputs are shapes/axes)
    "ExpandDims": 0,
    "Squeeze": 0,
}
# Ops with nothing worth digesting and no effect on values.
SKIP_OPS = {"NoOp", "PyFunc", "EagerPyFunc"}
# Ops that write a resource variable (input 0): the value written is read back and digested.
_WRITER = re.compile(
    r"^(ResourceApply|ResourceSparseApply|AssignVariableOp|AssignAddVariableOp|"
    r"AssignSubVariableOp|ResourceScatter|ResourceStridedSliceAssign)"
)
RECORD_ENV = "NDDEBUG_RECORD"  # set by `nddebug run` for the processes it starts
LABEL_ENV = "NDDEBUG_LABEL"
EMULATE_ENV = "NDDEBUG_EMULATE_GPU"  # set by `nddebug run --emulate-gpu`
_FUNCTION_CALL = re.compile(r"^(__inference_|__forward_|__backward_)")
_UID_SUFFIX = re.compile(r"_\d+$")
# Name scopes get "_1", "_2" … when a model, layer or function is built again (retrace, a new
# process, a second model); keys drop them and tell real duplicates apart by creation order.
_UID_IN_NAME = re.compile(r"_\d+(?=/|$)")


def _library_dirs() -> tuple[str, ...]:
    dirs = [os.path.dirname(os.path.abspath(__file__)), sysconfig.get_paths()["stdlib"]]
    for name in ("tensorflow", "keras", "tf_keras", "absl", "optree", "numpy"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(mod.__file__)))
    return tuple(d + os.sep for d in dirs)


_EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "examples") + os.sep


def _is_user_file(filename: str, lib_dirs: tuple[str, ...]) -> bool:
    """User code is anything outside TF, Keras, the stdlib and nddebug (but nddebug's
    examples are user code: they stand for a user's training script)."""
    if filename.startswith("<") and not filename.startswith("<ipython-input"):
        return False
    if "__autograph_generated_file" in filename:
        return False  # a temporary copy made by autograph; its name changes every process
    path = os.path.abspath(filename)
    return path.startswith(_EXAMPLES_DIR) or not path.startswith(lib_dirs)


def _format_location(filename: str, lineno: int, name: str) -> str:
    return f"{filename}:{lineno} ({name})"


class OpRegistry:
    """Process-wide table of instrumented graph ops: graphs traced once are run many times,
    possibly under several ``trace()`` blocks, so their op ids must outlive any one of them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: dict[int, OpInfo] = {}
        self._ids = itertools.count()
        self.instrumented_functions: set[str] = set()
        self.xla_graphs: weakref.WeakSet[Any] = weakref.WeakSet()  # seen, not instrumented
        # per graph: output tensor (by name) -> digest tensor [2] (or None if unreadable)
        self.graph_digests: weakref.WeakKeyDictionary[Any, dict[str, Any]] = (
            weakref.WeakKeyDictionary()
        )
        self.graph_keys: weakref.WeakKeyDictionary[Any, dict[str, int]] = (
            weakref.WeakKeyDictionary()
        )
        # Graph ops instrumented for rerun mode: op id -> (number of copies, whether the host
        # gets the tensors themselves rather than digests and sliced bytes).
        self.reruns: dict[int, tuple[int, bool]] = {}

    def new_id(self) -> int:
        return next(self._ids)


REGISTRY = OpRegistry()
_local = threading.local()


def _busy() -> bool:
    return getattr(_local, "busy", False)


@contextlib.contextmanager
def _inside_nddebug() -> Iterator[None]:
    prev = _busy()
    _local.busy = True
    try:
        yield
    finally:
        _local.busy = prev


class Recorder:
    """Collects one run; installed as TensorFlow's op callback while active."""

    active: Recorder | None = None

    def __init__(self, recording: Recording, rerun: int = 0) -> None:
        self.recording = recording
        # Extra executions of every re-executable op on its own inputs (trace(rerun=k)).
        self.rerun = rerun
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._pending: list[Event] = []
        self._eager_digests: dict[int, dg.Digest | None] = {}  # EagerTensor._id -> digest
        self._eager_sites: dict[str, int] = {}
        self._lib_dirs = _library_dirs()
        # Op keys whose full output values are kept (second pass of check()).
        self.capture: set[str] | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        from tensorflow.python.eager.polymorphic_function import transform as concrete_function
        from tensorflow.python.framework import op_callbacks

        if Recorder.active is not None:
            raise TraceError(
                "nddebug.trace() blocks cannot be nested (and check() runs its own trace)"
            )
        _set_gate(True)
        Recorder.active = self
        op_callbacks.add_op_callback(self.callback)
        concrete_function.CONCRETE_FUNCTION_CALLBACKS.append(self._on_function)

    def stop(self) -> None:
        from tensorflow.python.eager.polymorphic_function import transform as concrete_function
        from tensorflow.python.framework import op_callbacks

        op_callbacks.remove_op_callback(self.callback)
        _set_gate(False)
        if self._on_function in concrete_function.CONCRETE_FUNCTION_CALLBACKS:
            concrete_function.CONCRETE_FUNCTION_CALLBACKS.remove(self._on_function)
        Recorder.active = None
        with self._lock:
            for ev in self._pending:
                self.recording.events.append(ev)
            self._pending.clear()
        self.recording.events.sort(key=lambda e: e.seq)
        self._eager_digests.clear()

    def _on_function(self, function: Any) -> None:
        if getattr(function, "graph", None) not in REGISTRY.xla_graphs:
            REGISTRY.instrumented_functions.add(_as_str(function.name))

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
        if _busy():
            return outputs
        op_type = _as_str(op_type)
        with _inside_nddebug():
            try:
                if graph is None:
                    self._on_eager(op_type, inputs or (), attrs, outputs or ())
                elif _is_v1_graph(graph):
                    _warn_once(
                        self.recording,
                        "TF1 graph mode (tf.compat.v1 graphs and Session) is not supported: "
                        "its ops are not recorded. Run the step eagerly or in a tf.function.",
                    )
                elif not _is_data_graph(graph):
                    _instrument_graph_op(
                        self, op_type, inputs or (), attrs, outputs or (), op_name, graph
                    )
            except Exception as exc:  # noqa: BLE001 - never break the user's program
                self.recording.warnings.append(
                    f"Could not record op {op_type} {op_name or ''}: {type(exc).__name__}: {exc}"
                )
        # Pass the outputs on: TensorFlow hands the last callback's return value to the graph,
        # and None would drop what an earlier callback (nddebug.emulate_gpu) put there.
        return outputs

    # ------------------------------------------------------------------ eager ops
    def _digest_eager(self, tensor: Any) -> dg.Digest | None:
        tid = getattr(tensor, "_id", None)
        if tid is not None and tid in self._eager_digests:
            return self._eager_digests[tid]
        d = digest_eager_tensor(tensor)
        if tid is not None:
            self._eager_digests[tid] = d
        return d

    def _on_eager(self, op_type: str, inputs: Any, attrs: Any, outputs: Any) -> None:
        if op_type in SKIP_OPS:
            return
        location, site = self._eager_location()
        # TF names a function's call op after the function plus a process-specific number;
        # the site is file name, line and function, so keys match across machines too.
        key = f"eager:{_UID_SUFFIX.sub('', op_type)}@{site}"
        alias = ALIAS_OPS.get(op_type, -1)
        if alias != -1:
            for i, out in enumerate(outputs):
                src = inputs[i if alias is None else alias] if inputs else None
                if src is not None and getattr(out, "_id", None) is not None:
                    self._eager_digests[out._id] = self._digest_eager(src)
            return
        in_digests = [d for d in (self._digest_eager(t) for t in inputs) if d is not None]
        out_tensors = list(outputs)
        note = ""
        if not out_tensors and _WRITER.match(op_type) and inputs:
            value = _written_value(op_type, inputs)
            if value is None:
                value = _read_variable(inputs[0], _dtype_attr(attrs))
            if value is not None:
                out_tensors = [value]
                note = "value of the variable after this update"
        if not out_tensors and not in_digests:
            return
        out_digests = [self._digest_eager(t) for t in out_tensors]
        op_def = _op_def(op_type)
        stateful = op_def is None or op_def.is_stateful
        blocker = ""
        if self.rerun:
            blocker = _rerun_blocker(op_type, stateful, len(inputs), out_digests, bool(note))
        op_id = self._eager_sites.get(key)
        if op_id is None:
            op_id = REGISTRY.new_id()
            self._eager_sites[key] = op_id
            device = out_tensors[0].device if out_tensors else _default_device()
            self.recording.ops[op_id] = OpInfo(
                op_id=op_id,
                key=key,
                op_type=op_type,
                op_name="",
                graph="",
                device=device or "",
                location=location,
                dtypes=[t.dtype.name for t in out_tensors],
                shapes=[list(t.shape) for t in out_tensors],
                digestible=[d is not None for d in out_digests],
                stateful=op_def is not None and op_def.is_stateful,
                attrs=_interesting_attrs(attrs),
                note=note,
                resource=_eager_resource(op_type, inputs),
                function=_function_state(op_type),
                rerun=blocker,
            )
            if self.recording.ops[op_id].function == "uninstrumented":
                self.recording.warnings.append(
                    f"Function {op_type} ran uninstrumented: it was traced before "
                    "nddebug.trace() was entered, so only its inputs and outputs are compared. "
                    "Create or first call the tf.function inside the block, or use "
                    "nddebug.check(), which retraces it."
                )
        seq = next(self._seq)
        ev = Event(
            seq=seq,
            op_id=op_id,
            call=seq,
            digests=out_digests,
            inputs=in_digests,
            shapes=[list(t.shape) for t in out_tensors],
        )
        capture = bool(self.capture and key in self.capture)
        if capture:
            for slot, t in enumerate(out_tensors):
                if out_digests[slot] is not None:
                    self.recording.values[f"{seq}:{slot}"] = np.array(t.numpy())
        if self.rerun and not blocker:
            ev.reruns = self._rerun_eager(op_type, inputs, attrs, out_tensors, ev, capture)
        with self._lock:
            if _FUNCTION_CALL.match(op_type):
                device = self.recording.ops[op_id].device
                for pending in self._pending:
                    pending.call = seq
                    self.recording.events.append(pending)
                    inner = self.recording.ops[pending.op_id]
                    if not inner.device and device:
                        # Graph ops are placed after tracing: the function's device stands in.
                        inner.device = device
                self._pending.clear()
            self.recording.events.append(ev)

    def _rerun_eager(
        self, op_type: str, inputs: Any, attrs: Any, outputs: list[Any], ev: Event, capture: bool
    ) -> list[list[dg.Digest | None]]:
        """Execute the op again, at once, on the very same input tensors and device. Both
        values are still at hand, so those of a divergent output are kept to measure it."""
        import tensorflow as tf
        from tensorflow.python.eager import context, execute

        # The eager fast path reports unset optional attrs as None: leave those to defaults.
        pairs = zip(attrs[::2], attrs[1::2], strict=False) if attrs else ()
        flat = tuple(x for k, v in pairs if v is not None for x in (k, v))
        reruns = []
        results = []
        with tf.device(outputs[0].device or None):
            for _ in range(self.rerun):
                again = execute.quick_execute(
                    op_type, len(outputs), list(inputs), flat, context.context()
                )
                results.append(again)
                reruns.append([digest_eager_tensor(t) for t in again])
        for slot, digest in enumerate(ev.digests):
            if digest is None or not (capture or any(r[slot] != digest for r in reruns)):
                continue
            self.recording.values[f"{ev.seq}:{slot}"] = np.array(outputs[slot].numpy())
            for j, again in enumerate(results, start=1):
                self.recording.values[f"{ev.seq}:{slot}@{j}"] = np.array(again[slot].numpy())
        return reruns

    def _eager_location(self) -> tuple[str, str]:
        """Where in user code the op ran, and the same without the directory."""
        frame = sys._getframe(3)
        while frame is not None:
            code = frame.f_code
            if _is_user_file(code.co_filename, self._lib_dirs):
                name = os.path.basename(code.co_filename)
                return (
                    _format_location(code.co_filename, frame.f_lineno, code.co_name),
                    _format_location(name, frame.f_lineno, code.co_name),
                )
            frame = frame.f_back
        return "", ""

    def record_variables(self, variables: list[Any]) -> None:
        """Digest the values of variables as pseudo-ops ("VariableState"), so a check compares
        the state a step leaves even where the ops that wrote it were not recorded."""
        with _inside_nddebug():
            for var in variables:
                value = var.read_value() if hasattr(var, "read_value") else var
                key = f"state:{var.name}"
                op_id = self._eager_sites.get(key)
                if op_id is None:
                    op_id = self._eager_sites[key] = REGISTRY.new_id()
                    self.recording.ops[op_id] = OpInfo(
                        op_id=op_id,
                        key=key,
                        op_type="VariableState",
                        op_name=var.name,
                        graph="",
                        device=value.device or "",
                        location="",
                        dtypes=[value.dtype.name],
                        shapes=[list(value.shape)],
                        digestible=[True],
                        note="value of the variable after the step",
                        resource=key,
                    )
                seq = next(self._seq)
                ev = Event(seq, op_id, seq, [self._digest_eager(value)], [], [list(value.shape)])
                if self.capture and key in self.capture:
                    self.recording.values[f"{seq}:0"] = np.array(value.numpy())
                with self._lock:
                    self.recording.events.append(ev)

    # ------------------------------------------------------------------ graph events
    def on_graph_event(
        self, op_id: int, outs: np.ndarray, ins: np.ndarray, values: tuple[np.ndarray, ...] = ()
    ) -> None:
        op = REGISTRY.ops.get(op_id)
        if op is None:
            return
        slots = [i for i, readable in enumerate(op.digestible) if readable]
        k, host = REGISTRY.reruns.get(op_id, (0, False))
        ev = Event(
            seq=next(self._seq),
            op_id=op_id,
            call=-1,
            digests=[None] * len(op.digestible) if host else _unpack(outs.tolist(), op.digestible),
            inputs=[(int(row[0]), int(row[1])) for row in ins.tolist()],
        )
        kept: dict[str, np.ndarray] = {}
        if host:
            _host_digests(ev, slots, k, values, kept)
        elif k:
            ev.reruns = _rerun_digests(op, ev, slots, k, values, kept)
        else:
            for slot, value in zip(slots, values, strict=False):
                kept[f"{ev.seq}:{slot}"] = np.array(value)
        with self._lock:
            if op_id not in self.recording.ops:
                self.recording.ops[op_id] = dataclasses.replace(op)  # this run's copy
            self._pending.append(ev)
            self.recording.values.update(kept)


def _host_digests(
    ev: Event, slots: list[int], k: int, arrays: tuple[np.ndarray, ...], kept: dict[str, np.ndarray]
) -> None:
    """Rerun mode on the CPU: the graph handed over each output and its k copies (zero-copy
    views of host memory), so they are compared and digested here, and the graph carries no
    digest ops. The inputs were the same tensors for all copies by construction."""
    ev.inputs = []
    reruns: list[list[dg.Digest | None]] = [list(ev.digests) for _ in range(k)]
    for i, slot in enumerate(slots):
        original, *copies = arrays[i * (k + 1) : (i + 1) * (k + 1)]
        ev.digests[slot] = d = dg.digest_numpy(original)
        for j, copy in enumerate(copies):
            if _same_bits(original, copy):
                reruns[j][slot] = d
                continue
            reruns[j][slot] = dg.digest_numpy(copy)
            kept[f"{ev.seq}:{slot}"] = np.array(original)  # the buffers are TensorFlow's
            for m, c in enumerate(copies, start=1):
                kept[f"{ev.seq}:{slot}@{m}"] = np.array(c)
    if k:
        ev.reruns = reruns


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.itemsize == 0 or not a.size:
        return True
    return bool(
        np.array_equal(
            np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
        )
    )


def _rerun_digests(
    op: OpInfo,
    ev: Event,
    slots: list[int],
    k: int,
    payload: tuple[np.ndarray, ...],
    kept: dict[str, np.ndarray],
) -> list[list[dg.Digest | None]]:
    """The copies' digests from their payload: per output, the original's bytes and each
    copy's, all empty unless some copy differed (see _rerun_payload). The bytes of a divergent
    output are kept as values, to measure the divergence with no second pass."""
    import tensorflow as tf

    reruns: list[list[dg.Digest | None]] = [list(ev.digests) for _ in range(k)]
    for i, slot in enumerate(slots):
        original, *copies = payload[i * (k + 1) : (i + 1) * (k + 1)]
        if not original.size:
            continue  # every copy equalled the original
        dtype = tf.as_dtype(op.dtypes[slot]).as_numpy_dtype
        kept[f"{ev.seq}:{slot}"] = np.frombuffer(original.tobytes(), dtype)
        for j, data in enumerate(copies, start=1):
            if data.size:
                reruns[j - 1][slot] = dg.digest_numpy(data)
                kept[f"{ev.seq}:{slot}@{j}"] = np.frombuffer(data.tobytes(), dtype)
            else:
                kept[f"{ev.seq}:{slot}@{j}"] = kept[f"{ev.seq}:{slot}"]
    return reruns


def _unpack(values: list[list[int]], mask: list[bool]) -> list[dg.Digest | None]:
    it = iter(values)
    return [tuple(next(it)) if readable else None for readable in mask]


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _attr(attrs: Any, name: str) -> Any:
    if not attrs:
        return None
    items = attrs.items() if isinstance(attrs, dict) else zip(attrs[::2], attrs[1::2], strict=False)
    for k, v in items:
        if k == name:
            return v
    return None


def _dtype_attr(attrs: Any) -> Any:
    import tensorflow as tf

    value = _attr(attrs, "T")
    if value is None:
        value = _attr(attrs, "dtype")
    if value is None:
        return None
    return tf.as_dtype(getattr(value, "type", value))


def _op_def(op_type: str) -> Any:
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op_type)


def _rerun_blocker(
    op_type: str, stateful: bool, n_inputs: int, out_digests: list[Any], writes: bool
) -> str:
    """Why an op is not re-executed in rerun mode ("" if it is): running a stateful op again
    would change the state the step goes on with (a random generator, a variable, an
    iterator), so only repeated steps can compare those."""
    if stateful or writes:
        return "stateful"
    if op_type in CALL_OPS or _FUNCTION_CALL.match(op_type):
        return RERUN_INNER
    if not n_inputs:
        return "no inputs"
    if not any(d is not None for d in out_digests):
        return "no readable output"
    return ""


def _reads_or_writes_variable(op_type: str) -> bool:
    return op_type == "ReadVariableOp" or bool(_WRITER.match(op_type))


def _eager_resource(op_type: str, inputs: Any) -> str:
    if not inputs or not _reads_or_writes_variable(op_type):
        return ""
    return f"eager:{getattr(inputs[0], '_id', '?')}"


def _function_state(op_type: str) -> str:
    if not _FUNCTION_CALL.match(op_type):
        return ""
    return "instrumented" if op_type in REGISTRY.instrumented_functions else "uninstrumented"


def _interesting_attrs(attrs: Any) -> dict[str, Any]:
    out = {}
    for name in ("seed", "seed2"):
        v = _attr(attrs, name)
        if v is not None:
            out[name] = int(getattr(v, "i", v))
    return out


def _warn_once(recording: Recording, message: str) -> None:
    if message not in recording.warnings:
        recording.warnings.append(message)


def _is_v1_graph(graph: Any) -> bool:
    from tensorflow.python.framework import ops

    return not ops.executing_eagerly_outside_functions() or not hasattr(graph, "outer_graph")


@functools.cache
def _default_device() -> str:
    """Where ops without outputs ran: TensorFlow's first device (a GPU when there is one)."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return (gpus[0] if gpus else tf.config.list_logical_devices("CPU")[0]).name


def _is_data_graph(graph: Any) -> bool:
    """tf.data function bodies run on tf.data's threads, ahead of the step (prefetch): their
    execution count at any moment is timing-dependent, so they are compared through the
    iterator's outputs instead."""
    name = getattr(graph, "name", "") or ""
    return name.startswith("Dataset_") or "_Dataset_" in name


def digest_eager_tensor(tensor: Any) -> dg.Digest | None:
    """Digest an eager tensor where it lives: host tensors in numpy (zero-copy view), device
    tensors with TF kernels on the device."""
    import tensorflow as tf

    try:
        dtype = tensor.dtype
    except AttributeError:
        return None
    if not dg.digestible(dtype):
        return None
    device = getattr(tensor, "device", "") or ""
    if "GPU" not in device.upper() and "TPU" not in device.upper():
        try:
            return dg.digest_numpy(tensor.numpy())
        except (TypeError, ValueError, tf.errors.OpError):
            pass
    with tf.device(device or None):
        fn = dg.eager_digest_fn(dtype, tuple(tensor.shape), dg.use_matmul_for(device))
        values = fn(tensor).numpy()
    return int(values[0]), int(values[1])


def _written_value(op_type: str, inputs: Any) -> Any:
    """A plain assignment writes exactly its value input's bits: that is the value after it."""
    return inputs[1] if op_type == "AssignVariableOp" and len(inputs) > 1 else None


def _read_variable(handle: Any, dtype: Any) -> Any:
    if dtype is None:
        return None
    from tensorflow.python.ops import gen_resource_variable_ops

    try:
        return gen_resource_variable_ops.read_variable_op(handle, dtype)
    except Exception:  # noqa: BLE001 - a handle we cannot read is simply not digested
        return None


# ---------------------------------------------------------------------- graph instrumentation


def _receive(op_id: np.ndarray, outs: np.ndarray, ins: np.ndarray, *values: np.ndarray) -> None:
    rec = Recorder.active
    if rec is not None:
        rec.on_graph_event(int(op_id), outs, ins, values)


def _in_xla(graph: Any) -> bool:
    from tensorflow.python.ops import control_flow_util

    try:
        return bool(control_flow_util.GraphOrParentsInXlaContext(graph))
    except Exception:  # noqa: BLE001 - an unknown graph type is not XLA
        return False


def _graph_key(graph: Any) -> str:
    names = []
    g = graph
    while g is not None and hasattr(g, "name"):
        names.append(_UID_SUFFIX.sub("", _as_str(g.name)))
        g = getattr(g, "outer_graph", None)
    return "/".join(reversed(names))


def _graph_location(op: Any, lib_dirs: tuple[str, ...]) -> str:
    try:
        frames = op.traceback
    except Exception:  # noqa: BLE001
        return ""
    for frame in reversed(list(frames)):
        if _is_user_file(frame.filename, lib_dirs):
            return _format_location(frame.filename, frame.lineno, frame.name)
    return ""


def _digest_tensor_in_graph(graph: Any, tensor: Any) -> Any:
    """The digest tensor of ``tensor`` in ``graph``, built once per tensor."""
    import tensorflow as tf

    cache = REGISTRY.graph_digests.setdefault(graph, {})
    name = tensor.name
    if name in cache:
        return cache[name]
    d = None
    if dg.digestible(tensor.dtype):
        with tf.name_scope("nddebug"):
            d = dg.build_digest(tensor, dg.use_matmul_for(tensor.device), _graph_gate(graph))
    cache[name] = d
    return d


_GATE: Any = None


def gate() -> Any:
    """A process-wide switch read by every instrumented graph: outside trace() it is off, and
    an instrumented function then skips the heavy part of its digests, so a function first
    traced inside a trace block does not stay slow after it."""
    global _GATE
    if _GATE is None:
        import tensorflow as tf
        from tensorflow.python.eager import context

        # Eagerly, even when the first trace starts inside a TF1 graph's as_default().
        with context.eager_mode(), tf.device("/CPU:0"), _inside_nddebug():
            _GATE = tf.Variable(False, trainable=False, name="nddebug_active")
    return _GATE


def _set_gate(on: bool) -> None:
    from tensorflow.python.eager import context

    with context.eager_mode():
        gate().assign(on)


def _graph_gate(graph: Any) -> Any:
    """The gate as int32 0/1, read once per graph (per loop iteration in a loop body)."""
    import tensorflow as tf

    cache = REGISTRY.graph_digests.setdefault(graph, {})
    if "<gate>" not in cache:
        cache["<gate>"] = tf.cast(gate().read_value(), tf.int32)
    return cache["<gate>"]


def _instrument_graph_op(
    rec: Recorder,
    op_type: str,
    inputs: Any,
    attrs: Any,
    outputs: Any,
    op_name: str | None,
    graph: Any,
) -> None:
    import tensorflow as tf

    if op_type in SKIP_OPS:
        return
    if _in_xla(graph):
        REGISTRY.xla_graphs.add(graph)
        name = _as_str(graph.name)
        warning = (
            f"{name} is compiled with XLA (jit_compile=True): XLA cannot hold nddebug's host "
            "callbacks, so its inner ops are not recorded, only its inputs and outputs. Set "
            "jit_compile=False on it while debugging (check() does that only for the function "
            "and the Keras models it is given)."
        )
        _warn_once(rec.recording, warning)
        return
    cache = REGISTRY.graph_digests.setdefault(graph, {})
    alias = ALIAS_OPS.get(op_type, -1)
    host = bool(rec.rerun) and _on_host(outputs[0].device if outputs else "")
    if alias != -1 and host:
        return  # rerun mode on the host digests no inputs: nothing to pass through
    if alias != -1:
        # Pass-through: consumers see the producer's digest; nothing runs.
        for i, out in enumerate(outputs):
            src = inputs[i if alias is None else alias] if inputs else None
            if src is not None:
                cache[out.name] = _digest_tensor_in_graph(graph, src)
        return
    op = outputs[0].op if outputs else None
    if (op is None or _as_str(op.type) != op_type) and op_name:
        # Another op callback (e.g. nddebug.emulate_gpu) may have replaced the outputs.
        op = graph.get_operation_by_name(op_name)
    out_tensors = list(outputs)
    note = ""
    written = _written_value(op_type, inputs) if not out_tensors else None
    if written is not None:
        out_tensors = [written]  # digested already as the input: no read-back, no new digest
        note = "value of the variable after this update"
    elif not out_tensors and _WRITER.match(op_type) and inputs:
        dtype = _dtype_attr(attrs)
        if dtype is not None:
            from tensorflow.python.ops import gen_resource_variable_ops

            with tf.control_dependencies([op]), tf.name_scope("nddebug"):
                out_tensors = [gen_resource_variable_ops.read_variable_op(inputs[0], dtype)]
            note = "value of the variable after this update"
    if op_type in ("Const", "Placeholder") and not note:
        # Constants are fixed by the graph; placeholders are digested by their consumers.
        return
    if host:
        # Rerun mode on the CPU: the host digests, so the graph needs no digest ops.
        out_digests: list[Any] = [True if dg.digestible(t.dtype) else None for t in out_tensors]
        in_digests: list[Any] = []
        readable_out: list[Any] = []
    else:
        in_digests = [_digest_tensor_in_graph(graph, t) for t in inputs]
        out_digests = [_digest_tensor_in_graph(graph, t) for t in out_tensors]
        readable_out = [d for d in out_digests if d is not None]
    readable_in = [d for d in in_digests if d is not None]
    stateful = bool(op._is_stateful) if hasattr(op, "_is_stateful") else False
    blocker = ""
    payload: list[Any] = []
    copies = 0
    if rec.rerun:
        blocker = _rerun_blocker(op_type, stateful, len(inputs), out_digests, bool(note))
        dups = [] if blocker else _duplicates(graph, op, inputs, rec.rerun)
        copies = len(dups)
        for slot, (t, d) in enumerate(zip(out_tensors, out_digests, strict=False)):
            if d is None:
                continue
            again = [dup.outputs[slot] for dup in dups]
            if host:
                payload += [t, *again]
            elif dups:
                payload += _rerun_payload(t, again)
    op_id = REGISTRY.new_id()
    base = f"{_graph_key(graph)}/{_UID_IN_NAME.sub('', op.name)}"
    seen = REGISTRY.graph_keys.setdefault(graph, {})
    count = seen.get(base, 0)
    seen[base] = count + 1
    key = base if count == 0 else f"{base}#{count}"
    info = OpInfo(
        op_id=op_id,
        key=key,
        op_type=op_type,
        op_name=op.name,
        graph=_as_str(graph.name),
        device=op.device or "",
        location=_graph_location(op, rec._lib_dirs),
        dtypes=[t.dtype.name for t in out_tensors],
        shapes=[t.shape.as_list() if t.shape.rank is not None else None for t in out_tensors],
        digestible=[d is not None for d in out_digests],
        stateful=stateful,
        attrs=_interesting_attrs(attrs),
        note=note,
        rerun=blocker,
        resource=(
            f"{_graph_key(graph)}:{inputs[0].name}"
            if inputs and _reads_or_writes_variable(op_type)
            else ""
        ),
    )
    with REGISTRY.lock:
        REGISTRY.ops[op_id] = info
        if payload:
            REGISTRY.reruns[op_id] = (copies, host)
    if op_type in ("StatefulPartitionedCall", "PartitionedCall"):
        f = _attr(attrs, "f")
        fname = _as_str(getattr(f, "name", "")) if f is not None else ""
        if fname and fname not in REGISTRY.instrumented_functions:
            _warn_once(
                rec.recording,
                f"Graph {graph.name} calls function {fname}, traced before nddebug.trace(): its "
                "inner ops are not recorded, only its outputs.",
            )
    if not readable_out and not readable_in and not payload:
        return
    captured = payload
    if rec.capture and key in rec.capture and not payload:
        captured = [t for t, d in zip(out_tensors, out_digests, strict=False) if d is not None]

    with tf.name_scope("nddebug"):
        outs = tf.stack(readable_out) if readable_out else tf.zeros([0, 2], tf.int64)
        ins = tf.stack(readable_in) if readable_in else tf.zeros([0, 2], tf.int64)
        args = [tf.constant(op_id, tf.int64), outs, ins, *captured]
        tf.numpy_function(_receive, args, Tout=[], stateful=True)


def _duplicates(graph: Any, op: Any, inputs: Any, k: int) -> list[Any]:
    """k copies of ``op`` on the very same input tensors, for rerun mode. Nothing consumes
    them but their digests, so the graph computes what it computed before. Each copy waits
    for the previous one (control edge) and differs from it by an attribute, so grappler's
    common-subexpression elimination cannot merge them back into one."""
    from tensorflow.core.framework import attr_value_pb2

    cache = REGISTRY.graph_digests.setdefault(graph, {})
    name = f"<rerun>{op.name}"
    if name in cache:
        return cache[name]
    attrs = {k_: op.node_def.attr[k_] for k_ in op.node_def.attr}
    dups = []
    prev = op
    for j in range(1, k + 1):
        attrs["_nddebug_rerun"] = attr_value_pb2.AttrValue(i=j)
        with graph.control_dependencies([prev]), graph.name_scope("nddebug"):
            # Graph.create_op, the public spelling, is deprecated and warns on every call.
            dup = graph._create_op_internal(
                op.type,
                list(inputs),
                [t.dtype for t in op.outputs],
                attrs=dict(attrs),
                name=f"rerun{j}_{op.name.rsplit('/', 1)[-1]}",
            )
        if op.device:
            dup._set_device(op.device)
        dups.append(dup)
        prev = dup
    cache[name] = dups
    return dups


_WORD = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def _on_host(device: str) -> bool:
    """Whether a graph op's outputs live in host memory, where the host reads them for free."""
    if device:
        return "CPU" in device.upper()
    return not dg.gpu_present()


def _rerun_payload(original: Any, copies: list[Any]) -> list[Any]:
    """What the host needs to compare an output with its copies' outputs: the bytes of the
    original and of each copy, sliced to nothing unless some copy differs. A bitwise compare
    is a few ops where a digest per copy is tens, and a divergent op (rare) brings its values
    along, to be measured."""
    import tensorflow as tf

    with tf.name_scope("nddebug"):
        word = _WORD.get(original.dtype.size) if original.dtype != tf.bool else None

        def bits(t: Any) -> Any:
            return tf.bitcast(t, word) if word and t.dtype != word else dg.byte_view(t)

        a = bits(original)
        differs = [tf.reduce_any(tf.not_equal(a, bits(c))) for c in copies]
        raw = [dg.byte_view(t) for t in (original, *copies)]
        length = tf.size(raw[0])
        any_differs = tf.cast(tf.reduce_any(tf.stack(differs)), tf.int32)
        out = [raw[0][: length * any_differs]]
        out += [r[: length * tf.cast(d, tf.int32)] for r, d in zip(raw[1:], differs, strict=True)]
    return out


# ---------------------------------------------------------------------- public entry point


@contextlib.contextmanager
def trace(
    label: str = "", path: str | None = None, rerun: int = 0, emulate_gpu: bool = False
) -> Iterator[Recording]:
    """Record every TensorFlow op executed in the block.

    ``with nddebug.trace() as rec:`` gives the :class:`Recording`, filled when the block ends;
    with ``path`` the run is also appended to that recording file. With ``rerun=k`` every
    stateless op also runs k more times on its own inputs (eagerly at once; in graphs as
    copies of the node), and ``nddebug.compare([rec])`` reports the ops whose re-executions
    differ: kernel non-determinism found in a single step, with no state to restore. With
    ``emulate_gpu`` the block also runs under :func:`nddebug.emulate_gpu`.
    """
    if emulate_gpu or os.environ.get(EMULATE_ENV) == "1":
        from nddebug import emulate

        if not emulate.is_active():
            with emulate.emulate_gpu(), trace(label, path, rerun) as rec:
                yield rec
            return
    if rerun < 0:
        raise ValueError(f"rerun must be a number of extra executions >= 0, got {rerun}")
    from nddebug import environment

    # `nddebug run` asks every trace block of the script it runs to save into one file.
    if path is None and os.environ.get(RECORD_ENV):
        path = os.environ[RECORD_ENV]
        label = label or os.environ.get(LABEL_ENV, "")
    rec = Recording(label=label, digest_algorithm=dg.ALGORITHM, kind="rerun" if rerun else "run")
    rec.environment = environment.capture()
    recorder = Recorder(rec, rerun=rerun)
    recorder.start()
    try:
        yield rec
    except BaseException:
        rec.status = "interrupted"
        raise
    finally:
        recorder.stop()
        if not rec.events:
            rec.warnings.append(
                "No TensorFlow op ran inside the block: nothing was recorded. Put the training "
                "step itself (not only the model construction) inside nddebug.trace()."
            )
        if path is not None:
            rec.save(path)
