"""Eager ops: digested when the op callback sees them, in host memory when they live there.

Eager executions are keyed by op type and user-code site (file name, line, function), so the
same op matches across processes and machines. A tf.function call is an eager op too: the graph
events that arrived while it ran are attributed to it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from nddebug import digest as dg
from nddebug import native
from nddebug.recording import (
    BATCHES_PER_CALL,
    CALL_WRITES,
    DATASET_PASSES,
    DATASET_STAGES,
    INPUT_FORM,
    NOT_COMPARED,
    OPAQUE,
    STATE_READERS,
    UPDATE_NOTE,
    Event,
    OpInfo,
    restored_function,
)
from nddebug.tracer import datasets, opaque, ops, rerun, undefined
from nddebug.tracer.location import eager_location, keras_steps_per_execution, library_callers
from nddebug.tracer.registry import REGISTRY, inside_nddebug


def digest_host(array: np.ndarray) -> dg.Digest:
    """A host array's digest: by the native code in place when it is loaded, else NumPy."""
    lib = native.load() if native.enabled() else None
    if lib is not None:
        return lib.digest_array(dg.read_as(array))
    return dg.digest_numpy(array)


def digest_eager_tensor(tensor: Any) -> dg.Digest | None:
    """Digest an eager tensor where it lives (see :func:`digest_eager_tensors`)."""
    return digest_eager_tensors([tensor])[0]


def digest_eager_tensors(tensors: Any) -> list[dg.Digest | None]:
    """Digest eager tensors where they live: host tensors in numpy (zero-copy views), device
    tensors with TF kernels on their device, all of one device in one call (None for a
    tensor that cannot be digested)."""
    import tensorflow as tf

    out: list[dg.Digest | None] = [None] * len(tensors)
    on_device: dict[str, list[tuple[int, Any]]] = {}
    for i, tensor in enumerate(tensors):
        dtype = getattr(tensor, "dtype", None)
        if dtype is None or not dg.digestible(dtype):
            continue
        device = getattr(tensor, "device", "") or ""
        if not _on_accelerator(tensor):
            try:
                array = tensor.numpy()
            except (TypeError, ValueError, tf.errors.OpError):
                array = None
            if array is not None:
                out[i] = digest_host(array)
                continue
        on_device.setdefault(device, []).append((i, tensor))
    for device, items in on_device.items():
        for (i, _), d in zip(items, device_digests(device, [t for _, t in items]), strict=True):
            out[i] = d
    return out


def _on_accelerator(tensor: Any) -> bool:
    device = (getattr(tensor, "device", "") or "").upper()
    return "GPU" in device or "TPU" in device


def device_digests(device: str, tensors: list[Any]) -> list[dg.Digest]:
    """The digests of tensors on one device, made there in one call with one copy of the
    [n, 2] result to the host: one native ``NddebugDigest`` op where the library runs on that
    device (the CPU, or a GPU whose kernels work), else a tf.function of TF ops. The native op
    is one kernel per tensor and nothing to trace; the tf.function is ~40 ops per tensor,
    traced anew for every new set of shapes (on a GPU, the step's eager digests were a third
    of what trace() added to a small CNN's step)."""
    import tensorflow as tf

    lib = native.load() if native.enabled() and _native_device(device) else None
    with tf.device(device or None):
        if lib is not None:
            values = lib.digest(_open_gate(), list(tensors)).numpy()
        else:
            specs = tuple((t.dtype, tuple(t.shape)) for t in tensors)
            fn = dg.eager_digests_fn(specs, dg.use_matmul_for(device))
            values = fn(*tensors).numpy()
    return [(int(v[0]), int(v[1])) for v in values]


def _native_device(device: str) -> bool:
    """Whether the native digest op has a kernel for ``device`` once the library loads (the
    library is only loaded where a GPU present has working kernels: see native.load)."""
    kind = (device or "CPU").upper()
    return "CPU" in kind or "GPU" in kind


@functools.cache
def _open_gate() -> Any:
    """The host int32 1 that switches NddebugDigest on, made once."""
    import tensorflow as tf

    with tf.device("/CPU:0"):
        return tf.constant(1, tf.int32)


