"""Outside ``trace()``, an instrumented function runs as its plain twin.

A function first traced inside a block is instrumented for good: its graph holds one record
op per op. With no block open those ops read no data, but each is still an op the executor
runs, and on a GPU one with device outputs: measured on an H100, the seed-000 CNN step cost
1.42x plain outside ``trace()`` and ~26 us of CPU per record op. A function that a user
debugged once and then trains with should cost what it did before.

So an eager call of an instrumented function made while no block is open runs a twin: the
same FunctionDef with nddebug's ops taken out (the record and digest ops, the host callbacks
of the pure-TF path, and the switch reads and other ops of nddebug's name scope that only
they used), the ordering edges they added dropped (a sum that read a term through an
Identity waiting for the term's record reads the term again), and nested instrumented
functions (cond branches, loop bodies, called functions) replaced by their own twins. The
twin is made from the instrumented FunctionDef the first time it is needed and registered
with the eager context; TensorFlow optimizes and instantiates it on its first call, as it
did the plain function. What the user's ops compute is untouched: an op of nddebug's that a
user op reads (the GPU-emulation switch) stays, and a function where taking nddebug's ops
out would cut an edge into the user's ops gets no twin and runs instrumented, as before.

Nor does a function that holds an op whose kernel keeps state from one execution to the
next (the legacy random ops: ``tf.random.uniform``, ``tf.nn.dropout``, ``tf.random.shuffle``
draw from a generator each kernel instance holds; a queue or table made without a shared
name). A twin is another FunctionDef, so it gets other kernel instances: its first call
drew the numbers the instrumented function had drawn in its first call, and every later
step of the run differed from the plain program's. Stateful ops whose state lives in a
resource they are handed (variables, iterators, ``tf.random.Generator``) or that keep none
(prints, asserts, Python callbacks, collectives) are safe; an op nddebug does not know is
taken for one that keeps state.

The call patch is :func:`nddebug.tracer.opaque._patch_call_function`'s path for calls that no
block's hook takes; inside a block (and for other threads' calls while one is open) the
instrumented function runs, as it must.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from nddebug.recording import EMULATION_SCOPE
from nddebug.switch import SWITCH_PREFIX
from nddebug.tracer import fresh, ops, unneeded
from nddebug.tracer.registry import REGISTRY

#: What a twin's name ends with (TensorFlow function names allow letters, digits and _).
SUFFIX = "_nddebug_plain"
#: Stateful op types of nddebug's name scope that may go when nothing reads them.
_READS = frozenset({"VarHandleOp", "ReadVariableOp"})
#: Stateful ops that take no resource and keep no state in their kernel from one execution
#: to the next: a twin's own instances of them compute what the instrumented function's
#: would. (Function calls, branches and loops are looked into.)
_NO_KERNEL_STATE = frozenset(
    {
        "Assert",
        "EagerPyFunc",
        "Print",
        "PrintV2",
        "PyFunc",
        "Timestamp",
        "_Recv",
        "_Send",
        "_HostRecv",
        "_HostSend",
        "CollectiveReduce",
        "CollectiveGather",
        "CollectiveBcastSend",
        "CollectiveBcastRecv",
        "CollectiveReduceV2",
        "CollectiveReduceV3",
        "CollectiveGatherV2",
        "CollectiveBcastSendV2",
        "CollectiveBcastRecvV2",
        "CollectiveAllToAllV2",
        "CollectiveAllToAllV3",
        "CollectiveReduceScatterV2",
        "CollectiveInitializeCommunicator",
        "CollectiveAssignGroupV2",
        "NcclAllReduce",
    }
)

# Reentrant: a garbage collection while it is held (making a twin allocates) can free a
# function, and TensorFlow's removal of it runs the removal hook below on the same thread,
# which takes it again: with a plain Lock the process hung for good (a Keras train_on_batch
# in the suite, seen once in this session's CI).
_lock = threading.RLock()
# Instrumented function name -> its twin's name, or None where it has none.
_twins: dict[str, str | None] = {}


def twin_name(ctx: Any, name: Any) -> Any:
    """The name to call for ``name`` with no block open: its twin's where it is an
    instrumented function that has one, else ``name`` itself (same type, bytes or str)."""
    text = ops.as_str(name)
    if text not in REGISTRY.instrumented_functions:
        return name
    twin = _twins.get(text, "")
    if twin == "":
        with _lock:
            twin = _make(ctx, text, set())
    if twin is None:
        return name
    return twin.encode() if isinstance(name, bytes) else twin


def twins() -> dict[str, str | None]:
    """The twins made so far (instrumented name -> twin name or None), for tests and
    diagnostics."""
    return dict(_twins)


def _ours(node: Any) -> bool:
    """nddebug's op: its own types, and host callbacks that call nddebug's Python."""
    if node.op.startswith("Nddebug"):
        return True
    return node.op in unneeded.CALLBACKS and unneeded.callback_is_nddebugs(node.attr["token"].s)


def _in_scope(name: str) -> bool:
    return bool(unneeded._OURS_SCOPE.search(name + "/"))


def _stateless(op_type: str) -> bool:
    op_def = ops.op_def(op_type)
    return op_def is not None and not op_def.is_stateful


def _source(inp: str) -> str:
    return inp.lstrip("^").split(":", 1)[0]


def strip(fdef: Any, switches_off: bool = False) -> Any | None:
    """A copy of ``fdef`` without nddebug's ops (its function attrs unchanged), or None where
    one of the user's ops or the outputs read a value of nddebug's. With ``switches_off``
    (a function that leaves this process, see :func:`plain_graph_def`) the reads of
    nddebug's switches that are left (GPU emulation's) become constant zeros."""
    from tensorflow.core.framework import function_pb2

    returned = {_source(v) for v in fdef.ret.values()}
    nodes = _strip_nodes(fdef.node_def, returned, switches_off, function=True)
    if nodes is None:
        return None
    out = function_pb2.FunctionDef()
    out.CopyFrom(fdef)
    if len(nodes) == len(fdef.node_def) and not switches_off:
        return out
    del out.node_def[:]
    out.node_def.extend(nodes)
    kept = {n.name for n in nodes}
    for key in [k for k, v in fdef.control_ret.items() if _source(v) not in kept]:
        del out.control_ret[key]
    outputs = [c for c in fdef.signature.control_output if c in out.control_ret]
    del out.signature.control_output[:]
    out.signature.control_output.extend(outputs)
    return out


def _strip_nodes(
    nodes: Any, returned: set[str], switches_off: bool, function: bool
) -> list[Any] | None:
    """``nodes`` (NodeDefs of a function, or of a graph) without nddebug's ops and what only
    they read, control edges from them dropped; None where a kept node or an output reads a
    value of nddebug's."""
    from tensorflow.core.framework import node_def_pb2

    by_name = {n.name: n for n in nodes}
    zeros = _switch_reads(by_name) if switches_off else set()
    readers: dict[str, set[str]] = {name: set() for name in by_name}
    for n in nodes:
        if n.name in zeros:
            continue  # becomes a constant: reads nothing
        for inp in n.input:
            if not inp.startswith("^") and _source(inp) in readers:
                readers[_source(inp)].add(n.name)
    drop = {n.name for n in nodes if _ours(n)}
    # Identities of nddebug's that a sum reads its term through, waiting for the term's
    # record (instrument._read_after): the sum reads the term itself again.
    bypass = {
        n.name: n.input[0]
        for n in nodes
        if n.op == "Identity" and _in_scope(n.name) and n.input and not _in_scope(n.input[0])
    }
    drop |= set(bypass)
    changed = True
    while changed:  # what only nddebug's dropped ops read goes too
        changed = False
        for n in nodes:
            if n.name in drop or n.name in returned or n.name in zeros or not _in_scope(n.name):
                continue
            if not (n.op in _READS or _stateless(n.op)):
                continue
            if readers[n.name] <= drop:
                drop.add(n.name)
                changed = True
    if returned & drop:
        return None
    kept_nodes = []
    for n in nodes:
        if n.name in drop:
            continue
        kept = node_def_pb2.NodeDef()
        if n.name in zeros:
            kept.CopyFrom(_zero(n))
            kept_nodes.append(kept)
            continue
        kept.CopyFrom(n)
        del kept.input[:]
        for inp in n.input:
            src = _source(inp)
            if src in bypass:
                term = bypass[src]
                inp = "^" + _source(term) if inp.startswith("^") else term
                src = _source(term)
            if src in drop:
                if not inp.startswith("^"):
                    return None  # a user op reads one of nddebug's values
                continue
            if function and src in zeros and not inp.startswith("^"):
                inp = f"{src}:output:0"  # a Const's output, where it was ReadVariableOp's
            kept.input.append(inp)
        kept_nodes.append(kept)
    return kept_nodes


