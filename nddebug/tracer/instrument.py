"""Graph ops (``tf.function``, Keras train functions, cond/while bodies, gradients, optimizer
updates) are instrumented when they are created: on the native path one fused op digests the
op's outputs and appends its row to the buffer; otherwise digest ops are added next to the op
and the row is delivered by :mod:`nddebug.tracer.transport`.

An instrumented graph stays instrumented; outside ``trace()`` its eager calls run its plain
twin, the definition without nddebug's ops (:mod:`nddebug.tracer.plain`), and where there is
none the process-wide switch makes its digests read no data (:mod:`nddebug.tracer.registry`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from typing import Any

from nddebug import digest as dg
from nddebug.recording import (
    ARGUMENT_BY_CALLER,
    DATASET_PASSES,
    DATASET_STAGES,
    EMULATION_SCOPE,
    MERGE_OPS,
    NOT_COMPARED,
    PARALLEL_RANDOM,
    PER_REPLICA,
    PIPELINE_OPS,
    RECORDED_BY_CALLER,
    SHAPE_ONLY_OPS,
    TF1_GRAPH,
    UPDATE_NOTE,
    OpInfo,
)
from nddebug.tracer import (
    datasets,
    opaque,
    ops,
    rerun,
    rewrites,
    transport,
    undefined,
    unneeded,
)
from nddebug.tracer.location import creation_location, graph_location
from nddebug.tracer.registry import REGISTRY, graph_gate

#: TensorFlow's name for the backward graph of a function call: "__backward_<forward>_<uid>".
_BACKWARD = "__backward_"


def in_xla(graph: Any) -> bool:
    """Whether XLA compiles this graph: traced in an XLA context (jit_compile=True, or a graph
    nested in one), or the backward graph of such a function's call, which the gradient code
    builds outside that context and TensorFlow compiles with it (_XlaMustCompile). nddebug's
    ops cannot be compiled by XLA: instrumenting one crashes the step."""
    from tensorflow.python.ops import control_flow_util

    cache = REGISTRY.graph_cache(graph)
    if "<xla>" not in cache:
        try:
            found = bool(control_flow_util.GraphOrParentsInXlaContext(graph))
        except Exception:  # noqa: BLE001 - an unknown graph type is not XLA
            found = False
        name = ops.as_str(getattr(graph, "name", "") or "")
        if not found and name.startswith(_BACKWARD):
            compiled = _forward_compiled()
            if compiled is None:  # built elsewhere than TensorFlow's gradient functions
                forward = name[len(_BACKWARD) :].rpartition("_")[0]
                compiled = forward in REGISTRY.xla_graph_names
            found = compiled
        g = getattr(graph, "outer_graph", None)
        found = found or (g is not None and hasattr(g, "outer_graph") and in_xla(g))
        if found and name:
            REGISTRY.xla_graph_names.add(name)
        cache["<xla>"] = found
    return cache["<xla>"]


def _forward_compiled() -> bool | None:
    """Whether the function whose backward graph is being built is XLA-compiled, asked of
    TensorFlow's gradient functions that build it (their ``_func_graph`` and ``_attrs`` on
    the stack); None when no such frame is found. By name alone, two functions called
    ``inner`` (or two Keras ``call``s), one of them jit-compiled, were both taken for XLA,
    and the other's gradient went unrecorded ("traced before nddebug.trace()")."""
    frame = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        forward = getattr(owner, "_func_graph", None) if owner is not None else None
        attrs = getattr(owner, "_attrs", None) if forward is not None else None
        if attrs is not None and hasattr(attrs, "get"):
            must = attrs.get("_XlaMustCompile")
            return getattr(must, "b", must) is True or forward in REGISTRY.xla_graphs
        frame = frame.f_back
    return None


def note_function(graph: Any, attrs: Any) -> None:
    """A graph becomes a function: remember it if XLA compiles it, so that its backward graph
    is left alone too (see :func:`in_xla`)."""
    must = (attrs or {}).get("_XlaMustCompile") if isinstance(attrs, dict) else None
    if getattr(must, "b", must) is True or in_xla(graph):
        REGISTRY.xla_graph_names.add(ops.as_str(getattr(graph, "name", "") or ""))


def is_v1_graph(graph: Any) -> bool:
    """Whether ``graph`` is a TF1 graph (run by a Session), asked once per graph."""
    from tensorflow.python.framework import ops as tf_ops

    cache = REGISTRY.graph_cache(graph)
    if "<v1>" not in cache:
        cache["<v1>"] = not tf_ops.executing_eagerly_outside_functions() or not hasattr(
            graph, "outer_graph"
        )
    return cache["<v1>"]


def is_data_graph(graph: Any) -> bool:
    """tf.data function bodies run on tf.data's threads, ahead of the step (prefetch): their
    execution count at any moment is timing-dependent, so they are compared through the
    iterator's outputs instead. That holds for every function nested in one too (a
    ``tf.cond`` or ``tf.while_loop`` body inside a ``Dataset.map`` function), so the graphs
    around this one are asked as well. tf.data's own functions have other names (a
    distributed dataset's per-device ``_next_func``, run on another device's thread): a
    function whose tracing tf.data asked for (see :func:`hook_graph_ends`) is one too."""
    cache = REGISTRY.graph_cache(graph)
    if "<data>" not in cache:
        g, found = graph, getattr(_tracing, "for_data", 0) > 0
        while g is not None and not found:
            name = ops.as_str(getattr(g, "name", "") or "")
            found = name.startswith("Dataset_") or "_Dataset_" in name
            found = found or (g is not graph and REGISTRY.graph_cache(g).get("<data>", False))
            g = getattr(g, "outer_graph", None)
        cache["<data>"] = found
    return cache["<data>"]


def graph_name(graph: Any) -> str:
    """A graph's name; a TF1 graph has none."""
    return ops.as_str(getattr(graph, "name", "") or "") or TF1_GRAPH


def graph_key(graph: Any) -> str:
    """The names of the graph and the graphs around it, without unique ids: the same in
    every process. Asked for every op, so kept per graph."""
    cache = REGISTRY.graph_cache(graph)
    if "<key>" not in cache:
        names = []
        g = graph
        while g is not None and hasattr(g, "name"):
            names.append(ops.UID_SUFFIX.sub("", ops.as_str(g.name)))
            g = getattr(g, "outer_graph", None)
        cache["<key>"] = "/".join(reversed(names))
    return cache["<key>"]


#: The sums grappler's AddOpsRewrite merges into one AddN where they form a chain with no
#: control edge. AddN computes other bits when it takes over another term's buffer, so
#: these keep the ordering of :func:`digests_first` even where grappler could rewrite them,
#: and wait through an Identity (:func:`_read_after`).
MERGED_SUMS = frozenset({"Add", "AddV2", "AddN"})


#: Per-graph cache entry: what instrumenting the graph said (see :func:`say`).
_NOTES = "<notes>"


def say(rec: Any, graph: Any, message: str) -> None:
    """A warning found while instrumenting ``graph``: in the block's recording, and kept for
    the graph's function, whose every call in a later block says it again (see
    :func:`graph_notes`; a graph is instrumented once, in the first block that traces it, and
    check() calls the copy it made in an earlier check)."""
    ops.warn_once(rec.recording, message)
    # Kept for the graph and every graph it is built inside (a tf.cond branch or a loop body
    # becomes no function of its own: the function around it is what a later block calls).
    while graph is not None:
        notes = REGISTRY.graph_cache(graph).setdefault(_NOTES, [])
        if message not in notes:
            notes.append(message)
        graph = getattr(graph, "outer_graph", None)
        if graph is not None and not getattr(graph, "building_function", False):
            break  # the eager context's graph: no function


def graph_notes(graph: Any) -> list[str]:
    """What instrumenting ``graph`` said (see :func:`say`)."""
    return list(REGISTRY.graph_cache(graph).get(_NOTES, ()))


class Deferred:
    """An op whose output grappler may rewrite together with its one consumer (a sum chain,
    x / sqrt(y), a contraction and its bias and activation: ``data/rewrites.toml``). A digest
    of it would be a second consumer and keep the plain program's rewrite from happening,
    and the rewritten kernels may round differently. So its record is made only once an op
    outside such a pattern reads it; an op that fuses with it records the intermediate's own
    inputs instead (what the rewritten op reads) and names it as fused, so the source test
    holds for the chain as grappler runs it. Not digesting an intermediate can never make the
    instrumented graph differ from the plain one."""

    def __init__(
        self,
        op_type: str,
        inputs: list[Any],
        emit: Any,
        key: str,
        fused: dict[str, str],
        inside: frozenset[str],
        tensor: Any,
    ) -> None:
        self.op_type = op_type
        self.key = key
        self.inputs = inputs  # the digests its record would hold as its inputs (folded)
        # The chain it stands for: the ops it covered, then itself (key -> op type).
        self.fused = {**fused, key: op_type}
        # The rewrites whose pattern it is part of (rewrites.fuses), by the ops it covered.
        self.inside = inside
        self.tensor = tensor  # the output it stands for
        self._emit = emit
        self._digest: Any = None
        self.sender: Any = None  # the op that records it, once made
        self.done = False
        # A sum that read it recorded its inputs in its place: nothing else must record it.
        self.covered = False
        self.op_id: int | None = None  # the op it records (set by instrument_op)
        # Returned by a function that a call inlines into its caller: the caller records it
        # (see finish_graph), where grappler rewrites it with its reader there.
        self.to_caller = False
        # Its record holds no digest of an argument its function left to the call's record
        # (see _Argument): like a call, it is not a source when another op is.
        self.by_caller = False

    def materialize(self) -> Any:
        """Make the record now; the output's digest tensor (None if unreadable)."""
        if not self.done:
            self.done = True
            self.sender, self._digest = self._emit()
            # The closure holds a dozen cells and lists per op: the garbage collector tracks
            # them for the life of the graph (a full collection costs ~0.3 s in a process
            # with TensorFlow loaded), and a made record never needs them again.
            self._emit = None
        return self._digest


class _Argument(Deferred):
    """An argument of a nested function, whose calls grappler inlines into the caller. Where
    the op reading it may be rewritten with the op that makes it in the caller (a constant
    pushed down a product that crosses the call: the loss's ``2 * h`` times the ``* 1.1``
    in the gradient of the function), a digest of it inside the function is the second
    reader that stops the rewrite, and the gradient was 1 ULP away from the plain one. So
    such a reader records nothing in its place, and the call's record holds the argument
    (or, where the caller's op that makes it is rewritten with the reader, that op's
    inputs: see note_arguments_left). Any other reader digests it as usual."""

    def __init__(self, graph: Any, tensor: Any) -> None:
        def emit() -> tuple[Any, Any]:
            REGISTRY.graph_cache(graph).pop(tensor.name, None)
            return None, digest_in_graph(graph, tensor)

        super().__init__("", [], emit, tensor.name, {}, frozenset(), tensor)
        self.fused = {}  # no op of this function stands behind it
        self.by_caller = True