def input_form(inputs: Any, attrs: Any = ()) -> dg.Digest:
    """The shapes of an eager op's inputs and its attributes, as one more input digest (the
    last). A digest is over bytes, and what Python hands an op besides tensors is part of
    its inputs too: the same bytes from NumPy in another shape, or ``alpha=0.2`` in one run
    and ``0.3`` in the next (see :func:`ops.attrs_form`), made the inputs look identical,
    and the op was named a source, "the kernel itself is non-deterministic". (A graph op's
    attributes are compared through ``OpInfo.attrs["form"]``; it needs no shapes: a shape
    that differs there comes from a tensor, which is compared.)"""
    shapes = ";".join(",".join(map(str, getattr(t, "shape", ()))) for t in inputs)
    code = ops.form_code(f"{shapes}|{ops.attrs_form(attrs)}")
    return int.from_bytes(bytes.fromhex(code), "little", signed=True), INPUT_FORM


def read_variable(handle: Any, dtype: Any) -> Any:
    if dtype is None:
        return None
    from tensorflow.python.ops import gen_resource_variable_ops

    try:
        return gen_resource_variable_ops.read_variable_op(handle, dtype)
    except Exception:  # noqa: BLE001 - a handle we cannot read is simply not digested
        return None


def _digest(rec: Any, tensor: Any) -> dg.Digest | None:
    """An eager tensor's digest, computed once per tensor for the block."""
    tid = getattr(tensor, "_id", None)
    if tid is not None and tid in rec.eager_digests:
        return rec.eager_digests[tid]
    d = digest_eager_tensor(tensor)
    if tid is not None:
        rec.eager_digests[tid] = d
    return d


def _prefetch(rec: Any, tensors: list[Any]) -> None:
    """Digest an op's device tensors not digested yet in one go: one call and one copy to
    the host for them all, instead of one each (each copy waits for the device's queued
    work). Host tensors are left to :func:`_digest`, as they come."""
    todo = []
    for t in tensors:
        tid = getattr(t, "_id", None)
        if tid is not None and tid not in rec.eager_digests and _on_accelerator(t):
            todo.append(t)
    if len(todo) > 1:
        for t, d in zip(todo, digest_eager_tensors(todo), strict=True):
            rec.eager_digests[t._id] = d


#: Ops that bind a dataset to an iterator (input 0 the dataset, the iterator a resource
#: input), and ops that take the iterator's next element.
_BINDS_ITERATOR = frozenset({"MakeIterator"})
_READS_ITERATOR = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional"})


def _lineage_digest(op_type: str, in_digests: list[dg.Digest]) -> dg.Digest:
    """A stand-in digest for what an op made that cannot be read (a dataset, an optional, a
    tensor list: variants), made from the op and its input digests: equal inputs give an
    equal one."""
    import hashlib

    raw = hashlib.blake2b(f"{op_type}|{in_digests!r}".encode(), digest_size=16).digest()
    lo, hi = np.frombuffer(raw, dtype="<i8")
    return int(lo), int(hi)


#: A dataset op's seed inputs: left out of its stand-in digest. Seeds that differ make the
#: pipeline's order differ, which its iterator's reads show and name as an input pipeline
#: (with the advice to seed it); the values a dataset is built from are what the stand-in
#: carries on.
_SEED_ARGS = frozenset({"seed", "seed2"})


def _lineage_inputs(rec: Any, op_type: str, inputs: Any, in_digests: list[Any]) -> list[Any]:
    """The input digests a variant's stand-in digest is made from: all of them, but a dataset
    op's seeds (see _SEED_ARGS)."""
    op_def = ops.op_def(op_type)
    names = [a.name for a in op_def.input_arg] if op_def is not None else []
    if len(names) != len(inputs) or not _SEED_ARGS.intersection(names):
        return in_digests
    pairs = zip(names, inputs, strict=True)
    kept = [_digest(rec, t) for name, t in pairs if name not in _SEED_ARGS]
    return [d for d in kept if d is not None]


def _variant_lineage(
    rec: Any, op_type: str, outputs: list[Any], inputs: Any, in_digests: list[Any]
) -> None:
    """Give the variants an eager op made (a dataset, an optional) a stand-in digest that
    their readers take as an input: a dataset built from values that differ is then seen to
    differ, and so is what is built on it, down to the iterator that hands out its elements.
    Its elements were otherwise named a source (inputs identical, output not) downstream of
    the op that made the values (an unseeded random op feeding from_tensor_slices)."""
    lineage = None
    for t in outputs:
        tid = getattr(t, "_id", None)
        if tid is not None and t.dtype.name == "variant" and rec.eager_digests.get(tid) is None:
            if lineage is None:
                kept = _lineage_inputs(rec, op_type, inputs, in_digests)
                lineage = _lineage_digest(op_type, kept)
            rec.eager_digests[tid] = lineage