def _switch_reads(by_name: dict[str, Any]) -> set[str]:
    """The ReadVariableOps of nddebug's switches among ``by_name``."""
    found = set()
    for n in by_name.values():
        if n.op != "ReadVariableOp" or not n.input:
            continue
        handle = by_name.get(_source(n.input[0]))
        if handle is not None and handle.op == "VarHandleOp":
            if handle.attr["shared_name"].s.decode().startswith(SWITCH_PREFIX):
                found.add(n.name)
    return found


def _zero(read: Any) -> Any:
    """A switch's read as the constant 0 (off), with the read's name and device."""
    import tensorflow as tf
    from tensorflow.core.framework import node_def_pb2

    node = node_def_pb2.NodeDef(name=read.name, op="Const", device=read.device)
    node.attr["dtype"].type = tf.int32.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(0, tf.int32))
    return node


def plain_graph_def(graph_def: Any) -> list[str]:
    """Take nddebug's ops out of a GraphDef that leaves this process (a SavedModel being
    written), in place: from its nodes and from every function of its library, under their
    own names, with the switches TensorFlow elsewhere does not have read as off. A SavedModel
    written while a block was open (``nddebug run --all`` around a script that exports its
    model) held nddebug's ops, and TensorFlow could not load it without them ("Op type not
    registered 'NddebugDigestRecord'"). Returns the functions it could not clean."""
    failed = []
    for i, fdef in enumerate(graph_def.library.function):
        if not any(_ours(n) or n.op == "VarHandleOp" for n in fdef.node_def):
            continue
        stripped = strip(fdef, switches_off=True)
        if stripped is None:
            failed.append(fdef.signature.name)
        else:
            graph_def.library.function[i].CopyFrom(stripped)
    if any(_ours(n) for n in graph_def.node):
        nodes = _strip_nodes(graph_def.node, set(), True, function=False)
        if nodes is None:
            failed.append("the graph's own nodes")
        else:
            del graph_def.node[:]
            graph_def.node.extend(nodes)
    return failed