def _argument(graph: Any, tensor: Any) -> _Argument | None:
    """The pending digest of ``tensor`` if it is an argument (or capture) of a nested
    function whose readers may leave it to the call's record (see _Argument); made at its
    first reader."""
    if tensor.op.type != "Placeholder" or tensor.graph is not graph:
        return None
    cache = REGISTRY.graph_cache(graph)
    pending = cache.setdefault(DEFERRED, {})
    found = pending.get(tensor.name)
    if found is not None or tensor.name in cache:
        return found if isinstance(found, _Argument) else None
    if not _left_to_callers(graph) or not _digestible(tensor):
        return None
    d = _Argument(graph, tensor)
    cache[tensor.name] = d
    pending[tensor.name] = d
    return d


def _left_to_callers(graph: Any) -> bool:
    """Whether ``graph`` is the body of a function called from another function's graph, whose
    calls grappler inlines (a nested tf.function, the backward function of its gradient):
    not a branch or loop body, not a tf.data function, not a TF1 graph."""
    cache = REGISTRY.graph_cache(graph)
    if "<left to callers>" not in cache:
        from tensorflow.python.framework import func_graph as func_graph_module

        cache["<left to callers>"] = (
            type(graph) is func_graph_module.FuncGraph
            and _nested(graph)
            and not is_data_graph(graph)
            and not is_v1_graph(graph)
            and not in_xla(graph)
        )
    return cache["<left to callers>"]


def _input_digests(
    graph: Any,
    op_type: str,
    inputs: Any,
    device: str,
    readers: dict[int, tuple[str, int]] | None = None,
) -> tuple[list[Any], list[Any], dict[str, str], frozenset[str], bool]:
    """The digests an op's record holds as its inputs, the digest read from each input (None
    where none is: unreadable, or an intermediate it fuses with), the ops it fuses with
    (key -> op type, in data-flow order), the rewrites whose pattern that makes it part
    of, and whether it leaves an argument of its function to the call's record.
    ``readers``: for a call, the op inside the function that reads each argument it leaves
    to this record (input position -> op type and its input position there)."""
    cache = REGISTRY.graph_cache(graph)
    recorded: list[Any] = []
    per_input: list[Any] = []
    fused: dict[str, str] = {}
    inside: frozenset[str] = frozenset()
    by_caller = False
    deferred = cache.get(DEFERRED, {})
    for position, t in enumerate(inputs):
        d = cache.get(t.name)
        if not isinstance(d, Deferred):
            d = deferred.get(t.name)
            d = d if d is not None or t.name in cache else _argument(graph, t)
        reader = (readers or {}).get(position)
        consumer, at = reader if reader is not None else (op_type, position)
        if d is None or not consumer:
            by = None
        elif isinstance(d, _Argument):
            # Digested in the function already (another reader): no rewrite to keep.
            by = None if d.done else rewrites.consumes(consumer, at, device)
        else:
            by = rewrites.fuses(d.op_type, consumer, at, device, d.inside)
        if by:
            recorded.extend(d.inputs)  # what the rewritten op reads
            # Recorded already (another reader asked for it, perhaps one grappler prunes,
            # after which this op is its one reader and grappler rewrites the two as one):
            # its digest still orders this op after the record that reads its buffer.
            per_input.append(d.materialize() if d.done else None)
            d.covered = True
            fused.update(d.fused)
            inside |= by
            by_caller = by_caller or d.by_caller
            continue
        d = digest_in_graph(graph, t)
        recorded.append(d)
        per_input.append(d)
    return recorded, per_input, fused, inside, by_caller


def digest_in_graph(graph: Any, tensor: Any) -> Any:
    """The digest tensor of ``tensor`` in ``graph``, built once per tensor."""
    import tensorflow as tf

    cache = REGISTRY.graph_cache(graph)
    name = tensor.name
    if name in cache:
        d = cache[name]
        return d.materialize() if isinstance(d, Deferred) else d
    d = None
    if _digestible(tensor):
        lib = transport.native_ops()
        native_here = lib is not None and (lib.gpu or rerun.on_host(tensor.device))
        if lib is not None and tensor.op.type == "Const":
            d = _const_digest(tensor)
        if d is None:
            with tf.name_scope("nddebug"), _beside(tensor):
                if native_here:
                    d = lib.digest(graph_gate(graph), [tensor])  # one op, [1, 2]
                else:
                    d = dg.build_digest(tensor, dg.use_matmul_for(tensor.device), graph_gate(graph))
    cache[name] = d
    return d


def _beside(tensor: Any) -> Any:
    """The device scope that places a digest op where ``tensor`` was asked to be. The digest
    ops have CPU and GPU kernels, so an unplaced one may land on the GPU and copy a tensor a
    user pinned to the CPU there (or back); one the user's op was not placed on is left to
    the placer, as the op itself was."""
    import tensorflow as tf

    return tf.device(tensor.device) if tensor.device else contextlib.nullcontext()


#: Per-graph cache entry: every Deferred of the graph by the name of its tensor (and of the
#: pass-through outputs of it). Its entry under that name becomes the digest once recorded.
DEFERRED = "<deferred>"

#: Per-graph cache entry: sum-chain intermediates only pass-through ops (Identity, Reshape)
#: have read so far; recorded when the graph is complete unless a sum covered them.
_PASSED = "nddebug:passed-through"


def _passed_through(graph: Any, tensor: Any) -> Any:
    """What a pass-through op's output is digested as: its input's digest; or, while the input
    is a sum-chain intermediate not yet recorded, that same pending record. Keras's optimizers
    take an Identity of a gradient before the update multiplies it: recording the
    intermediate there would be the second consumer that stops grappler's rewrite."""
    cache = REGISTRY.graph_cache(graph)
    d = cache[tensor.name] if tensor.name in cache else _argument(graph, tensor)
    if isinstance(d, Deferred) and not d.done:
        cache.setdefault(_PASSED, []).append(d)
        return d
    return digest_in_graph(graph, tensor)


def finish_graph(graph: Any) -> None:
    """The graph is complete (its Python function returned): record the intermediates that
    only pass-through ops read and no op fused with (a function's or loop body's result,
    returned through an Identity), and those the graph returns as they are (a while loop's
    condition), so that every value is recorded once."""
    cache = REGISTRY.graph_cache(graph)
    pending = cache.pop(_PASSED, None) or []
    returned: dict[int, list[Any]] = {}  # Deferred -> the graph's outputs that return it
    first = _INLINED in cache and _RETURNS not in cache  # a body a call inlines, just traced
    to_caller = first and _nested(graph)
    for t in getattr(graph, "outputs", None) or []:
        d = cache.get(getattr(t, "name", None))
        if isinstance(d, Deferred):
            if to_caller and not (d.done or d.covered):
                d.to_caller = True
            pending.append(d)
            returned.setdefault(id(d), []).append(t)
    if first:
        cache[_RETURNS] = True  # outputs added later (a gradient's) are recorded here
        cache[_OWN_OUTPUTS] = len(getattr(graph, "outputs", None) or [])
    if not pending:
        return
    control = getattr(graph, "control_outputs", None)
    with graph.as_default():
        for d in pending:
            if d.done or d.covered or d.to_caller:
                continue
            d.materialize()
            sender = d.sender
            if sender is None:
                continue
            if control is not None and sender not in control:
                # Made after the function's automatic control dependencies: a function
                # runs what its outputs and control outputs need.
                control.append(sender)
            for t in returned.get(id(d), []):
                if t.op.type in ops.ALIAS_OPS and all(x is not t for x in sender.inputs):
                    # A while loop runs its condition for the value alone: the returned
                    # Identity waits for the record, as automatic control dependencies
                    # make it wait for the graph's other stateful ops.
                    t.op._add_control_input(sender)


def untie_outputs(graph: Any) -> None:
    """The outputs of a nested function that its callers record (returned values grappler may
    rewrite with their reader in the caller, see :func:`finish_graph`) do not wait for
    nddebug's ops. Automatic control dependencies make each returned value wait (through a
    NoOp) for every op the function must run, nddebug's records and the trace switch's read
    among them; once grappler inlines the call, those waits are control edges on the
    caller's readers of the value, and grappler does not rewrite an op that has one (a
    nested function returning ``silu(h)``, squared by the loss: a gradient 1 ULP away).

    Only those outputs: the waits of the others are what keeps a stateless function's
    records running. TensorFlow inlines a PartitionedCall (a function with no stateful op
    of the program's own) keeping only what its data outputs need, not its control outputs;
    with every output untied, the records of such a function were dropped, and a
    non-deterministic kernel in it (CropAndResizeGradImage in a nested function's gradient)
    was blamed on the call, as a difference from outside TensorFlow."""
    cache = REGISTRY.graph_cache(graph)
    if _INLINED not in cache:
        return
    for t in getattr(graph, "outputs", None) or []:
        d = cache.get(getattr(t, "name", None))
        if not (isinstance(d, Deferred) and d.to_caller):
            continue
        op = t.op
        waits = [c for c in op.control_inputs if c.type == "NoOp" and not unneeded.ours(c)]
        if not any(unneeded.ours(x) for c in waits for x in c.control_inputs):
            continue
        keep = [c for c in op.control_inputs if c not in waits]
        mine = [x for c in waits for x in c.control_inputs if not unneeded.ours(x)]
        if mine:
            from tensorflow.python.ops import control_flow_ops

            with graph.as_default(), graph.control_dependencies(mine):
                keep.append(control_flow_ops.no_op(name="waits"))
        op._remove_all_control_inputs()
        op._add_control_inputs(keep)


#: Per-graph cache entries: the graph is a tf.function's body or a gradient's backward
#: function (its calls are inlined into the caller by grappler); which of its outputs the
#: caller records was decided (finish_graph).
_INLINED = "<called function>"
_RETURNS = "<returns decided>"
#: Per-graph cache entry: how many outputs the function returns by itself (a gradient adds
#: the intermediates its backward function reads as more outputs, to the same graph).
_OWN_OUTPUTS = "<own outputs>"
#: The modules that trace a tf.function's body, and a gradient's backward function (their
#: frames ask func_graph_from_py_func); not a branch's or a loop body's.
_TRACES_FUNCTIONS = f"polymorphic_function{os.sep}tracing_compilation.py"
_TRACES_GRADIENTS = f"polymorphic_function{os.sep}concrete_function.py"


def _nested(graph: Any) -> bool:
    """Whether ``graph`` was traced inside another function's graph (a call there will run
    it), not at the top level (its calls then come from Python)."""
    from tensorflow.python.framework import func_graph as func_graph_module

    return isinstance(getattr(graph, "outer_graph", None), func_graph_module.FuncGraph)