def _pipeline_inputs(rec: Any, op_type: str, inputs: Any, in_digests: list[Any]) -> None:
    """An iterator's next element comes from the dataset bound to it: the dataset's stand-in
    digest (see _variant_lineage), taken when it was bound, is one of the read's inputs."""
    if op_type not in _BINDS_ITERATOR and op_type not in _READS_ITERATOR:
        return
    handle = ops.state_input(op_type, inputs)
    if handle is None:
        return
    identity = ops.eager_identity(handle)
    if op_type in _BINDS_ITERATOR:
        rec.iterator_datasets[identity] = _lineage_digest(op_type, in_digests)
    elif identity in rec.iterator_datasets:
        in_digests.append(rec.iterator_datasets[identity])


def _note_dataset(rec: Any, op: OpInfo, inputs: Any) -> None:
    """What in the dataset an iterator is being bound to can make its elements differ, kept
    per iterator on the binding op (every binding: one line of code can bind iterators to
    several datasets), to be named with the iterator's reads where the pipeline differs."""
    _keep_stages(op, _resource("MakeIterator", inputs), datasets.dataset_of(inputs[0]))


def _note_read_dataset(rec: Any, op: OpInfo, inputs: Any) -> None:
    """The same for an iterator the block did not see bound (made before it), kept on its
    first read in the block: found through the iterator object reading it."""
    handle = ops.state_input(op.op_type, inputs)
    identity = ops.eager_identity(handle) if handle is not None else ""
    if not identity or identity in rec.iterator_datasets or identity in rec.iterators_examined:
        return
    rec.iterators_examined.add(identity)
    dataset = datasets.iterator_dataset(getattr(handle, "_id", None))
    _keep_stages(op, identity, dataset, bound=False)


def _keep_stages(op: OpInfo, iterator: str, dataset: Any, bound: bool = True) -> None:
    """Keep on ``op`` what in ``dataset`` can make the elements of ``iterator`` differ; and,
    where the iterator was ``bound`` in the block (a new pass begins), the seeded reshuffles
    its dataset makes on every pass (an iterator made before reads on in one pass)."""
    stages = datasets.dataset_stages(dataset) if dataset is not None and iterator else []
    if stages or (dataset is not None and iterator and datasets.read_through(dataset)):
        # [] too where the dataset was read through: none of them is there
        op.attrs.setdefault(DATASET_STAGES, {})[iterator] = stages
    passes = datasets.reshuffles(dataset) if bound and dataset is not None and iterator else {}
    if passes:
        op.attrs.setdefault(DATASET_PASSES, {})[iterator] = passes


def _resource(op_type: str, inputs: Any) -> str:
    state = ops.state_input(op_type, inputs)
    return "" if state is None else ops.eager_identity(state)