_removal_hooked = False


def hook_removal() -> None:
    """Remove a twin from the context when TensorFlow removes the function it stands for (its
    last ConcreteFunction freed): twins stayed registered for good, so a program that makes
    new functions (a step rebuilt per epoch, retraced for other shapes) kept every one of
    their twins and the kernels made for them. Installed at the first trace, for good."""
    global _removal_hooked
    if _removal_hooked:
        return
    from tensorflow.python.eager import context

    original = context.Context.remove_function

    @functools.wraps(original)
    def remove_function(self: Any, name: Any) -> Any:
        out = original(self, name)
        key = name.decode() if isinstance(name, bytes) else str(name)
        fresh.forget(key)
        with _lock:
            twin = _twins.pop(key, None)
        if twin and twin != key:
            try:
                original(self, twin)
            except Exception:  # noqa: BLE001 - already gone: nothing to free
                pass
        return out

    context.Context.remove_function = remove_function
    _removal_hooked = True


_saving_hooked = False


def hook_saved_model() -> None:
    """Have ``tf.saved_model.save`` (Keras' ``model.export`` too) write the plain program:
    its GraphDef goes through :func:`plain_graph_def` before TensorFlow checks and writes it.
    Installed at the first trace, for good."""
    global _saving_hooked
    if _saving_hooked:
        return
    try:
        from tensorflow.python.saved_model import save as save_lib

        original = save_lib._verify_ops
    except (ImportError, AttributeError):
        return  # another TensorFlow: nothing to hook
    import warnings

    def _verify_ops(graph_def: Any, namespace_whitelist: Any) -> Any:
        failed = plain_graph_def(graph_def)
        if failed:
            warnings.warn(
                "nddebug: the SavedModel keeps nddebug's ops in "
                + ", ".join(failed[:3])
                + ": TensorFlow without nddebug cannot load it. Save it outside trace().",
                RuntimeWarning,
                stacklevel=2,
            )
        return original(graph_def, namespace_whitelist)

    save_lib._verify_ops = _verify_ops
    _saving_hooked = True