def returned_to_caller(name: Any, graph: Any) -> None:
    """Remember which of the function ``name``'s outputs its callers record (see
    :func:`finish_graph` and :func:`_from_calls`)."""
    cache = REGISTRY.graph_digests.get(graph)
    if not cache or _INLINED not in cache:
        return
    out: dict[int, Deferred] = {}
    for k, t in enumerate(getattr(graph, "outputs", None) or []):
        d = cache.get(getattr(t, "name", None))
        if isinstance(d, Deferred) and d.to_caller and not d.done and d.op_id is not None:
            out[k] = d
    if out:
        REGISTRY.returned_deferred[ops.as_str(name)] = out


_hooked = False


def hook_graph_ends() -> None:
    """Call :func:`finish_graph` on each graph TensorFlow builds from a Python function
    (tf.function bodies, loop bodies, branches) right after the function returns, and on
    every graph as it becomes a function. Installed at the first trace and never removed
    (graphs traced in a block can be completed after it); it costs a dictionary lookup per
    graph."""
    global _hooked
    if _hooked:
        return
    from tensorflow.python.framework import func_graph as func_graph_module

    from nddebug.tracer.registry import inside_nddebug

    original = func_graph_module.func_graph_from_py_func

    def finish(graph: Any) -> set[Any] | None:
        """Complete an instrumented graph; the ops its program needs (None: not computed)."""
        if not REGISTRY.graph_digests.get(graph):
            return None
        with inside_nddebug():
            finish_graph(graph)
            use = unneeded.cut_unneeded_records(graph)
            untie_outputs(graph)
        return use

    @functools.wraps(original)
    def func_graph_from_py_func(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1)
        data = _asked_by_data(caller)
        given = kwargs.get("func_graph", args[5] if len(args) > 5 else None)
        if data and given is not None:
            # Its argument placeholders were made before this call, and asked already.
            REGISTRY.graph_cache(given)["<data>"] = True
        _tracing.for_data = getattr(_tracing, "for_data", 0) + data
        try:
            graph = original(*args, **kwargs)
        finally:
            _tracing.for_data -= data
        tracer = caller.f_code.co_filename
        if tracer.endswith((_TRACES_FUNCTIONS, _TRACES_GRADIENTS)) and REGISTRY.graph_digests.get(
            graph
        ):
            REGISTRY.graph_cache(graph)[_INLINED] = True
        finish(graph)
        return graph

    func_graph_module.func_graph_from_py_func = func_graph_from_py_func

    # Graphs built without a Python function (the backward graph of an eager tape's
    # gradient: FuncGraph(...) filled by the gradient code) are complete when they become a
    # function, which every graph does through this one call.
    from tensorflow.python.eager.polymorphic_function import atomic_function

    make_function = atomic_function.from_func_graph

    @functools.wraps(make_function)
    def from_func_graph(name: Any, graph: Any, *args: Any, **kwargs: Any) -> Any:
        with inside_nddebug():
            note_function(graph, args[0] if args else kwargs.get("attrs"))
        use = finish(graph)
        _note_instrumented(name, graph)
        _note_unused_arguments(name, graph, use)
        returned_to_caller(name, graph)
        note_arguments_left(name, graph, use)
        if REGISTRY.graph_digests.get(graph):
            REGISTRY.function_keys[ops.as_str(name)] = graph_key(graph)
            own = REGISTRY.graph_cache(graph).get(_OWN_OUTPUTS)
            if own is not None and len(getattr(graph, "outputs", None) or []) > own:
                REGISTRY.forward_outputs[ops.as_str(name)] = own
        return make_function(name, graph, *args, **kwargs)

    atomic_function.from_func_graph = from_func_graph
    _hooked = True


def _note_instrumented(name: Any, graph: Any) -> None:
    """A graph whose ops nddebug's op callback was handed becomes a function: its calls run
    recorded ops. The gradient code makes functions of such graphs under other names and
    without a ConcreteFunction callback (a nested function's ``__forward_<name>`` and
    ``__backward_<name>`` for a tape, a cond's gradient wrapper): without this they were
    said to be "traced before nddebug.trace()", and the step "not everything compared"."""
    cache = REGISTRY.graph_digests.get(graph)
    if cache and SEEN in cache and not in_xla(graph):
        REGISTRY.instrumented_functions.add(ops.as_str(name))


def _note_unused_arguments(name: Any, graph: Any, use: set[Any] | None) -> None:
    """Remember which of a function's arguments its body never reads (read only by ops that
    nothing it returns or runs needs, which TensorFlow prunes): a call's record does not
    digest them (see :func:`_call_inputs`). ``use``: the ops the program needs, if known."""
    inputs = getattr(graph, "inputs", None) or []
    if not inputs or not hasattr(graph, "outputs"):
        return
    if use is None:
        use = unneeded.needed(graph)
    unused = frozenset(
        i
        for i, t in enumerate(inputs)
        if not any(c in use and not unneeded.ours(c) and _reads(c, t) for c in t.consumers())
    )
    if unused:
        REGISTRY.unused_arguments[ops.as_str(name)] = unused


def _reads(op: Any, tensor: Any) -> bool:
    """Whether ``op`` reads ``tensor``: a call reads an argument only where its function
    does (a backward function hands a forward intermediate on to the backward function of a
    call nested in it, which may not read it: grappler prunes it once it inlines both)."""
    callee = _callee_of(op)
    if not callee:
        return True
    unused = REGISTRY.unused_arguments.get(callee) or frozenset()
    return any(x is tensor and i not in unused for i, x in enumerate(op.inputs))


def _called(attrs: Any) -> str:
    """The name of the function a call op calls (its ``f``: an AttrValue holding a
    NameAttrList, or the NameAttrList itself); "" if none."""
    f = ops.attr(attrs, "f")
    return ops.as_str(getattr(getattr(f, "func", f), "name", "")) if f is not None else ""


def _from_calls(callee: str, outputs: list[Any]) -> dict[int, tuple[Any, Any]]:
    """The outputs of a call whose function left them for its caller to record (see
    :func:`finish_graph`): position -> (the output, the function's pending record of it)."""
    returned = REGISTRY.returned_deferred.get(callee) if callee else None
    if not returned:
        return {}
    return {k: (outputs[k], d) for k, d in returned.items() if k < len(outputs)}


def _defer_in_caller(
    rec: Any, graph: Any, from_calls: dict[int, tuple[Any, Any]], in_digests: list[Any]
) -> None:
    """A value a nested function returns, which grappler may rewrite with its reader once it
    inlines the call (a product, a sum, silu's ``x * sigmoid(x)``: ``data/rewrites.toml``),
    becomes a pending record in the caller, as it would be in one graph: recorded when a
    reader outside such a rewrite reads it, or folded into the reader's record (which then
    holds the call's inputs) when they are rewritten together. Recorded inside the function,
    or by the call, it had one reader more than in the plain program: a nested function
    returning silu(h), squared by the loss, computed a gradient 1 ULP away."""
    cache = REGISTRY.graph_cache(graph)
    for t, inner in from_calls.values():
        op_id = inner.op_id
        info = REGISTRY.ops.get(op_id)
        if info is not None and info.note in ("", ARGUMENT_BY_CALLER):
            # Its record in the caller holds the call's inputs, the arguments among them. A
            # new OpInfo: runs recorded before share the registered one (recorder._add).
            info = info.copy()
            info.note = RECORDED_BY_CALLER
            REGISTRY.ops[op_id] = info

        def emit(t: Any = t, op_id: int = op_id, key: str = inner.key) -> tuple[Any, Any]:
            return _record_value(rec, graph, op_id, key, t, in_digests)

        d = Deferred(inner.op_type, list(in_digests), emit, inner.key, inner.fused, inner.inside, t)
        d.op_id = op_id
        cache[t.name] = d
        cache.setdefault(DEFERRED, {})[t.name] = d


def _record_value(
    rec: Any, graph: Any, op_id: int, key: str, tensor: Any, in_digests: list[Any]
) -> tuple[Any, Any]:
    """Make the record of op ``op_id`` (``key``) in ``graph`` from ``tensor``'s value, with
    ``in_digests`` as its inputs: the record op, and the value's digest."""
    cache = REGISTRY.graph_cache(graph)
    cache.pop(tensor.name, None)
    lib = _fused_lib(rec, graph, [tensor], 0)
    readable_in = [d for d in in_digests if d is not None]
    if lib is not None:
        sender = _send_fused(lib, graph, op_id, [tensor], readable_in)
        digest = cache.get(tensor.name)
    else:
        digest = digest_in_graph(graph, tensor)
        sent = [_as_tensor(digest)] if digest is not None else []
        kept = [tensor] if digest is not None and rec.capture and key in rec.capture else []
        sender = transport.send(op_id, sent, [_as_tensor(d) for d in readable_in], kept)
    _order_record(graph, sender, "")
    return sender, digest


def _call_inputs(callee: str, inputs: Any) -> tuple[list[Any], dict[int, tuple[str, int]]]:
    """What a call's record digests: the arguments its function reads; and, by position in
    that list, the op inside the function that reads each argument the function left to
    this record (see note_arguments_left). A gradient passes its forward call's
    intermediates to the backward function, which may not read them all (silu's output,
    when its gradient recomputes from the input); grappler prunes such an argument once it
    inlines the call, and then rewrites the producer with its one remaining reader (oneDNN's
    _MklSwish, or a constant pushed down a product). A digest of it in the caller was a
    reader the plain program does not have: an Adam step on a nested silu function computed
    1 ULP away from the plain one from its second call on. An argument the function does
    not read cannot change what the call returns, so leaving it out of the source test
    loses nothing."""
    if not callee:
        return list(inputs), {}
    unused = REGISTRY.unused_arguments.get(callee) or frozenset()
    left = REGISTRY.arguments_left.get(callee) or {}
    kept = [i for i in range(len(inputs)) if i not in unused]
    readers = {j: left[i] for j, i in enumerate(kept) if i in left}
    return [inputs[i] for i in kept], readers


def note_arguments_left(name: Any, graph: Any, use: set[Any] | None = None) -> None:
    """Remember which arguments the function ``name`` left to its callers' records (see
    _Argument): each read by one op inside, which digested nothing in its place. The call
    records the argument; where grappler may rewrite the caller's op that makes it with
    that reader once it inlines the call, the call records that op's inputs instead, as a
    reader in one graph would (_input_digests). ``use``: the ops the program needs, if
    known (a reader TensorFlow prunes, the gradient with respect to a constant factor,
    does not count)."""
    cache = REGISTRY.graph_digests.get(graph)
    pending = cache.get(DEFERRED) if cache else None
    if not pending:
        return
    if use is None:
        use = unneeded.needed(graph)
    left: dict[int, tuple[str, int]] = {}
    for k, t in enumerate(getattr(graph, "inputs", None) or []):
        d = pending.get(getattr(t, "name", None))
        if isinstance(d, _Argument) and d.covered and not d.done:
            readers = _readers(t, use)
            if len(readers) == 1:
                left[k] = readers[0]
    if left:
        REGISTRY.arguments_left[ops.as_str(name)] = left