def on_eager(rec: Any, op_type: str, inputs: Any, attrs: Any, outputs: Any) -> None:
    """Record one eager op execution (and, for a function call, the graph events it ran)."""
    if op_type in ops.SKIP_OPS:
        return
    if rec.unheld is not None:  # check()'s run: a variable written eagerly
        rec.unheld.after_eager(op_type, inputs, outputs)
    if rec.unopened:
        _read_unopened(rec, op_type, inputs, outputs)
    location, site = eager_location(rec.lib_dirs)
    # TF names a function's call op after the function plus a process-specific number;
    # the site is file name, line and function, so keys match across machines too.
    key = f"eager:{ops.UID_SUFFIX.sub('', op_type)}@{site}"
    if ops.FUNCTION_CALL.match(op_type):
        # A library's call (Keras's fit, or the evaluate fit makes for validation, each
        # calling a function named multi_step_on_iterator from the same line of the user's
        # code) is told apart by the library functions that made it.
        callers = library_callers(rec.lib_dirs)
        if callers:
            key += f" via {callers}"
    alias = ops.ALIAS_OPS.get(op_type, -1)
    resource = _resource(op_type, inputs) if alias == -1 else ""
    if resource and (op_type in STATE_READERS or ops.WRITER.match(op_type)):
        # One line can act on many variables (an optimizer's loop over them): each gets its
        # own op, so that a read is linked to the writes of its own variable. Numbered by
        # first use at this site, the same in every run of the program. (Not iterators or
        # generators: a loop that makes a new iterator every step stays one op.)
        seen = rec.eager_site_resources.setdefault(key, {})
        n = seen.setdefault(resource, len(seen))
        if n:
            key = f"{key}&{n}"
    if alias != -1:
        for i, out in enumerate(outputs):
            src = inputs[i if alias is None else alias] if inputs else None
            if src is not None and getattr(out, "_id", None) is not None:
                rec.eager_digests[out._id] = _digest(rec, src)
        return
    _prefetch(rec, [*inputs, *outputs])
    in_digests = [d for d in (_digest(rec, t) for t in inputs) if d is not None]
    called = bool(ops.FUNCTION_CALL.match(op_type))
    if inputs or attrs:  # a call's attributes only configure how it runs
        in_digests.append(input_form(inputs, () if called else attrs))
    _pipeline_inputs(rec, op_type, inputs, in_digests)
    out_tensors = list(outputs)
    note = ""
    function = opaque.function_kind(op_type) if called else ""
    variables = opaque.variable_inputs(inputs) if function in OPAQUE else []
    before = rec.pre_call.pop(op_type) if function in OPAQUE else None
    for spot in REGISTRY.blind_spots.get(op_type, []) if function == "instrumented" else []:
        ops.warn_once(rec.recording, spot)
        written = REGISTRY.blind_variables.get((op_type, spot))
        if written:
            rec.blind_variables.setdefault(spot, set()).update(written)
    if function == "instrumented":
        rec.xla_functions.update(REGISTRY.xla_called.get(op_type, ()))
    if variables:
        # What the call can have changed: its variables after it, compared like outputs;
        # their values before it (read by the pre-call hook) count among its inputs.
        after = opaque.read_state(variables)
        if any(v is None for v in after):
            ops.warn_once(
                rec.recording,
                f"{NOT_COMPARED}some variables captured by {op_type} could not be read after "
                "the call: what it wrote to them is not compared.",
            )
        readable = [i for i, v in enumerate(after) if v is not None]
        variables = [variables[i] for i in readable]
        out_tensors += [after[i] for i in readable]
        if before is not None:
            in_digests += [d for d in before if d is not None]
    if not out_tensors and ops.WRITER.match(op_type) and inputs:
        value = ops.written_value(op_type, inputs)
        if value is None:
            value = read_variable(inputs[0], ops.dtype_attr(attrs))
        if value is not None:
            out_tensors = [value]
            note = UPDATE_NOTE
    if not out_tensors and not in_digests and not function:
        return  # a function call is kept: the graph rows it delivered are its step's
    after_write = bool(note)  # the output is a variable's value after this op wrote it
    at, why = undefined.undefined_outputs(op_type, attrs) if not after_write else ((), "")
    if at:
        note = why  # left undefined by the kernel: not digested (see tracer.undefined)
        for i in at:
            if i < len(out_tensors) and getattr(out_tensors[i], "_id", None) is not None:
                rec.eager_digests[out_tensors[i]._id] = None  # its readers: unreadable input
    out_digests = [None if i in at else _digest(rec, t) for i, t in enumerate(out_tensors)]
    _variant_lineage(rec, op_type, out_tensors, inputs, in_digests)
    _track_unopened(rec, op_type, inputs, out_tensors, bool(function))
    op_def = ops.op_def(op_type)
    stateful = op_def is None or op_def.is_stateful
    blocker = ""
    k_rerun = rec.rerun_for(key)
    if k_rerun:
        blocker = ops.rerun_blocker(op_type, stateful, len(inputs), out_digests, after_write)
    op_id = rec.eager_sites.get(key)
    if op_id is None:
        op_id = REGISTRY.new_id()
        rec.eager_sites[key] = op_id
        device = out_tensors[0].device if out_tensors else ops.default_device()
        rec.recording.ops[op_id] = OpInfo(
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
            attrs=ops.interesting_attrs(attrs),
            note=note,
            resource=resource,
            function=function,
            rerun=blocker,
            written=opaque.variable_names([h for h, _ in variables]) if variables else [],
        )
        if called and "Trainer." in key:  # Keras's train or test function, from fit etc.
            k = keras_steps_per_execution()
            if k:
                rec.recording.ops[op_id].attrs[BATCHES_PER_CALL] = k
        if variables:
            rec.recording.ops[op_id].attrs[CALL_WRITES] = [
                ops.eager_identity(h) for h, _ in variables
            ]
        if function == "xla":
            rec.recording.ops[op_id].attrs["ops_inside"] = list(opaque.ops_inside(op_type))
            rec.xla_functions.add(op_type)
        elif function == "uninstrumented":
            rec.recording.ops[op_id].attrs["ops_inside"] = list(opaque.ops_inside(op_type))
            ops.warn_once(
                rec.recording,
                f"Function {op_type} was restored from a SavedModel, so only its inputs, its "
                "outputs and the variables it captures are compared, not the ops inside it "
                "(nddebug has no Python code of it to retrace). To name an op inside, check the "
                "code the SavedModel was made from."
                if restored_function(op_type)
                else f"Function {op_type} ran uninstrumented: it was traced before "
                "nddebug.trace() was entered, so only its inputs, its outputs and the variables "
                "it captures are compared, not the ops inside it. Create or first call the "
                "tf.function inside the block, or give it to nddebug.check() as the step "
                "itself: check() retraces the function it is given, not the tf.functions that "
                "a Python step calls.",
            )
    seq = rec.next_seq()
    if op_type in _BINDS_ITERATOR and inputs:
        _note_dataset(rec, rec.recording.ops[op_id], inputs)
    elif op_type in _READS_ITERATOR and inputs:
        _note_read_dataset(rec, rec.recording.ops[op_id], inputs)
    ev = Event(
        seq=seq,
        op_id=op_id,
        call=seq,
        digests=out_digests,
        inputs=in_digests,
        shapes=[list(t.shape) for t in out_tensors],
    )
    capture = bool(rec.capture and key in rec.capture)
    if capture:
        for slot, t in enumerate(out_tensors):
            value = ops.kept_value(t.numpy()) if out_digests[slot] is not None else None
            if value is not None:
                rec.recording.values[f"{seq}:{slot}"] = value
    if k_rerun and not blocker:
        ev.reruns = rerun.rerun_eager(rec, op_type, inputs, attrs, out_tensors, ev, capture)
    rec.append(ev, call_device=rec.recording.ops[op_id].device if function else None)


