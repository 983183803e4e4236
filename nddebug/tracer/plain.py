"""Outside ``trace()``, an instrumented function runs as its plain twin.

A function first traced inside a block is instrumented for good: its graph holds one record
op per op. With no block open those ops read no data, but each is still an op the executor
runs, and on a GPU one with device outputs: measured on an H100, the seed-000 CNN step cost
1.42x plain outside ``trace()`` and ~26 us of CPU per record op. A function that a user
debugged once and then trains with should cost what it did before.

So an eager call of an instrumented function made while no block is open runs a twin: the
same FunctionDef with nddebug's ops taken out (the record and digest ops, the host callbacks
of the pure-TF path, and the switch reads and other ops of nddebug's name scope that only
they used), the ordering edges they added dropped, and nested instrumented functions (cond
branches, loop bodies, called functions) replaced by their own twins. The twin is made from
the instrumented FunctionDef the first time it is needed and registered with the eager
context; TensorFlow optimizes and instantiates it on its first call, as it did the plain
function. What the user's ops compute is untouched: an op of nddebug's that a user op reads
(the GPU-emulation switch) stays, and a function where taking nddebug's ops out would cut
an edge into the user's ops gets no twin and runs instrumented, as before.

The call patch is :func:`nddebug.tracer.opaque._patch_call_function`'s path for calls that no
block's hook takes; inside a block (and for other threads' calls while one is open) the
instrumented function runs, as it must.
"""

from __future__ import annotations

import threading
from typing import Any

from nddebug.tracer import ops
from nddebug.tracer.registry import REGISTRY

#: What a twin's name ends with (TensorFlow function names allow letters, digits and _).
SUFFIX = "_nddebug_plain"
#: nddebug's host callbacks (pure-TF path, rerun mode) are these op types in its name scope.
_CALLBACKS = frozenset({"PyFunc", "EagerPyFunc"})
#: Stateful op types of nddebug's name scope that may go when nothing reads them.
_READS = frozenset({"VarHandleOp", "ReadVariableOp"})
_SCOPE = "nddebug"

_lock = threading.Lock()
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
    if node.op.startswith("Nddebug"):
        return True
    return node.op in _CALLBACKS and _SCOPE in node.name.split("/")


def _stateless(op_type: str) -> bool:
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(op_type)
    return op_def is not None and not op_def.is_stateful


def _source(inp: str) -> str:
    return inp.lstrip("^").split(":", 1)[0]


def strip(fdef: Any) -> Any | None:
    """A copy of ``fdef`` without nddebug's ops (its function attrs unchanged), or None where
    one of the user's ops or the outputs read a value of nddebug's."""
    from tensorflow.core.framework import function_pb2

    readers: dict[str, set[str]] = {n.name: set() for n in fdef.node_def}
    for n in fdef.node_def:
        for inp in n.input:
            if not inp.startswith("^") and _source(inp) in readers:
                readers[_source(inp)].add(n.name)
    returned = {_source(v) for v in fdef.ret.values()}
    drop = {n.name for n in fdef.node_def if _ours(n)}
    changed = True
    while changed:  # what only nddebug's dropped ops read goes too
        changed = False
        for n in fdef.node_def:
            if n.name in drop or n.name in returned or _SCOPE not in n.name.split("/"):
                continue
            if not (n.op in _READS or _stateless(n.op)):
                continue
            if readers[n.name] <= drop:
                drop.add(n.name)
                changed = True
    out = function_pb2.FunctionDef()
    out.CopyFrom(fdef)
    if not drop:
        return out
    del out.node_def[:]
    for n in fdef.node_def:
        if n.name in drop:
            continue
        kept = out.node_def.add()
        kept.CopyFrom(n)
        del kept.input[:]
        for inp in n.input:
            if _source(inp) not in drop:
                kept.input.append(inp)
            elif not inp.startswith("^"):
                return None  # a user op reads one of nddebug's values
    if returned & drop:
        return None
    for key in [k for k, v in fdef.control_ret.items() if _source(v) in drop]:
        del out.control_ret[key]
    outputs = [c for c in fdef.signature.control_output if c in out.control_ret]
    del out.signature.control_output[:]
    out.signature.control_output.extend(outputs)
    return out


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
    if fdef is not None:
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
