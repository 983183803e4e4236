"""Calls nddebug cannot see inside: a tf.function traced before the block, or one compiled
with XLA. Their inner ops are not recorded, so what they can change is compared at their
boundary: the variables they capture are read and digested before and after each call.

The value after the call is read in the op callback (which TensorFlow runs after the call);
the value before it is read by a hook on the eager function-call entry point, active only
while a recorder is.
"""

from __future__ import annotations

import functools
import gc
import sys
import threading
from typing import Any

from nddebug import digest as dg
from nddebug import knowledge
from nddebug.recording import INTEGER_OUTPUTS, NOT_COMPARED, RANDOM_OPS, WRITER, XLA_NOTE
from nddebug.tracer import ops, optimized_sums, plain, unneeded
from nddebug.tracer.registry import REGISTRY, busy, inside_nddebug

_NESTED_ATTRS = (
    "f",
    "then_branch",
    "else_branch",
    "body",
    "cond",
    "branches",
    "init_func",
    "next_func",
    "finalize_func",
)


@functools.lru_cache(maxsize=4096)
def _function_def(name: str) -> Any:
    from tensorflow.python.eager import context

    try:
        return context.context().get_function_def(name)
    except Exception:  # noqa: BLE001 - not in this context's library: treat as unknown
        return None


def function_kind(name: str) -> str:
    """ "instrumented", "xla" or "uninstrumented" for a function the process can call."""
    if name in REGISTRY.instrumented_functions:
        return "instrumented"
    if name in REGISTRY.xla_functions:
        return "xla"
    fdef = _function_def(name)
    if fdef is not None and ops.xla_must_compile(fdef):
        return "xla"
    return "uninstrumented"


def ops_inside(name: str, graph: Any = None) -> tuple[str, ...]:
    """The op types a function runs, with those of the functions it calls (branches, loop
    bodies): what can be said of an opaque call without seeing it run. Stateful random ops
    are listed as ``<type>(random)`` or ``<type>(unseeded)``: seeded or not, they advance on
    every call; an op with integer outputs as ``<type>(integer)`` (``INTEGER_OUTPUTS``).
    ``graph``: the graph whose library holds the function (a tf.data function or
    a loop body is added to the context only when that graph's function is); looked up
    anew, so that no graph is kept alive by a cache."""
    return _ops_inside(name, graph) if graph is not None else _ops_inside_cached(name)


@functools.lru_cache(maxsize=1024)
def _ops_inside_cached(name: str) -> tuple[str, ...]:
    return _ops_inside(name, None)


def _integer_outputs(node: Any) -> bool:
    """Whether a node's output type attribute (``T``, else ``dtype``) is an integer or bool."""
    from tensorflow.python.framework import dtypes

    for name in ("T", "dtype"):
        if name in node.attr and node.attr[name].HasField("type"):
            dtype = dtypes.as_dtype(node.attr[name].type)
            return dtype.is_integer or dtype.is_bool
    return False


def _ops_inside(name: str, graph: Any) -> tuple[str, ...]:
    return ops_of_nodes([], graph, [name])


def ops_of_nodes(nodes: Any, graph: Any, functions: Any = ()) -> tuple[str, ...]:
    """The op types of ``nodes`` (NodeDefs) and of the functions they call, and of the named
    ``functions``, as :func:`ops_inside` lists them: what an opaque part of a graph (a
    function, a TF1 while loop's frame) holds."""
    seen: set[str] = set()
    found: set[str] = set()

    def add(node: Any) -> None:
        op = node.op
        if unneeded.made_by_nddebug(node.name):
            return  # its digests, records and emulate_gpu()'s random masks
        if op in RANDOM_OPS:
            seeded = node.attr["seed"].i or node.attr["seed2"].i
            found.add(f"{op}(random)" if seeded else f"{op}(unseeded)")
        elif _integer_outputs(node):
            found.add(f"{op}{INTEGER_OUTPUTS}")
        else:
            found.add(op)
        # Calls, branches, loop bodies, a tf.data op's functions (a generator's Python
        # ones included), a function called by its own name as an op type.
        todo.extend(ops.callees(node))

    todo = list(functions)
    for node in nodes:
        add(node)
    while todo:
        fname = todo.pop()
        if fname in seen:
            continue
        seen.add(fname)
        fdef = function_def(fname, graph)
        if fdef is None:
            continue
        for node in fdef.node_def:
            add(node)
    return tuple(sorted(found))