def _pseudo_op(
    rec: Any,
    key: str,
    op_type: str,
    op_name: str,
    device: str,
    dtypes: list[str],
    shapes: list[Any],
    digestible: list[bool],
    note: str,
    resource: str = "",
    attrs: dict[str, Any] | None = None,
) -> int:
    """The op id of a pseudo-op check() records after the step (made on its first use)."""
    op_id = rec.eager_sites.get(key)
    if op_id is None:
        op_id = rec.eager_sites[key] = REGISTRY.new_id()
        rec.recording.ops[op_id] = OpInfo(
            op_id=op_id,
            key=key,
            op_type=op_type,
            op_name=op_name,
            graph="",
            device=device,
            location="",
            dtypes=dtypes,
            shapes=shapes,
            digestible=digestible,
            note=note,
            resource=resource,
            attrs=attrs or {},
        )
    return op_id


def _read_unopened(rec: Any, op_type: str, inputs: Any, outputs: Any) -> None:
    """An eager op read variants nddebug tracks as unopened: it takes their values out (or,
    an Identity, hands the same variant on)."""
    made_by = [rec.unopened.pop(getattr(t, "_id", None), None) for t in inputs]
    made_by = [m for m in made_by if m is not None]
    if made_by and op_type in ops.ALIAS_OPS:
        for t in outputs:
            if getattr(t, "dtype", None) is not None and t.dtype.name == "variant":
                rec.unopened[t._id] = made_by[0]


def _track_unopened(rec: Any, op_type: str, inputs: Any, outputs: list[Any], called: bool) -> None:
    """Keep track of variants whose values nddebug has not compared (an iterator's next
    element as an optional, made by an eager op or returned by a call) until an op reads the
    values out (see :func:`_read_unopened`); those still unread when the step returns or the
    block ends are said."""
    if op_type in opaque.UNOPENED_VARIANT_OPS or (
        called and opaque.returns_unopened_variant(op_type)
    ):
        for t in outputs:
            if t.dtype.name == "variant" and getattr(t, "_id", None) is not None:
                rec.unopened[t._id] = op_type