def _readers(tensor: Any, use: set[Any]) -> list[tuple[str, int]]:
    """The program's ops in ``use`` that read ``tensor``, seen through pass-through ops
    (Identity): each as its op type and the input position it reads at."""
    found: list[tuple[str, int]] = []
    stack = [tensor]
    while stack:
        t = stack.pop()
        for c in t.consumers():
            if unneeded.ours(c) or c not in use:
                continue
            if c.type == "Identity":  # removed by grappler before it rewrites
                stack.append(c.outputs[0])
                continue
            for i, x in enumerate(c.inputs):
                if x is t:
                    found.extend(_through_call(c, i))
    return found


def _callee_of(op: Any) -> str:
    """The function a graph call op that grappler inlines calls ("" for any other op)."""
    if op.type not in _INLINED_CALLS:
        return ""
    try:
        return ops.as_str(op.get_attr("f").name)
    except Exception:  # noqa: BLE001 - no readable "f": not a call it can look into
        return ""


def _through_call(op: Any, i: int) -> list[tuple[str, int]]:
    """Who reads input ``i`` of ``op`` once grappler inlines it: for a call of a function
    that left that argument to its callers, the op inside that reads it; none where the
    function does not read it; else the op itself."""
    callee = _callee_of(op)
    if not callee:
        return [(op.type, i)]
    if i in (REGISTRY.unused_arguments.get(callee) or ()):
        return []
    inner = (REGISTRY.arguments_left.get(callee) or {}).get(i)
    return [inner] if inner is not None else [(op.type, i)]


_stateful_hooked = False


def hook_statefulness() -> None:
    """Have TensorFlow's Python side see nddebug's own ops as stateless, so that it builds
    the instrumented program as it builds the plain one. Records are stateful ops (the
    runtime must neither fold nor prune them, and to it they stay stateful), and
    TensorFlow decides from its ops' statefulness how to call a function and a branch: a
    function, ``tf.cond`` or ``tf.while_loop`` whose only stateful ops were nddebug's
    became a StatefulPartitionedCall, If or While instead of a PartitionedCall,
    StatelessIf or StatelessWhile. Automatic control dependencies then chained those
    calls, and grappler inlined and merged their bodies otherwise: silu followed by a
    ``tf.cond`` under a tape computed gradients 2 ULP away from the plain program's.
    Records still run: each is marked as an op its function must run, a control output
    (:func:`_order_record`); automatic control dependencies no longer do it for them."""
    global _stateful_hooked
    if _stateful_hooked:
        return
    from tensorflow.python.framework import ops as tf_ops

    base = None
    for cls in tf_ops.Operation.__mro__:
        if isinstance(vars(cls).get("_is_stateful"), property):
            base = vars(cls)["_is_stateful"]
            break
    if base is None or base.fget is None:
        return  # another TensorFlow: leave it as it is
    plain = base.fget

    def _is_stateful(op: Any) -> bool:
        return plain(op) and not unneeded.ours(op)

    tf_ops.Operation._is_stateful = property(_is_stateful)
    _stateful_hooked = True


_pfor_hooked = False


def hook_pfor() -> None:
    """Keep nddebug's ops out of what ``tf.vectorized_map`` (pfor) vectorizes. pfor builds
    the loop body once as a template, for one iteration, and makes vectorized ops from it;
    the template itself never runs. Its records would be vectorized too, each into a
    ``while_loop`` that records garbage, and would keep the template running. So pfor is
    given the template without them, the template's ops lose their ordering edges from them
    (pfor would carry those over), and the records, now reading ops nothing needs, are cut
    when the function is complete (:mod:`unneeded`). The vectorized ops are made without op
    callbacks and are instrumented when an instrumented op reads them (:func:`_catch_up`).
    A template inside a function body that pfor converts (not the graph being built) is
    left as it is: that function is not this graph's to change."""
    global _pfor_hooked
    if _pfor_hooked:
        return
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.ops.parallel_for import pfor as pfor_module

    original = pfor_module.PFor.__init__

    @functools.wraps(original)
    def __init__(self: Any, loop_var: Any, loop_len: Any, pfor_ops: Any, *args: Any, **kw: Any):
        template = list(pfor_ops)
        graph = tf_ops.get_default_graph()
        if any(unneeded.ours(op) for op in template) and all(op.graph is graph for op in template):
            for op in template:
                if unneeded.ours(op):
                    continue
                keep = [c for c in op.control_inputs if not unneeded.ours(c)]
                if len(keep) != len(op.control_inputs):
                    op._remove_all_control_inputs()
                    op._add_control_inputs(keep)
            pfor_ops = [op for op in template if not unneeded.ours(op)]
        original(self, loop_var, loop_len, pfor_ops, *args, **kw)

    pfor_module.PFor.__init__ = __init__
    # A template left as it is (a tf.cond or switch_case branch inside the vectorized
    # function, which pfor converts as a function of its own) still holds nddebug's ops: pfor
    # fell back to a while loop for them and failed ("Attempting to slice scalar input" in a
    # branch holding a ReverseV2, whose record reads a digest made from its input's). Their
    # vectorized versions record nothing, as the ops pfor is given without them.
    for op_type in ("NddebugDigestRecord", "NddebugDigest", "NddebugRecord"):
        if op_type not in pfor_module._pfor_converter_registry:
            pfor_module.RegisterPFor(op_type)(_unrecorded_in_pfor)
    # Rerun mode hands an op's re-executions to the host in a callback of nddebug's: in a
    # loop body that pfor converts (tape.jacobian through a while loop) it fell back to a
    # while loop and failed ("Attempting to slice scalar input"), and check(mode="rerun")
    # raised out of the user's step (probe round 38). TensorFlow has no converter for host
    # callbacks: a user's is left to pfor's own fallback, as before.
    for op_type in unneeded.CALLBACKS:
        if op_type not in pfor_module._pfor_converter_registry:
            pfor_module.RegisterPFor(op_type)(_callback_in_pfor)
    _pfor_hooked = True


def _callback_in_pfor(pfor_input: Any) -> Any:
    """pfor's version of a host callback: none for nddebug's (as :func:`_unrecorded_in_pfor`);
    a user's goes to pfor's fallback, as when no converter was registered."""
    from tensorflow.python.ops.parallel_for import pfor as pfor_module

    if unneeded.callback_is_nddebugs(pfor_input.op.get_attr("token")):
        return _unrecorded_in_pfor(pfor_input)
    raise pfor_module.ConversionNotImplementedError("a host callback has no pfor converter")


def _unrecorded_in_pfor(pfor_input: Any) -> Any:
    """pfor's version of a record of nddebug's: no record; zero digests where it has outputs
    (only other records of the same template read them)."""
    import tensorflow as tf
    from tensorflow.python.ops.parallel_for import pfor as pfor_module

    op = pfor_input.op
    if not op.outputs:
        return tf.no_op()
    return [
        pfor_module.wrap(tf.zeros([d or 1 for d in t.shape.as_list()], t.dtype), False)
        if t.shape.rank is not None
        else pfor_module.wrap(tf.zeros([1, 2], t.dtype), False)
        for t in op.outputs
    ]


_tracing = threading.local()  # for_data: tracings of tf.data functions in progress
_SEP = os.sep
#: Where TensorFlow's function-tracing machinery lives: the frames between the code that asked
#: for a function and the tracing itself.
_MACHINERY = (
    *(f"{_SEP}tensorflow{_SEP}python{_SEP}{d}{_SEP}" for d in ("eager", "util", "autograph")),
    f"{_SEP}tensorflow{_SEP}python{_SEP}framework{_SEP}func_graph.py",
)
_DATA = f"{_SEP}tensorflow{_SEP}python{_SEP}data{_SEP}"


def _asked_by_data(frame: Any) -> bool:
    """Whether the code that asked for this function to be traced, past TensorFlow's tracing
    machinery, is tf.data's (a ``Dataset.map`` function, a distributed iterator's per-device
    functions): such a function runs on tf.data's threads, ahead of the step."""
    while frame is not None:
        name = frame.f_code.co_filename
        if _DATA in name:
            return True
        if name != __file__ and not any(m in name for m in _MACHINERY):
            return False
        frame = frame.f_back
    return False


def variable_identity(graph: Any, handle: Any) -> str:
    """Which variable (or other resource: a table, a queue) a graph op reads or writes, the
    same for every graph and call that uses it: ``eager:<id>`` of the variable's handle (as
    eager ops name it) when the handle is a capture, followed out through the functions
    around this one; else, for a handle made in the graph or passed in as a loop variable,
    ``<graph key>:<tensor name>``. One identity lets a read in call k be linked to a
    divergent write of the same variable in call j < k of the same block, or of another
    function. A handle routed through a TF1 cond or loop (Switch, Enter, Identity) is the
    handle it routes."""
    for _ in range(256):  # a chain of routing ops; each step goes one op up
        op = getattr(handle, "op", None)
        if op is None or op.type not in ops.HANDLE_ROUTING or not op.inputs:
            break
        handle = op.inputs[0]
    g, t = graph, handle
    for _ in range(64):  # nesting depth; a cycle cannot happen, a bound costs nothing
        outer = _captured_from(g, t)
        if outer is None:
            break
        if getattr(outer, "_id", None) is not None and not hasattr(outer, "graph"):
            return ops.eager_identity(outer)
        if not hasattr(outer, "graph"):
            break
        t, g = outer, outer.graph
    return f"{graph_key(graph)}:{handle.name}"


def kept_per_replica(resource: str, depth: int = 60) -> bool:
    """Whether the variable behind ``resource`` (``eager:<id>`` of its handle) is one a
    distribution strategy keeps per replica by design (``synchronization=ON_READ``: a Keras
    metric's or loss tracker's totals, summed when read): its replicas' values differ by
    design, and replica_consistency must not call them inconsistent. Found from the frames of
    the code updating it (the variable's own ``assign_add`` holds it as ``self``); asked once
    per update op, as it is traced, and only under a distribution strategy."""
    from tensorflow.python.distribute import distribute_lib

    if not distribute_lib.has_strategy():
        return False
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return False
        var = frame.f_locals.get("self")
        sync = getattr(getattr(var, "_synchronization", None), "name", "")
        if sync:
            handle = getattr(var, "_handle", None)
            if f"eager:{getattr(handle, '_id', None)}" == resource:
                return sync == "ON_READ"
        frame = frame.f_back
    return False


def _captured_from(graph: Any, tensor: Any) -> Any:
    """The outer tensor (eager, or of the enclosing graph) that ``tensor`` captures, if any.
    The graph's captures grow while it is built: the map is made again on a miss, from the
    capture container's own dicts where they can be read (``graph.captures`` rebuilds its
    list in Python after every new capture: a forward pass that captures a variable, then
    reads it, made that quadratic, ~1 s of EfficientNetB0's first traced call)."""
    cache = REGISTRY.graph_cache(graph)
    found = cache.get("<captures>", {}).get(id(tensor))
    if found is None:
        cache["<captures>"] = _capture_map(graph)
        found = cache["<captures>"].get(id(tensor))
    return found