def _make(ctx: Any, name: str, making: set[str]) -> str | None:
    """The twin of ``name``, registered with ``ctx`` (made once; _lock held)."""
    if name in _twins:
        return _twins[name]
    if name in making:  # a function that calls itself: not something graphs do
        return None
    making.add(name)
    twin = None
    try:
        fdef = ctx.get_function_def(name)
    except Exception:  # noqa: BLE001 - removed from the context (its function was freed)
        fdef = None
    if fdef is not None and _kernel_state(ctx, fdef, set()) is None:
        plain = strip(fdef)
        if plain is not None and _plain_callees(ctx, plain, making):
            if plain == fdef:  # nothing of nddebug's in it: the function is its own twin
                twin = name
            else:
                twin = name + SUFFIX
                plain.signature.name = twin
                try:
                    ctx.add_function_def(plain)
                except Exception:  # noqa: BLE001 - TensorFlow refused it: run instrumented
                    twin = None
    _twins[name] = twin
    return twin


def _kernel_state(ctx: Any, fdef: Any, seen: set[str]) -> str | None:
    """The first op of ``fdef`` (or of a function it calls, a branch, a loop body) whose
    kernel may keep state from one execution to the next; None where there is none."""
    seen.add(fdef.signature.name)
    for node in fdef.node_def:
        if _ours(node) or EMULATION_SCOPE in node.name:
            continue  # emulate_gpu's random masks: used only while its switch is on
        callees = ops.callees(node)
        op_def = ops.op_def(node.op)
        if op_def is not None and op_def.is_stateful and not _state_elsewhere(node, op_def):
            return f"{node.op} ({node.name})"
        for name in callees:
            if name in seen:
                continue
            try:
                callee = ctx.get_function_def(name)
            except Exception:  # noqa: BLE001 - neither an op nor a function we can read
                return f"{name} ({node.name})"
            found = _kernel_state(ctx, callee, seen)
            if found is not None:
                return found
    return None


def _state_elsewhere(node: Any, op_def: Any) -> bool:
    """Whether a stateful op keeps no state in its kernel: it is handed the resource that
    holds it, makes a fresh one per execution, finds one by a shared name, keeps none, or is
    a call, branch or loop (looked into by the caller)."""
    from tensorflow.core.framework import types_pb2

    if node.op in _NO_KERNEL_STATE or node.op.startswith("Anonymous"):
        return True
    if any(arg.type == types_pb2.DT_RESOURCE for arg in op_def.input_arg):
        return True
    if node.op in ("StatefulPartitionedCall", "If", "While", "Case"):
        return True
    shared = node.attr["shared_name"].s if "shared_name" in node.attr else b""
    return bool(shared) or (
        "use_node_name_sharing" in node.attr and node.attr["use_node_name_sharing"].b
    )


def _plain_callees(ctx: Any, fdef: Any, making: set[str]) -> bool:
    """Point ``fdef``'s function attrs (calls, branches, loop bodies) at the twins of the
    instrumented functions they name; False where one has no twin."""

    def fix(value: Any) -> bool:
        if value.HasField("func"):
            return fix_func(value.func)
        if value.HasField("list"):
            return all(fix_func(f) for f in value.list.func)
        return True

    def fix_func(func: Any) -> bool:
        if func.name not in REGISTRY.instrumented_functions:
            return True
        twin = _make(ctx, func.name, making)
        if twin is None:
            return False
        func.name = twin
        return True

    return all(fix(v) for n in fdef.node_def for v in n.attr.values())