def unread_variants(what: str) -> str:
    """The warning for variants that leave what nddebug records unopened: a dataset or an
    optional (``get_next_as_optional``) holds values that differ from run to run as any
    tensor's can, but its bytes are a handle to them, not the values."""
    return (
        f"{NOT_COMPARED}{what} holds a tf.data dataset, an iterator or an optional "
        "(get_next_as_optional) whose values were not read in it: nddebug cannot read a "
        "variant's values, so they are not compared. Return or use the values themselves "
        "(optional.get_value(), the dataset's elements)."
    )


def record_return(rec: Any, value: Any) -> None:
    """Digest what the step returned, as a pseudo-op ("ReturnValue"): a value computed in
    Python (a float, a NumPy array) never passes through an op, so it is compared here.
    Composite values (ragged and sparse tensors) are compared through their component
    tensors; a dataset, or an optional whose values nothing read, is said not to be
    compared."""
    import tensorflow as tf

    if value is None:
        return
    with inside_nddebug():
        # A dataset, or an iterator over one (its order, a shuffle's, is read only later:
        # iter(ds.shuffle(5)) was "reproducible" though each call gave another order,
        # probe round 44, F3).
        datasets = [
            v for v in tf.nest.flatten(value) if isinstance(v, (tf.data.Dataset, tf.data.Iterator))
        ]
        flat = tf.nest.flatten(value, expand_composites=True)
        if datasets or any(getattr(t, "_id", None) in rec.unopened for t in flat):
            ops.warn_once(rec.recording, unread_variants("the step's return value"))
            for t in flat:
                rec.unopened.pop(getattr(t, "_id", None), None)
        digests, shapes, dtypes = [], [], []
        device = next((t.device for t in flat if getattr(t, "device", "")), "") or "/device:CPU:0"
        for item in flat:
            try:
                array = dg.host_array(item.numpy() if hasattr(item, "numpy") else item)
                digest = digest_host(array)
            except Exception:  # noqa: BLE001 - not a value we can read (objects other than
                # strings: a TypeError from the digest): said, not compared
                digests.append(None)
                shapes.append([])
                dtypes.append(type(item).__name__)
                continue
            digests.append(digest)
            shapes.append(list(array.shape))
            dtypes.append(str(array.dtype))
        if not flat:
            return
        op_id = _pseudo_op(
            rec,
            "return:step",
            "ReturnValue",
            "the step's return value",
            device,
            dtypes,
            shapes,
            [d is not None for d in digests],
            "what the step returned",
        )
        seq = rec.next_seq()
        rec.append(Event(seq, op_id, seq, digests, [], shapes))


def record_variables(rec: Any, variables: list[Any]) -> None:
    """Digest the values of variables as pseudo-ops ("VariableState"), so a check compares
    the state a step leaves even where the ops that wrote it were not recorded."""
    with inside_nddebug():
        for var in variables:
            value = var.read_value() if hasattr(var, "read_value") else var
            key = f"state:{var.name}"
            op_id = _pseudo_op(
                rec,
                key,
                "VariableState",
                var.name,
                value.device or "",
                [value.dtype.name],
                [list(value.shape)],
                [True],
                "value of the variable after the step",
                resource=key,
                # The variable as the step's own ops name it: check() restores it before
                # each run, which rules out state carried over (analysis._maybe_unordered).
                attrs={"variable": ops.eager_identity(var.handle)}
                if hasattr(var, "handle")
                else None,
            )
            seq = rec.next_seq()
            ev = Event(seq, op_id, seq, [_digest(rec, value)], [], [list(value.shape)])
            kept = ops.kept_value(value.numpy()) if rec.capture and key in rec.capture else None
            if kept is not None:
                rec.recording.values[f"{seq}:0"] = kept
            rec.append(ev)
    # What an opaque call inside a function wrote is compared now, where every variable it
    # writes is one of these: its "not compared" warning is not this run's (a Keras model
    # compiled with jit_compile=True, whose fit calls its XLA step inside another function,
    # was never "reproducible" under DeterminismCheck; probe round 47, F3).
    compared = {ops.eager_identity(var.handle) for var in variables if hasattr(var, "handle")}
    rec.recording.warnings[:] = [
        w
        for w in rec.recording.warnings
        if not (rec.blind_variables.get(w) and rec.blind_variables[w] <= compared)
    ]