def function_def(name: str, graph: Any = None) -> Any:
    """``name``'s FunctionDef, from ``graph``'s library (or an outer graph's) or the context;
    None where neither has it."""
    return _library_def(graph, name) or _function_def(name)


def _library_def(graph: Any, name: str) -> Any:
    """``name``'s FunctionDef in ``graph``'s function library or an outer graph's; None."""
    while graph is not None:
        fn = getattr(graph, "_functions", {}).get(name)
        if fn is not None:
            try:
                return fn.definition
            except Exception:  # noqa: BLE001 - another kind of function object
                return getattr(fn, "cached_definition", None)
        graph = getattr(graph, "outer_graph", None)
    return None


def data_functions(attrs: Any) -> list[str]:
    """The functions a tf.data op runs for its elements (map, filter, scan, reduce, group_by,
    window functions...): every attribute holding one."""
    out = []
    for value in attrs.values():
        if value.HasField("func") and value.func.name:
            out.append(value.func.name)
        elif value.HasField("list"):
            out += [f.name for f in value.list.func]
    return out


#: Ops whose variant output holds values nddebug has not digested: an iterator's next element
#: wrapped in an optional. An optional or a tensor list filled from tensors the step computed
#: (Keras's fit returns its logs as an optional) holds values compared as those tensors.
UNOPENED_VARIANT_OPS = frozenset({"IteratorGetNextAsOptional"})
#: What reads an optional's values out (OptionalHasValue reads only whether it has one).
_OPENERS = frozenset({"OptionalGetValue"})
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


@functools.lru_cache(maxsize=1024)
def returns_unopened_variant(name: str) -> bool:
    """Whether function ``name`` returns a variant made by an op of UNOPENED_VARIANT_OPS
    (through Identity ops and calls) whose values no op of the function reads out: what the
    call returns then holds values that were never compared."""
    fdef = _function_def(name)
    if fdef is None:
        return False
    nodes = {n.name: n for n in fdef.node_def}

    def source(ref: str) -> Any:
        node = nodes.get(ref.lstrip("^").split(":")[0])
        while node is not None and node.op == "Identity" and node.input:
            node = nodes.get(node.input[0].split(":")[0])
        return node

    opened = {
        source(i).name
        for n in fdef.node_def
        if n.op in _OPENERS
        for i in n.input[:1]
        if source(i) is not None
    }
    for ref in fdef.ret.values():
        node = source(ref)
        if node is None:
            continue
        if node.op in UNOPENED_VARIANT_OPS and node.name not in opened:
            return True
        if node.op in _CALLS and returns_unopened_variant(node.attr["f"].func.name):
            return True
    return False


def variable_inputs(inputs: Any) -> list[tuple[Any, Any]]:
    """The (handle, dtype) of each resource-variable input of a call: its captured state."""
    import tensorflow as tf

    out = []
    for t in inputs:
        if getattr(t, "dtype", None) != tf.resource:
            continue
        data = getattr(t, "_handle_data", None)
        if data is None or not data.shape_and_type:
            continue
        out.append((t, tf.as_dtype(data.shape_and_type[0].dtype)))
    return out


def read_state(variables: list[tuple[Any, Any]]) -> list[Any]:
    """The current value of each variable (None where it cannot be read)."""
    from nddebug.tracer.eager import read_variable

    with inside_nddebug():
        return [read_variable(handle, dtype) for handle, dtype in variables]


def state_digests(inputs: Any) -> list[dg.Digest | None]:
    from nddebug.tracer.eager import digest_eager_tensors

    with inside_nddebug():
        return digest_eager_tensors(read_state(variable_inputs(inputs)))