def _capture_map(graph: Any) -> dict[int, Any]:
    """id(inner placeholder) -> the outer tensor it captures, for ``graph``'s captures by value."""
    container = getattr(graph, "_function_captures", None)
    internal = getattr(container, "by_val_internal", None)
    external = getattr(container, "by_val_external", None)
    if isinstance(internal, dict) and isinstance(external, dict):
        return {id(inner): external[key] for key, inner in internal.items() if key in external}
    try:
        pairs = graph.captures
    except Exception:  # noqa: BLE001 - a graph without captures (TF1)
        return {}
    return {id(inner): outer for outer, inner in pairs}


#: Per-graph cache entry: names of outputs their kernel left undefined (tracer.undefined).
_UNDEFINED = "<undefined outputs>"
#: Per-graph cache entry (TF1 graphs): the names of updates that another update of the same
#: variable follows in a Session.run. The value after such an update is not read back: a
#: read after it cannot be ordered before the next update (an op a session has run must not
#: change), so on a busy machine it saw that update too, and two identical runs compared
#: "NOT reproducible" at the first update. What the updates left is read after the last.
OVERWRITTEN = "<updates another update follows>"


#: OpInfo.note of a read of a TF1 reference variable (see instrument_op).
REF_READ_NOTE = (
    "a read of a TF1 reference variable: its output is the variable's buffer, which an update "
    "may change in place before a digest could read it, so it is not compared"
)


def _digestible(tensor: Any) -> bool:
    # A reference (TF1 variable) is read when the digest runs, not when its consumer did.
    return dg.digestible(tensor.dtype) and not tensor.dtype._is_ref_dtype and not _undefined(tensor)


def _undefined(tensor: Any) -> bool:
    """Whether the kernel that made ``tensor`` leaves it undefined (stale memory)."""
    found = REGISTRY.graph_cache(tensor.graph).get(_UNDEFINED)
    return bool(found) and tensor.name in found


def _const_digest(tensor: Any) -> tuple[int, int] | None:
    """A constant's digest, computed once on the host when the graph is built (the same
    value the native op would give): the graph needs no op to digest it."""
    from tensorflow.python.framework import tensor_util

    from nddebug.tracer.eager import digest_host

    try:
        return digest_host(tensor_util.MakeNdarray(tensor.op.get_attr("value")))
    except Exception:  # noqa: BLE001 - an unusual constant: digest it in the graph
        return None


#: OpInfo.note of an op whose output digest is derived from its inputs' (see derived_digest).
DERIVED_NOTE = (
    "its output only moves its inputs' bytes: its digest is made from theirs (equal inputs, "
    "equal output), not read"
)


def _derivable(
    op_type: str, out_tensors: list[Any], outputs: Any, per_input: list[Any], blocked: Any
) -> bool:
    """Whether an op's output digest can be derived from its inputs' digests: a byte mover
    (ops.BYTE_MOVERS) on the host with one output, every input digested, not re-executed.
    On a GPU the output is read as before (the GPU kernels derive nothing)."""
    return (
        op_type in ops.BYTE_MOVERS
        and not blocked
        and len(outputs) == 1
        and out_tensors == list(outputs)
        and _digestible(out_tensors[0])
        and bool(per_input)
        and all(d is not None for d in per_input)
        and rerun.on_host(out_tensors[0].device)
    )


#: A dataset op's seed inputs: left out of its variant's stand-in digest (as eager's are,
#: eager._SEED_ARGS): seeds that differ make the order differ, which the reads show and name.
_SEED_INPUTS = frozenset({"seed", "seed2"})


def _dataset_lineage(
    graph: Any, op: Any, op_type: str, inputs: Any, outputs: Any, per_input: list[Any]
) -> None:
    """Give the datasets a graph op makes a stand-in digest, made from its inputs' digests
    (seeds left out), that what is built on them and what reads them take as an input; and an
    iterator bound to a dataset (MakeIterator) the dataset's. A dataset built inside a step
    from values that differ (from_tensor_slices of an unseeded random op's output) is then
    seen to differ down to the op that reads its elements, which only carries the
    difference; that op (IteratorGetNext, ReduceDataset) was named a second source, with
    advice to fix a pipeline that was deterministic (probe round 47, F11). Eager datasets
    get the same from eager._variant_lineage."""
    if "Dataset" not in op_type and op_type != "MakeIterator":
        return
    names = _input_names(op, op_type)
    if len(names) != len(inputs) or len(per_input) != len(inputs):
        return
    kept = [
        d
        for name, t, d in zip(names, inputs, per_input, strict=True)
        # A handle a dataset's function captures (a variable a `for` loop's body updates)
        # has no value of its own to carry.
        if name not in _SEED_INPUTS and not (d is None and t.dtype.name == "resource")
    ]
    if not kept or any(d is None or isinstance(d, bool) for d in kept):
        return  # a dataset from outside the function, or an unread input: nothing to carry
    cache = REGISTRY.graph_cache(graph)
    if op_type == "MakeIterator":
        cache[inputs[1].name] = kept[0]  # the iterator hands out the dataset's elements
        return
    variants = [t for t in outputs if t.dtype.name == "variant"]
    if variants:
        lineage = derived_digest(graph, kept)
        for t in variants:
            cache[t.name] = lineage


def _input_names(op: Any, op_type: str) -> list[str]:
    """The name of the op definition's argument each input of ``op`` fills (a list argument,
    ScanDataset's other_arguments, fills several); [] where that cannot be told."""
    op_def = ops.op_def(op_type)
    if op_def is None:
        return []
    names: list[str] = []
    try:
        for arg in op_def.input_arg:
            if arg.number_attr:
                n = int(op.get_attr(arg.number_attr))
            elif arg.type_list_attr:
                n = len(op.get_attr(arg.type_list_attr))
            else:
                n = 1
            names += [arg.name] * n
    except Exception:  # noqa: BLE001 - an attribute this op does not have
        return []
    return names


def derived_digest(graph: Any, in_digests: list[Any]) -> Any:
    """The digest of a byte mover's output, made from the digests its record holds as its
    inputs: the digest (docs/format.md) of those pairs, in order, as an int64 vector. Equal
    inputs give an equal output, and a byte mover keeps every input byte, so unequal inputs
    give an unequal one: comparing the derived digests compares the outputs, and the output's
    bytes (136 MB a step of a ResNet-like step's BatchNorm gradients, in Tile) are not read.
    Made by the digest op of the path in use (native or pure-TF), so both give the same bits."""
    import tensorflow as tf

    with tf.name_scope("nddebug"):
        pairs = tf.concat([tf.reshape(_as_tensor(d), [-1]) for d in in_digests], 0)
    return digest_in_graph(graph, pairs)


def _as_tensor(d: Any) -> Any:
    """A digest as a graph tensor: a constant's precomputed pair becomes an int64 [1, 2]."""
    import tensorflow as tf

    if isinstance(d, tuple):
        with tf.name_scope("nddebug"):
            return tf.constant([list(d)], tf.int64)
    return d


def _fused_lib(rec: Any, graph: Any, out_tensors: list[Any], k_rerun: int) -> Any:
    """The native library when this op's outputs can be digested and recorded by one fused op
    (native path, outputs on the host or on a GPU the library has kernels for, not digested
    already, no tensor values to keep)."""
    if k_rerun or rec.capture or not any(_digestible(t) for t in out_tensors):
        return None
    lib = transport.native_ops()
    if lib is None:
        return None
    cache = REGISTRY.graph_cache(graph)
    if any(t.name in cache or not (lib.gpu or rerun.on_host(t.device)) for t in out_tensors):
        return None
    return lib


def _send_fused(
    lib: Any,
    graph: Any,
    op_id: int,
    out_tensors: list[Any],
    in_digests: list[Any],
) -> Any:
    """Emit the fused digest-and-record op; its outputs become the outputs' digests."""
    import tensorflow as tf

    xs = [t for t in out_tensors if _digestible(t)]
    dynamic, static, at = [], [], []
    for i, d in enumerate(d for d in in_digests if d is not None):
        if isinstance(d, tuple):
            static.append(d)
            at.append(i)
        else:
            dynamic.append(d)
    with tf.name_scope("nddebug"), _beside(xs[0]):
        outs = lib.digest_record(op_id, xs, dynamic, static, at)
    cache = REGISTRY.graph_cache(graph)
    for t, d in zip(xs, outs, strict=True):
        cache[t.name] = d
    return outs[0].op


def _order_record(graph: Any, sender: Any, resource: str) -> None:
    """Give a record op the place it needs among the others, and no more.

    A record must run (a control output of its function) but waits in no line of stateful
    ops: it reads its inputs' digests from their records, and an op that waits for its
    input's digest (:func:`digests_first`) would otherwise wait for every record made
    before it; a record made late (an op caught up when its reader, a ``tf.cond`` or a
    loop, was made) would be ordered after that reader while the reader waits for it, a
    cycle. TensorFlow sees records as stateless (:func:`hook_statefulness`), so automatic
    control dependencies give them no place; this marks them as ops that must run. The rows
    of the ops on one resource (a variable, a table, a queue, an iterator) must arrive in
    program order (that order tells a read after a divergent write from a source): each
    such record waits for the record of the resource's previous op in this graph, the
    order the ops themselves run in."""
    acd = getattr(graph, "experimental_acd_manager", None)
    if acd is None or sender is None:
        return
    if type(getattr(acd, "_independent_ops", None)) is list:
        acd._independent_ops = _OpList(acd._independent_ops)
    acd.run_independently(sender)
    if resource:
        cache = REGISTRY.graph_cache(graph)
        slot = f"<last record of>{resource}"
        if cache.get(slot) is not None:
            sender._add_control_input(cache[slot])
        cache[slot] = sender