def variable_names(handles: list[Any]) -> list[str]:
    """The names of the variables behind eager resource handles (found once per block by
    looking through the live variables: a handle does not know its variable)."""
    from tensorflow.python.ops import resource_variable_ops

    wanted = {id(h) for h in handles}
    keras = sys.modules.get("keras")
    keras_variable = getattr(keras, "Variable", None) if keras is not None else None
    variables = (resource_variable_ops.BaseResourceVariable,)
    if isinstance(keras_variable, type):
        variables += (keras_variable,)
    names: dict[int, str] = {}
    keras_paths: dict[int, str] = {}  # a Keras 3 variable's path names its tf.Variable better
    found = [obj for obj in gc.get_objects() if isinstance(obj, variables)]
    for obj in found:
        if isinstance(obj, resource_variable_ops.BaseResourceVariable):
            try:
                handle = obj.handle
            except Exception:  # noqa: BLE001 - a variable without an eager handle
                continue
            if id(handle) in wanted:
                names[id(handle)] = names.get(id(handle)) or obj.name
        elif isinstance(getattr(obj, "path", None), str):
            keras_paths[id(getattr(obj, "_value", None))] = obj.path
    for obj in found:
        if id(obj) in keras_paths and isinstance(obj, resource_variable_ops.BaseResourceVariable):
            names[id(obj.handle)] = keras_paths[id(obj)]
    return [names.get(id(h), f"captured variable {i}") for i, h in enumerate(handles)]


def xla_warning(functions: set[str]) -> str:
    """One warning for every XLA-compiled function of a run, however many branches they have."""
    names = sorted({ops.function_name(n) for n in functions})
    nested = sum(len(REGISTRY.xla_nested.get(n, ())) for n in names)
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    inner = f" ({nested} of them branches, loop bodies or gradients of the others)"
    inner = inner if nested else ""
    return f"{len(names) + nested} XLA-compiled function(s){inner}: {shown}. {XLA_NOTE}"


def xla_called(graph: Any) -> set[str]:
    """The XLA-compiled functions an instrumented function's graph calls (traced before the
    block, or elsewhere): each run that calls it names them in its one XLA warning, as it
    names those traced in the block."""
    names = set()
    for op in graph.get_operations():
        if op.type in ("StatefulPartitionedCall", "PartitionedCall"):
            name = ops.as_str(op.get_attr("f").name)
            if function_kind(name) == "xla":
                names.add(name)
    return names


INT64 = 9  # types_pb2.DT_INT64: a generator's state
_RESOURCE = 20  # types_pb2.DT_RESOURCE
#: Ops that pass their inputs on to the functions they call, from this input on (a branch's
#: first input is its condition); other calls (PartitionedCall, While, a function called by
#: name) from input 0. A tf.data op's functions take other arguments: not followed.
_BRANCHES = {"If": 1, "StatelessIf": 1, "Case": 1, "StatelessCase": 1}
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "While", "StatelessWhile"})


def _written_inputs(node: Any) -> dict[int, int]:
    """The positions of a FunctionDef node's inputs whose variables it writes, with the
    variable's dtype: a generator op moves its int64 state on; an update writes its resource
    inputs (an optimizer's apply: the variable and its slots), of its ``dtype`` or ``T``."""
    if knowledge.advances_generator(node.op):
        return {0: INT64}
    if not WRITER.match(node.op):
        return {}
    op_def = ops.op_def(node.op)
    attr = node.attr.get("dtype") or node.attr.get("T")
    if op_def is None or attr is None or not attr.type:
        return {}
    return {i: attr.type for i, a in enumerate(op_def.input_arg) if a.type == _RESOURCE}


@functools.lru_cache(maxsize=1024)
def written_args(name: str) -> dict[int, int]:
    """The positions of a function's inputs that reach a resource input an op writes, in it
    or in a function it calls (through Identity ops), with the variable's dtype: the
    variables a call of it changes. Only those are read before the call: a variable it only
    reads (an int64 counter the step updates eagerly before calling it) is not put back to a
    value from inside the step. FunctionDefs are immutable per name."""
    fdef = function_def(name)
    if fdef is None:
        return {}
    args = {a.name: i for i, a in enumerate(fdef.signature.input_arg)}
    nodes = {n.name: n for n in fdef.node_def}

    def arg_of(ref: str) -> int | None:
        for _ in range(64):  # a chain of Identity ops
            base = ref.split(":")[0]
            if base in args:
                return args[base]
            node = nodes.get(base)
            if node is None or node.op != "Identity" or not node.input:
                return None
            ref = node.input[0]
        return None

    found: dict[int, int] = {}
    for node in fdef.node_def:
        inputs = [x for x in node.input if not x.startswith("^")]
        for k, dtype in _written_inputs(node).items():
            at = arg_of(inputs[k]) if k < len(inputs) else None
            if at is not None:
                found.setdefault(at, dtype)
        if node.op in _BRANCHES or node.op in _CALLS or ops.op_def(node.op) is None:
            offset = _BRANCHES.get(node.op, 0)
            for callee in ops.callees(node):
                for k, dtype in written_args(callee).items():
                    if offset + k < len(inputs):
                        at = arg_of(inputs[offset + k])
                        if at is not None:
                            found.setdefault(at, dtype)
    return found


def blind_spots(graph: Any, variables: dict[str, frozenset[str]] | None = None) -> list[str]:
    """What an instrumented function cannot compare: the variables written by the opaque
    functions its graph calls. TensorFlow adds those call ops without running op callbacks
    (a ConcreteFunction called inside a tf.function), so they are found by reading the graph.
    ``variables`` gets, per warning, the variables it is about."""
    import tensorflow as tf

    from nddebug.tracer.instrument import variable_identity

    found: list[str] = []
    for op in graph.get_operations():
        if op.type not in ("StatefulPartitionedCall", "PartitionedCall"):
            continue
        name = ops.as_str(op.get_attr("f").name)
        written = written_args(name) if any(t.dtype == tf.resource for t in op.inputs) else {}
        if function_kind(name) == "instrumented":
            for spot in REGISTRY.blind_spots.get(name, []):
                found.append(spot)
                inner = REGISTRY.blind_variables.get((name, spot))
                if variables is not None and inner:
                    variables[spot] = variables.get(spot, frozenset()) | inner
        elif written:
            # Only a call tree that writes a variable: Keras's grouped convolutions call an
            # XLA function that only reads its kernel (its output is compared where it is
            # read), and every ConvNeXt was "not everything compared" (probe round 37).
            made = (
                "a jit_compile function"
                if function_kind(name) == "xla"
                else "a function traced before nddebug.trace()"
            )
            found.append(
                f"{NOT_COMPARED}the variables written by {ops.function_name(name)}, {made} "
                f"and called inside {ops.function_name(graph.name)}"
                ": TensorFlow runs such a call without telling nddebug, and nddebug.check() "
                "retraces only the function it is given, not the tf.functions it calls that "
                "were traced before. Create or first call this one inside the block (or "
                "create it anew there; a function restored from a SavedModel cannot be "
                "retraced). Variables passed to check() as state= are still compared after "
                "the step."
            )
            if variables is not None:
                here = {
                    variable_identity(graph, op.inputs[i]) for i in written if i < len(op.inputs)
                }
                variables[found[-1]] = variables.get(found[-1], frozenset()) | here
    return found


_current: PreCallHook | None = None
_patched = False
_inflight = 0  # eager function calls in flight that no block's hook saw start
_inflight_lock = threading.Lock()  # guards _inflight and _current together
# What a hook's call returns when its block ended before the call could run (see
# Recorder.foreign_call): the call is then made as if it had found no hook.
STALE = object()


def _patch_call_function() -> None:
    """Route every eager function call of the process through nddebug, once and for good.

    Patched at the first trace and never removed, so that a call another thread started
    before a block is still counted (:func:`wait_for_calls`) when the block switches
    recording on: its rows would otherwise land in the block's run. Outside a block the
    patch costs a counter update per call."""
    global _patched
    if _patched:
        return
    from tensorflow.python.eager import context

    original = context.Context.call_function

    def call_function(ctx: Any, name: Any, tensor_inputs: Any, num_outputs: int) -> Any:
        global _inflight
        while True:
            # Read the hook and count a call that has none in one step: a block that starts
            # in between then either sees the call counted (and waits for it) or the call
            # sees the block's hook.
            with _inflight_lock:
                hook = _current
                if hook is None:
                    _inflight += 1
            if hook is None:
                break
            out = hook.call(original, ctx, name, tensor_inputs, num_outputs)
            if out is not STALE:
                return out
            # The hook's block ended while the call waited for it: look again.
        try:
            # No block took the call: an instrumented function runs as its plain twin.
            return original(ctx, plain.twin_name(ctx, name), tensor_inputs, num_outputs)
        finally:
            with _inflight_lock:
                _inflight -= 1

    context.Context.call_function = call_function
    _patched = True


def wait_for_calls(timeout: float) -> bool:
    """Wait until no call that started outside a block is in flight (True), or ``timeout``
    seconds (False). Calls made once a hook is current go through it instead."""
    import time

    deadline = time.monotonic() + timeout
    while _inflight:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