class _OpList(list):
    """The automatic-control-dependency manager's list of independent ops, with a set beside
    it: when the graph is complete the manager asks, for every op of the graph, whether it is
    in that list, and with a record per op a list makes that quadratic (~60 ms of a
    1,900-op step's first call). TensorFlow 2.21 only appends to it and asks membership (an
    Operation compares by identity); every other change rebuilds the set, so it cannot go
    stale under another TensorFlow."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self._ids = {id(x) for x in self}

    def append(self, op: Any) -> None:
        super().append(op)
        self._ids.add(id(op))

    def __contains__(self, op: object) -> bool:
        return id(op) in self._ids


def _rebuilding(name: str) -> Any:
    """A list method of _OpList that rebuilds the id set after the change."""
    method = getattr(list, name)

    def change(self: _OpList, *args: Any, **kwargs: Any) -> Any:
        out = method(self, *args, **kwargs)
        self._ids = {id(x) for x in self}
        return self if name == "__iadd__" else out

    return change


for _name in (
    "extend",
    "insert",
    "remove",
    "pop",
    "clear",
    "__iadd__",
    "__setitem__",
    "__delitem__",
):
    setattr(_OpList, _name, _rebuilding(_name))


_NEVER_FORWARDED = frozenset({"Placeholder", "Const"})
#: Ops whose kernels may take over only some inputs' buffers (forward_input_or_allocate_output
#: on those): an edge from another input's digest would be one more control input, and a
#: BiasAdd with one is not fused with its contraction (FindContractionWithBias).
_REUSES_ONLY = {"BiasAdd": (0,), "BiasAddV1": (0,)}
#: Contractions, their gradients and the bias gradient: their kernels always allocate a new
#: output (an input can have the output's number of elements all the same: a 1x1
#: convolution's filter gradient, [8, 1, 1, 16] -> [1, 1, 8, 16], in a squeeze-and-excite
#: block). A control edge into Conv2DBackpropFilter or BiasAddGrad keeps oneDNN from merging
#: the two into one kernel, which sums the bias gradient in another order.
_NEVER_REUSES_AN_INPUT = frozenset(
    {
        "Conv2D",
        "Conv3D",
        "DepthwiseConv2dNative",
        "MatMul",
        "BatchMatMul",
        "BatchMatMulV2",
        "BatchMatMulV3",
        "Einsum",
        "Conv2DBackpropFilter",
        "Conv2DBackpropInput",
        "Conv3DBackpropFilterV2",
        "Conv3DBackpropInputV2",
        "DepthwiseConv2dNativeBackpropFilter",
        "DepthwiseConv2dNativeBackpropInput",
        "BiasAddGrad",
    }
)


#: Ops that run a whole dataset inside the step (Dataset.reduce, a `for` loop over a dataset
#: in a tf.function, get_single_element).
_RUNS_A_DATASET = frozenset({"ReduceDataset", "DatasetToSingleElement"})

#: Function calls grappler inlines into the caller (see :func:`digests_first`).
_INLINED_CALLS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})


def digests_first(op: Any, inputs: Any, digests: list[Any], rewritable: bool = False) -> None:
    """Run the digest of an op's input before the op wherever the op could reuse that input's
    buffer for an output (same dtype and number of elements, or a shape not known when the
    graph is built). Whether a kernel forwards a buffer in place depends on whether anything
    else still holds it when the kernel starts; a digest that may still be reading it makes
    that choice timing-dependent, and some kernels (oneDNN's AddN) then compute other bits.
    Done first, the digest has let go of the tensor, so the op makes the choice it makes
    without nddebug. Other ops keep their schedule.

    ``rewritable``: grappler may rewrite the op together with its consumer
    (``data/rewrites.toml``). It then gets no edge unless it is a sum (``MERGED_SUMS``,
    which waits through an Identity grappler removes after merging): a control input keeps
    grappler from removing the op into a fused one (Sigmoid into oneDNN's _MklSwish,
    constants pushed down a product chain), and the kernel computes the same bits in place
    or not (a digest that still holds the input only keeps the buffer from being taken
    over while it reads)."""
    if rewritable and op.type not in MERGED_SUMS:
        return
    if op.type in _NEVER_REUSES_AN_INPUT:
        # No buffer to take over; and a control edge into a contraction stops grappler's
        # remapper from fusing it with its bias and activation (HasControlFaninOrFanout).
        return
    if op.type in _INLINED_CALLS:
        # Grappler inlines the call; a call with a control input is inlined behind an
        # input_control_node that every constant of the body then waits for, and those
        # edges stop rewrites the plain program makes (x * sigmoid(x) into _MklSwish once
        # silu's `beta * x` with beta 1 is removed: 1 ULP in the output). Ordering the
        # body's readers is left to the body's own records.
        return
    seen = set()
    reusable = _REUSES_ONLY.get(op.type)
    for position, (t, d) in enumerate(zip(inputs, digests, strict=False)):
        d_op = getattr(d, "op", None)
        if d_op is None or d_op.name in seen or d_op.graph is not op.graph:
            continue
        if reusable is not None and position not in reusable:
            continue
        if t.op.type in _NEVER_FORWARDED:
            # A function's argument or capture is held by the caller, a constant by the
            # graph: no kernel can take its buffer, so no order is needed (and an edge into a
            # sum would keep grappler from merging it, as in the plain program).
            continue
        if any(_may_forward(t, out) for out in op.outputs):
            seen.add(d_op.name)
            if op.type in MERGED_SUMS:
                _read_after(op, position, t, d_op)
            else:
                op._add_control_input(d_op)


def _read_after(op: Any, position: int, t: Any, d_op: Any) -> None:
    """Have a sum read its term ``position`` through an Identity that waits for the term's
    digest, instead of waiting for the digest itself. Grappler's AddOpsRewrite merges a chain
    of sums into one AddN only where no sum of it has a control input, as in a loop's
    gradient, which adds each iteration's terms one sum at a time; its dependency optimizer
    then removes the Identity and hands its wait to the merged AddN. The traced step sums
    in the plain step's order, after its records have let go of the terms."""
    import tensorflow as tf

    with (
        op.graph.as_default(),
        tf.name_scope(op.name + "/nddebug/"),
        tf.control_dependencies([d_op]),
    ):
        held = tf.identity(t, name="after_digest")
    if op.device:
        held.op._set_device(op.device)
    op._update_input(position, held)


#: Per-graph cache entry: tensor name -> the op that sends its value to the host (rerun mode,
#: check()'s capture runs) and holds its buffer until it runs.
_HELD_BY = "<held by>"


def _after_holders(graph: Any, op: Any) -> None:
    """Have a sum of three or more terms read each term after the op that sends that term's
    value to the host has let go of it. The sum takes over the buffer of the first term
    nothing else holds and adds the others to it: a term still held by its sender was not
    free, the sum added in another order than the plain step, and trace(rerun=1) changed the
    weights of every step with batch moments (probe round 48, F5). A term that waits for its
    digest already (:func:`_read_after`) waits for its sender too."""
    held = REGISTRY.graph_cache(graph).get(_HELD_BY)
    if not held:
        return
    for position, t in enumerate(list(op.inputs)):
        waiting = t.op.type == "Identity" and "/nddebug/after_digest" in t.op.name
        term = t.op.inputs[0] if waiting else t
        sender = held.get(term.name)
        if sender is None or sender.graph is not op.graph:
            continue
        if waiting:
            t.op._add_control_input(sender)
        else:
            _read_after(op, position, t, sender)


def _may_forward(t: Any, out: Any) -> bool:
    """Whether a kernel could hand ``t``'s buffer to ``out`` (TensorFlow's forward_input asks
    for the same dtype and number of elements)."""
    if t.dtype != out.dtype:
        return False
    if not (t.shape.is_fully_defined() and out.shape.is_fully_defined()):
        return True
    return t.shape.num_elements() == out.shape.num_elements()


#: Per-graph cache entry: dataset or iterator tensor name -> what PIPELINE_OPS lists for it.
_PIPELINES = "<pipelines>"


def _pipeline(rec: Any, graph: Any, info: OpInfo, op: Any, inputs: Any, outputs: Any) -> list[str]:
    """The op types of the tf.data functions a dataset, an iterator or an op that runs a
    dataset depends on: its own functions and those of the datasets it is built on.

    tf.data runs those functions where nddebug does not record, and a ``for x in dataset``
    loop inside a tf.function becomes one: its body (forward pass, gradients, optimizer) is
    a ScanDataset's function that ReduceDataset runs. Nothing of it was compared, its known
    culprits were not listed, and a difference it made (an unseeded random op) was blamed
    on "the input pipeline" alone. So the ops they hold go with the dataset to what reads it,
    for the risks and the explanation; and a warning says when such a function writes
    variables (a training loop): its ops are compared only through what it returns and
    writes."""
    cache = REGISTRY.graph_cache(graph)
    known = cache.get(_PIPELINES, {})
    found: set[str] = set()
    for t in inputs:
        found.update(known.get(t.name, ()))
    own: set[str] = set()
    if info.op_type.endswith("Dataset") or info.op_type.startswith("Dataset"):
        for name in opaque.data_functions(op.node_def.attr):
            own.update(opaque.ops_inside(name, graph))
    if own:
        writes = sorted({t for t in own if ops.WRITER.match(t)})
        if writes:
            where = f" at {info.location}" if info.location else ""
            # Said, not "not compared": what the function does reaches the step only through
            # what it returns and the variables it writes, which are compared where the step
            # reads them (and check() compares its state= after the step).
            say(
                rec,
                graph,
                f"{info.op_type}{where} runs a tf.data function that writes variables "
                f"({', '.join(writes[:4])}): the body of a `for ... in dataset` loop inside a "
                "tf.function (or a Dataset.map/scan/reduce function). tf.data runs it where "
                "nddebug does not record, so its ops are not compared one by one: what it "
                "returns and the variables it writes are compared where the step reads them "
                "(check() compares its state= after the step too), and what is known to differ "
                "among its ops is listed with the risks. Iterate the dataset outside the "
                "tf.function (one traced step per batch) to compare every op.",
            )
    if own and inputs and getattr(inputs[0].dtype, "name", "") == "variant":
        # A loop over a dataset made before the function, shuffled with a seed: every call
        # is the dataset's next pass (see datasets.reshuffles and analysis._seeded_passes).
        outer = _captured_from(graph, inputs[0])  # a dataset made outside the function
        variant = inputs[0] if outer is None else outer
        looped = datasets.dataset_of(variant)
        passes = datasets.reshuffles(looped)
        if passes:
            # Whether nothing else in the dataset makes elements differ (read through, no
            # stage found): only then is the reshuffle the whole story.
            alone = datasets.read_through(looped) and not datasets.dataset_stages(looped)
            info.attrs[DATASET_PASSES] = {"function": {**passes, "alone": alone}}
    found |= own
    if not found:
        return []
    pipeline = cache.setdefault(_PIPELINES, {})
    for t in outputs:
        pipeline[t.name] = found
    if info.op_type == "MakeIterator" and len(inputs) > 1:
        pipeline[inputs[1].name] = found  # the iterator its reads come from
    return sorted(found)


def _parallel_random(graph: Any, op: Any) -> list[str]:
    """The stateful random ops in a while loop's body (and what it calls) when the loop runs
    iterations side by side: they share one generator state that the iterations reach in
    thread order, a race the plain loop has and the traced one cannot show, since every
    loop variable of the traced body waits for the iteration's records and so the traced
    iterations run one after another."""
    attr = op.node_def.attr
    if "parallel_iterations" not in attr or attr["parallel_iterations"].i <= 1:
        return []
    body = attr["body"].func.name if "body" in attr else ""
    inside = opaque.ops_inside(body, graph) if body else ()
    found = sorted({t.split("(")[0] for t in inside if t.endswith(("(unseeded)", "(random)"))})
    return found if found and not _draws_chained(graph, body) else []


def _draws_chained(graph: Any, body: str) -> bool:
    """Whether every stateful random op of a loop body needs, through a loop variable, what
    its own previous iteration drew (autoregressive sampling: the next token's logits come
    from the last sample), so that its iterations cannot reach it side by side. Only random
    ops at the body's top level are followed: one inside a branch or call counts as not
    chained."""
    fdef = opaque.function_def(body, graph)
    if fdef is None:
        return False
    args = [a.name for a in fdef.signature.input_arg]
    inputs: dict[str, list[str]] = {}
    random_nodes: list[str] = []
    for node in fdef.node_def:
        if unneeded.made_by_nddebug(node.name):
            continue
        inputs[node.name] = [x.lstrip("^").split(":")[0] for x in node.input]
        if node.op in opaque.RANDOM_OPS:
            random_nodes.append(node.name)
    if not random_nodes or any(
        t.endswith(("(unseeded)", "(random)")) for t in _nested_random(fdef, graph)
    ):
        return False

    def ancestors(start: list[str]) -> set[str]:
        seen: set[str] = set()
        todo = list(start)
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo += inputs.get(name, [])
        return seen

    outputs = [fdef.ret[o.name].split(":")[0] for o in fdef.signature.output_arg]
    for r in random_nodes:
        needs = ancestors(inputs[r])
        if not any(
            arg in needs and j < len(outputs) and r in ancestors([outputs[j]])
            for j, arg in enumerate(args)
        ):
            return False
    return True


def _nested_random(fdef: Any, graph: Any) -> tuple[str, ...]:
    """The random ops of the functions a body calls (branches, calls), not of the body."""
    found: list[str] = []
    for node in fdef.node_def:
        for value in node.attr.values():
            names = [value.func.name] if value.HasField("func") else []
            names += [f.name for f in value.list.func] if value.HasField("list") else []
            for name in names:
                found += opaque.ops_inside(name, graph)
    return tuple(found)


def _note_xla(rec: Any, graph: Any) -> None:
    """An XLA graph is not instrumented; the recorder warns once for all of them, counting
    the branches and loop bodies of each XLA function with it."""
    REGISTRY.xla_graphs.add(graph)
    top = graph
    while hasattr(top.outer_graph, "outer_graph") and in_xla(top.outer_graph):
        top = top.outer_graph
    name = ops.function_name(ops.as_str(top.name))
    if top is not graph:
        REGISTRY.xla_nested.setdefault(name, set()).add(ops.as_str(graph.name))
    rec.xla_functions.add(name)


def _power_of_one(inputs: Any, outputs: Any) -> bool:
    """Whether a Pow raises its input to a constant 1, as the gradient of ``y ** 2`` does
    (``2 * pow(y, 2 - 1)``): its output is its input bit for bit, and grappler removes it
    (ConvertPow), so that the product reading it reads ``y``, and may be rewritten with it.
    It is passed through as an Identity is."""
    from tensorflow.python.framework import tensor_util

    if len(inputs) != 2 or len(outputs) != 1:
        return False
    x, y = inputs
    value = _static_value(y, tensor_util)
    same = x.dtype == outputs[0].dtype and x.shape.is_fully_defined()
    same = same and x.shape == outputs[0].shape
    return value is not None and same and bool((value == 1).all())


#: Arithmetic on constants that :func:`_static_value` folds (the gradient's ``y - 1``).
_FOLDABLE = {"Sub": lambda a, b: a - b, "AddV2": lambda a, b: a + b, "Mul": lambda a, b: a * b}


def _static_value(t: Any, tensor_util: Any, depth: int = 3) -> Any:
    """A tensor's value when the graph fixes it: what TensorFlow knows statically, or a sum,
    difference or product of such values (None if neither)."""
    try:
        value = tensor_util.constant_value(t)
    except Exception:  # noqa: BLE001 - not known while the graph is built
        value = None
    if value is not None or depth == 0 or t.op.type not in _FOLDABLE or len(t.op.inputs) != 2:
        return value
    a, b = (_static_value(u, tensor_util, depth - 1) for u in t.op.inputs)
    return None if a is None or b is None else _FOLDABLE[t.op.type](a, b)


def _key_base(graph: Any, op: Any) -> str:
    """An op's key before a duplicate's "#n" (see OpInfo.key)."""
    return f"{graph_key(graph)}/{ops.UID_IN_NAME.sub('', op.name)}"


#: Per-graph cache entry: names of the graph's ops the op callback was handed (nddebug's own
#: included). Any other op was made without op callbacks (``Graph.create_op``: the ops
#: ``tf.vectorized_map`` and ``jacobian`` make from a loop body), and is instrumented when an
#: instrumented op reads it (:func:`_catch_up`).
SEEN = "<seen ops>"


def note_seen(graph: Any, op_name: str | None) -> None:
    """The op callback was handed this op (whether or not nddebug instruments it)."""
    if op_name:
        REGISTRY.graph_cache(graph).setdefault(SEEN, set()).add(op_name)


def _note_replacements(graph: Any, outputs: Any, op_name: str) -> None:
    """Another op callback (``nddebug.emulate_gpu``, tfdbg2) handed on other outputs than the
    op's own, made by ops it created inside its callback, which no callback is handed. They
    are recorded as this op's outputs: they must not be caught up as ops of their own (their
    record would wait for this op's record, which reads them: a cycle)."""
    seen = REGISTRY.graph_cache(graph).setdefault(SEEN, set())
    stack = [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op.graph is not graph or op.name == op_name or op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)


def _catch_up(rec: Any, graph: Any, inputs: Any) -> None:
    """Instrument the ops that ``inputs`` come from which were made without op callbacks,
    and theirs before them: without it, a random op that ``tf.vectorized_map`` vectorized
    ran unrecorded and the first recorded op that read it was blamed, as if the difference
    came from outside TensorFlow."""
    seen = REGISTRY.graph_cache(graph).setdefault(SEEN, set())
    order: list[Any] = []
    stack = [(t.op, False) for t in inputs]
    while stack:
        op, expanded = stack.pop()
        if expanded:
            order.append(op)
            continue
        if op.graph is not graph or op.name in seen or unneeded.ours(op):
            continue
        seen.add(op.name)  # marked first: each is instrumented once, after its inputs' ops
        stack.append((op, True))
        stack.extend((t.op, False) for t in op.inputs)
    for op in order:
        instrument_op(
            rec,
            _emulated_type(graph, op),
            list(op.inputs),
            dict(op.node_def.attr),
            list(op.outputs),
            op.name,
            graph,
        )


def _emulated_type(graph: Any, op: Any) -> str:
    """The op type to record ``op`` as: that of the op emulate_gpu() emulated where pfor
    vectorized the emulation's ops (".../UnsortedSegmentSum/emulate_gpu/mask/pfor/
    RandomUniform"), which had no op callbacks. The emulation's random mask was blamed as the
    user's unseeded random op, with the advice to seed it (probe round 38); it is the emulated
    kernel's reordering, named and advised as that kernel."""
    name = op.name
    if EMULATION_SCOPE not in name:
        return op.type
    try:
        return graph.get_operation_by_name(name.split(EMULATION_SCOPE)[0]).type
    except (KeyError, ValueError):
        return op.type


def instrument_op(
    rec: Any,
    op_type: str,
    inputs: Any,
    attrs: Any,
    outputs: Any,
    op_name: str | None,
    graph: Any,
    frame: Any = None,
) -> Any:
    """Add the digest ops and the host callback for one graph op, as it is created; return
    the op that delivers its executions (None when nothing of it is recorded). ``frame``:
    where the op callbacks were invoked from, when the op is being made now (its location
    is then read from the live stack, see location.creation_location)."""
    import tensorflow as tf

    note_seen(graph, op_name or (outputs[0].op.name if outputs else None))
    if outputs and op_name and outputs[0].op.name != op_name:
        _note_replacements(graph, outputs, op_name)
    if op_type in ops.SKIP_OPS:
        # Nothing to record, but what it reads is read outside any rewrite: an
        # intermediate left for its readers is recorded now.
        cache = REGISTRY.graph_cache(graph)
        for t in inputs:
            d = cache.get(t.name)
            if isinstance(d, Deferred):
                d.materialize()
        return None
    if in_xla(graph):
        _note_xla(rec, graph)
        return None
    if not is_v1_graph(graph):  # a TF1 graph's ops are all instrumented by its Session.run
        _catch_up(rec, graph, inputs)
    cache = REGISTRY.graph_cache(graph)
    alias = ops.ALIAS_OPS.get(op_type, -1)
    if op_type == "Pow" and _power_of_one(inputs, outputs):
        alias = 0
    ref_read = False
    if any(t.dtype._is_ref_dtype for t in inputs):
        # An Identity of a TF1 reference variable reads it: a real op. But its output is the
        # variable's own buffer, which an update (ApplyAdam) changes in place, perhaps before
        # the digest reads it: identical runs differed there, "a new finding" (probe round
        # 46, F4). Not digested: see REF_READ_NOTE.
        ref_read = alias != -1
        alias = -1
        if ref_read:
            cache.setdefault(_UNDEFINED, set()).update(t.name for t in outputs)
    name = op_name or (outputs[0].op.name if outputs else "")
    k_rerun = rec.rerun_for(f"{graph_key(graph)}/{ops.UID_IN_NAME.sub('', ops.as_str(name))}")
    host = bool(k_rerun) and rerun.on_host(outputs[0].device if outputs else "")
    if alias != -1 and host:
        return None  # rerun mode on the host digests no inputs: nothing to pass through
    if alias != -1:
        # Pass-through: consumers see the producer's digest; nothing runs.
        pipelines = cache.get(_PIPELINES, {})
        for i, out in enumerate(outputs):
            src = inputs[i if alias is None else alias] if inputs else None
            if src is not None and src.name in pipelines:
                pipelines[out.name] = pipelines[src.name]  # a dataset passed on (see _pipeline)
            if src is not None:
                cache[out.name] = _passed_through(graph, src)
                by_name = cache.get(DEFERRED, {})
                if src.name in by_name:  # the same intermediate, for the ops that fuse with it
                    by_name[out.name] = by_name[src.name]
        return None
    op = outputs[0].op if outputs else None
    callee = _called(attrs) if op_type in _INLINED_CALLS else ""  # the function it calls
    if (op is None or ops.as_str(op.type) != op_type) and op_name:
        # Another op callback (e.g. nddebug.emulate_gpu) may have replaced the outputs.
        op = graph.get_operation_by_name(op_name)
    out_tensors = list(outputs)
    if callee in REGISTRY.forward_outputs:
        # A gradient's forward call: its outputs past the function's own are intermediates
        # for the backward call, whose record holds those it reads. Recorded here too, they
        # were readers the plain program does not have once grappler inlines both calls (the
        # IdentityN of silu's gradient stayed, and silu * 1.3 was not rewritten as plain).
        out_tensors = out_tensors[: REGISTRY.forward_outputs[callee]]
    note = REF_READ_NOTE if ref_read else ""
    written = ops.written_value(op_type, inputs) if not out_tensors else None
    if written is not None:
        out_tensors = [written]  # digested already as the input: no read-back, no new digest
        note = UPDATE_NOTE
    elif not out_tensors and ops.WRITER.match(op_type) and inputs:
        dtype = ops.dtype_attr(attrs)
        if dtype is not None:
            from tensorflow.python.ops import gen_resource_variable_ops

            overwritten = is_v1_graph(graph) and op.name in REGISTRY.graph_cache(graph).get(
                OVERWRITTEN, ()
            )
            if overwritten:
                value = None  # compared through its inputs (see OVERWRITTEN)
            elif is_v1_graph(graph):
                # Not tf.control_dependencies: it marks the update op too, and a TF1 op that a
                # session has run must not change.
                with tf.name_scope("nddebug"):
                    value = gen_resource_variable_ops.read_variable_op(inputs[0], dtype)
                value.op._add_control_input(op)
            else:
                with tf.control_dependencies([op]), tf.name_scope("nddebug"):
                    value = gen_resource_variable_ops.read_variable_op(inputs[0], dtype)
            if value is not None:
                out_tensors = [value]
                note = UPDATE_NOTE
    after_write = bool(note)  # the outputs are a variable's value after this op wrote it
    if out_tensors and not after_write:
        at, why = undefined.undefined_outputs(op_type, attrs)
        if at:
            # Left undefined by the kernel: not digested (see tracer.undefined).
            cache.setdefault(_UNDEFINED, set()).update(out_tensors[i].name for i in at)
            note = why
    if op_type in ("Const", "Placeholder") and not after_write:
        # Constants are fixed by the graph; placeholders are digested by their consumers.
        return None
    fused = None
    defer = False
    fused_with: dict[str, str] = {}
    inside: frozenset[str] = frozenset()
    base = _key_base(graph, op)
    if host:
        # Rerun mode on the CPU: the host digests, so the graph needs no digest ops.
        out_digests: list[Any] = [
            True if dg.digestible(t.dtype) and not _undefined(t) else None for t in out_tensors
        ]
        in_digests: list[Any] = []
        readable_out: list[Any] = []
    else:
        v1 = is_v1_graph(graph)
        by_caller = False
        if op_type in SHAPE_ONLY_OPS or op_type in MERGE_OPS:
            in_digests, per_input = [], []  # they read shapes (SHAPE_ONLY_OPS); MERGE_OPS
        else:
            args, readers = _call_inputs(callee, inputs)
            in_digests, per_input, fused_with, inside, by_caller = _input_digests(
                graph, "" if v1 else op_type, args, op.device or "", readers
            )
        if by_caller and not note:
            note = ARGUMENT_BY_CALLER
        rewritable = rewrites.may_fuse(op_type, op.device or "", inside)
        if not v1:  # a TF1 op may have run already: it must not change
            digests_first(op, inputs, per_input, rewritable)
        from_calls = _from_calls(callee, out_tensors) if not k_rerun else {}
        if from_calls:  # recorded where they are read (see _from_calls), not by the call
            out_tensors = [t for i, t in enumerate(out_tensors) if i not in from_calls]
            _defer_in_caller(rec, graph, from_calls, in_digests)
        copies = ops.input_copies(op_type, attrs) if out_tensors == list(outputs) else {}
        if copies:
            # Copies of inputs (see ops.INPUT_COPIES): compared as those inputs, where
            # something reads them; not read by this op's record.
            for i, j in copies.items():
                if j is None:
                    cache.setdefault(_UNDEFINED, set()).add(outputs[i].name)
                else:
                    cache[outputs[i].name] = _passed_through(graph, inputs[j])
            out_tensors = [t for i, t in enumerate(out_tensors) if i not in copies]
            note = note or (
                f"outputs {', '.join(str(i) for i in copies)} are copies of its inputs "
                f"({ops.INPUT_COPIES[op_type][0][0]}={ops.INPUT_COPIES[op_type][0][1]}): "
                "compared as those inputs"
            )
        if _derivable(op_type, out_tensors, outputs, per_input, k_rerun or after_write):
            # Its output only moves its inputs' bytes (ops.BYTE_MOVERS): its digest is made
            # from theirs, without reading the output (see derived_digest).
            out_digests = [derived_digest(graph, in_digests)]
            cache[out_tensors[0].name] = out_digests[0]
            note = note or DERIVED_NOTE
        else:
            fused = _fused_lib(rec, graph, out_tensors, k_rerun)
            defer = (
                not v1
                and rewritable
                and len(out_tensors) == 1
                and not (rec.capture and base in rec.capture)
                and not after_write
                and _digestible(out_tensors[0])
            )
            if fused is not None or defer:  # digested by the op that records them, below
                out_digests = [True if _digestible(t) else None for t in out_tensors]
            else:
                out_digests = [digest_in_graph(graph, t) for t in out_tensors]
        _dataset_lineage(graph, op, op_type, inputs, outputs, per_input)
        readable_out = [d for d in out_digests if d is not None]
    readable_in = [d for d in in_digests if d is not None]
    stateful = bool(op._is_stateful) if hasattr(op, "_is_stateful") else False
    blocker = ""
    payload: list[Any] = []
    copies = 0
    if k_rerun:
        blocker = ops.rerun_blocker(op_type, stateful, len(inputs), out_digests, after_write)
        blocker = blocker or rerun.blocker(op_type, op.device or "")
        dups = [] if blocker else rerun.duplicates(graph, op, inputs, k_rerun)
        copies = len(dups)
        for slot, (t, d) in enumerate(zip(out_tensors, out_digests, strict=False)):
            if d is None:
                continue
            again = [dup.outputs[slot] for dup in dups]
            if host:
                payload += [t, *again]
            elif dups:
                payload += rerun.device_payload(t, again)
    if ops.sums_in_place(op_type, len(inputs)):
        _after_holders(graph, op)
    state = ops.state_input(op_type, inputs)
    op_id = REGISTRY.new_id()
    seen = REGISTRY.graph_keys.setdefault(graph, {})
    count = seen.get(base, 0)
    seen[base] = count + 1
    key = base if count == 0 else f"{base}#{count}"
    info = OpInfo(
        op_id=op_id,
        key=key,
        op_type=op_type,
        op_name=op.name,
        graph=graph_name(graph),
        device=op.device or "",
        location=(
            creation_location(op, frame, rec.lib_dirs)
            if frame is not None
            else graph_location(op, rec.lib_dirs)
        ),
        dtypes=[t.dtype.name for t in out_tensors],
        shapes=[t.shape.as_list() if t.shape.rank is not None else None for t in out_tensors],
        digestible=[d is not None for d in out_digests],
        stateful=stateful,
        attrs=ops.interesting_attrs(attrs),
        note=note,
        rerun=blocker,
        fused=fused_with,
        resource=variable_identity(graph, state) if state is not None else "",
        # A call of another function: whether nddebug sees inside it (its inner ops explain
        # what it returns) or not (then it is judged as an opaque call), as for eager calls.
        function=opaque.function_kind(callee) if callee else "",
    )
    if after_write and info.resource.startswith("eager:") and kept_per_replica(info.resource):
        info.attrs[PER_REPLICA] = True  # see recording.PER_REPLICA
    form = ops.attrs_form(attrs)
    if form:  # its attribute values: compared like its inputs (see ops.attrs_form)
        info.attrs["form"] = ops.form_code(form)
    if info.function in ("uninstrumented", "xla"):
        # What can be said of it without seeing it run (a random op inside), as for an
        # eager call of such a function.
        info.attrs["ops_inside"] = list(opaque.ops_inside(callee))
    elif callee in REGISTRY.function_keys:
        info.attrs["callee_key"] = REGISTRY.function_keys[callee]
    pipeline = _pipeline(rec, graph, info, op, inputs, outputs)
    if pipeline:
        info.attrs[PIPELINE_OPS] = pipeline
    if op_type in _RUNS_A_DATASET and inputs:
        # A dataset run inside the step, built there too: what in it makes elements differ,
        # named with the op if it is a source (probe round 48, F4).
        dataset = datasets.dataset_of(inputs[0])
        if dataset is not None:
            stages = datasets.dataset_stages(dataset)
            if stages or datasets.read_through(dataset):
                info.attrs[DATASET_STAGES] = {key: stages}
    if op_type in ("While", "StatelessWhile"):
        racing = _parallel_random(graph, op)
        if racing:
            info.attrs[PARALLEL_RANDOM] = racing
    with REGISTRY.lock:
        REGISTRY.ops[op_id] = info
        if payload:
            REGISTRY.reruns[op_id] = (copies, host)
    if info.function == "uninstrumented":
        # A call to an XLA function (traced in the block or not) is said once for all by the
        # recording's XLA warning; a call TensorFlow added without op callbacks is caught up.
        # Only a call tree that writes a variable hides something: what one that reads its
        # variables returns is compared where it is read (probe round 37, finding 3).
        writes = any(getattr(t, "dtype", None) == tf.resource for t in inputs) and bool(
            opaque.written_args(callee)
        )
        say(
            rec,
            graph,
            (NOT_COMPARED if writes else "")
            + f"graph {graph.name} calls function {callee}, traced before nddebug.trace(): "
            "its inner ops are not recorded, only its outputs"
            + (", and the variables it captures are not compared." if writes else "."),
        )
    if not readable_out and not readable_in and not payload:
        return None
    # Decided now, not read from the recorder when the record is made: a Deferred never made
    # lives as long as its graph (TensorFlow keeps a traced function's graph for the life of
    # the process), and a closure over the recorder kept every block's recording with it
    # (a DeterminismCheck's process grew by its checks' events).
    capture_outputs = bool(rec.capture and key in rec.capture and not payload)

    def emit() -> tuple[Any, Any]:
        """Make the op that records this op's executions: it, and the first output's digest."""
        if fused is not None:
            sender = _send_fused(fused, graph, op_id, out_tensors, in_digests)
            _order_record(graph, sender, info.resource)
            return sender, REGISTRY.graph_cache(graph).get(out_tensors[0].name)
        outs, sent = out_digests, readable_out
        if defer:
            REGISTRY.graph_cache(graph).pop(out_tensors[0].name, None)
            outs = [digest_in_graph(graph, t) for t in out_tensors]
            sent = [d for d in outs if d is not None]
        captured = payload
        if capture_outputs:
            captured = [t for t, d in zip(out_tensors, outs, strict=False) if d is not None]
        sender = transport.send(
            op_id, [_as_tensor(d) for d in sent], [_as_tensor(d) for d in readable_in], captured
        )
        _order_record(graph, sender, info.resource)
        if captured:  # holds them until it runs (see _after_holders)
            held = REGISTRY.graph_cache(graph).setdefault(_HELD_BY, {})
            held.update((t.name, sender) for t in captured)
        first = outs[0] if outs and not isinstance(outs[0], bool) else None
        return sender, first

    if defer and not payload:
        # Recorded once an op it does not fuse with reads it (see Deferred).
        deferred = Deferred(op_type, in_digests, emit, key, fused_with, inside, out_tensors[0])
        deferred.op_id = op_id
        deferred.by_caller = info.note == ARGUMENT_BY_CALLER
        cache = REGISTRY.graph_cache(graph)
        cache[out_tensors[0].name] = deferred
        cache.setdefault(DEFERRED, {})[out_tensors[0].name] = deferred
        return None
    return emit()[0]