class PreCallHook:
    """Reads the captured variables of opaque calls just before TensorFlow runs them."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.before: dict[str, list[list[dg.Digest | None]]] = {}
        self._original: Any = None

    def install(self) -> None:
        """Make this hook the one the process-wide call patch hands calls to."""
        global _current
        _patch_call_function()
        with _inflight_lock:
            _current = self

    def uninstall(self) -> None:
        global _current
        with _inflight_lock:
            if _current is self:
                _current = None

    def call(self, original: Any, ctx: Any, name: Any, tensor_inputs: Any, n: int) -> Any:
        """One eager function call while this hook's recorder is active."""
        rec = self.recorder
        called = name

        def run() -> Any:
            return original(ctx, called, tensor_inputs, n)

        if threading.get_ident() != rec.thread:
            # Another thread's call: not this block's, and kept out of it.
            return rec.foreign_call(run, ops.as_str(name))
        if not busy():
            if rec.unheld is not None:
                # check()'s run: the variables this call can write, as they are before it.
                rec.unheld.before_call(ops.as_str(name), tensor_inputs)
            if rec.fresh is not None:
                # check()'s run: seeded random ops draw from fresh kernels (tracer.fresh).
                called = rec.fresh.name_for(ctx, name)
            fname = ops.as_str(name)
            if function_kind(fname) == "instrumented":
                out = rec.own_call(lambda: optimized_sums.call_and_check(fname, run))
                optimized_sums.note(rec.recording, fname)
                return out
            self.before.setdefault(fname, []).append(state_digests(tensor_inputs))
        return rec.own_call(run)

    def pop(self, name: str) -> list[dg.Digest | None] | None:
        """The digests read before the call that just returned (None if the hook missed it)."""
        stack = self.before.get(name)
        return stack.pop() if stack else None


#: Ops that call Python code (tf.numpy_function, tf.py_function, tf.compat.v1.py_func).
_PYTHON_CALLS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


@functools.lru_cache(maxsize=1024)
def python_tokens(name: str) -> tuple[str, ...]:
    """The registry tokens of the Python functions that function ``name`` calls through
    tf.numpy_function or tf.py_function, in it or in a function it calls. FunctionDefs are
    immutable per name."""
    found: list[str] = []
    seen: set[str] = set()
    stack = [name]
    while stack:
        fname = stack.pop()
        if fname in seen:
            continue
        seen.add(fname)
        fdef = _function_def(fname)
        if fdef is None:
            continue
        for node in fdef.node_def:
            if node.op in _PYTHON_CALLS and "token" in node.attr:
                found.append(node.attr["token"].s.decode())
            stack += data_functions(node.attr)
    return tuple(dict.fromkeys(found))


def python_function_variables(name: str) -> list[Any]:
    """The tf.Variables the Python functions that ``name`` calls (see :func:`python_tokens`)
    can reach by name: their closures' and globals' variables, and those one attribute,
    list or dict away (``self.counter`` of a bound method). Their body runs on TensorFlow's
    thread, where nddebug records nothing: a variable it assigns was moved on by every run of
    check(), unrestored and unsaid (probe round 48, F6)."""
    tokens = python_tokens(name)
    if not tokens:  # asked before every call of check()'s step: most call no Python
        return []
    import inspect

    import tensorflow as tf
    from tensorflow.python.ops import script_ops

    found: dict[int, Any] = {}

    def add(value: Any, depth: int) -> None:
        if isinstance(value, tf.Variable):
            found.setdefault(id(value), value)
        elif depth and isinstance(value, list | tuple | set):
            for item in list(value)[:256]:
                add(item, depth - 1)
        elif depth and isinstance(value, dict):
            for item in list(value.values())[:256]:
                add(item, depth - 1)
        elif depth and hasattr(value, "__dict__") and not inspect.ismodule(value):
            for item in list(vars(value).values())[:256]:
                add(item, depth - 1)

    for token in tokens:
        try:
            fn = script_ops._py_funcs.get(token)
        except Exception:  # noqa: BLE001 - TensorFlow's registry moved: nothing found
            return []
        fn = getattr(fn, "_func", fn)  # an EagerFunc wraps the Python function
        add(getattr(fn, "__self__", None), 1)
        try:
            names = inspect.getclosurevars(inspect.unwrap(fn))
        except (TypeError, ValueError):  # a builtin or a callable object without code
            continue
        for value in [*names.nonlocals.values(), *names.globals.values()]:
            add(value, 1)
    return list(found.values())
