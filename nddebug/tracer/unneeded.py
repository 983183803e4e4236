"""Records of values the program does not need are not run.

TensorFlow runs of a function only what its outputs and control outputs need: an op whose
value nothing needs (the gradient with respect to a constant divisor, the input image's
gradient, a forward value only a pruned branch reads) is pruned before grappler optimizes
the function. nddebug's records are stateful, so a function runs every one of them, and with
them the unneeded ops they read. That costs time, and it changes the program: an op that
the plain program prunes is one more consumer of its inputs in the traced one, and grappler
rewrites some patterns only where an intermediate has a single consumer (see
``data/rewrites.toml``). MobileNetV3's hard-swish gradients computed other bits that way.

So when a function graph is complete, the records whose recorded op the program does not
need are taken out of what the function must run; TensorFlow then prunes them with the op.
A record needed again later (while_v2 and cond_v2 gradients add outputs to a body graph
after it was built) is put back the next time the graph is completed.
"""

from __future__ import annotations

import re
from typing import Any

from nddebug.recording import EMULATION_SCOPE
from nddebug.switch import SWITCH_PREFIX
from nddebug.tracer import ops
from nddebug.tracer.registry import REGISTRY

#: An op nddebug made: its type, or a "nddebug" name scope in its name.
_OURS_SCOPE = re.compile(r"(?:^|/)nddebug(?:_\d+)?/")
#: Per-graph cache entry: the records taken out of the graph's control outputs.
_CUT = "<records cut>"


def is_ours_name(name: str) -> bool:
    """Whether a node of that name sits in nddebug's name scope (see :func:`ours`)."""
    return bool(_OURS_SCOPE.search(name))


def made_by_nddebug(name: str) -> bool:
    """Whether a node of that name is nddebug's: a digest, a record, an emulation's mask."""
    return EMULATION_SCOPE in name or is_ours_name(name)


def ours(op: Any) -> bool:
    """Whether nddebug made this op (digests, records, the trace switch's read). In its name
    scope, a stateful op is nddebug's only where it is one of nddebug's kinds (a host callback
    into nddebug's Python, a switch's read): a user's ``tf.py_function`` or ``tf.print`` in a
    scope of their own called "nddebug" must still run as the user's."""
    if op.type.startswith("Nddebug"):
        return True
    if not _OURS_SCOPE.search(op.name):
        return False
    op_def = ops.op_def(op.type)
    if op_def is None or not op_def.is_stateful:
        return True  # digest arithmetic, rerun copies
    if op.type in CALLBACKS:
        return callback_is_nddebugs(op.get_attr("token"))
    if op.type == "ReadVariableOp":
        return ours(op.inputs[0].op)
    if op.type == "VarHandleOp":
        return ops.as_str(op.get_attr("shared_name")).startswith(SWITCH_PREFIX)
    return False


#: Host callback op types (tf.numpy_function, tf.py_function).
CALLBACKS = frozenset({"PyFunc", "EagerPyFunc"})


def callback_is_nddebugs(token: Any) -> bool:
    """Whether a host callback's registered Python function is nddebug's own."""
    try:
        from tensorflow.python.ops import script_ops

        fn = script_ops._py_funcs.get(ops.as_str(token))
    except Exception:  # noqa: BLE001 - TensorFlow's registry moved: not provably ours
        return False
    fn = getattr(fn, "_func", fn)  # an EagerFunc wraps the Python function
    return (getattr(fn, "__module__", "") or "").startswith("nddebug.")


def needed(graph: Any) -> set[Any]:
    """The ops the program needs: what its outputs and its own control outputs (stateful
    ops) read, through data and control edges. nddebug's ops are needed only where a
    program op reads them (an Identity that makes a sum wait for its term's record)."""
    roots = [t.op for t in graph.outputs]
    roots += [op for op in graph.control_outputs if not ours(op)]
    seen: set[Any] = set()
    stack = list(roots)
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(c for c in op.control_inputs if not ours(c))
    return seen


def _reads_unneeded(graph_ops: list[Any], use: set[Any]) -> set[Any]:
    """nddebug's ops that read, directly or through other nddebug ops, an op not in ``use``.
    Data edges only: a control edge orders, it reads nothing (rerun mode's copies of an op
    wait for it, emulate_gpu's op included, whose outputs the program no longer reads).
    Iterative: chains of records are as deep as the graph."""
    state: dict[Any, bool] = {}
    for root in graph_ops:
        if root in state or not ours(root):
            continue
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            op, expanded = stack.pop()
            if op in state:
                continue
            reads = [t.op for t in op.inputs]
            pending = [x for x in reads if x not in use and ours(x) and x not in state]
            if pending and not expanded:
                stack.append((op, True))
                stack.extend((x, False) for x in pending)
                continue
            state[op] = any(x not in use and (not ours(x) or state.get(x, False)) for x in reads)
    return {op for op, bad in state.items() if bad}


def _fused_after_pruning(graph: Any, use: set[Any]) -> set[Any]:
    """Records of intermediates that a consumer fused with (``instrument.Deferred``: that
    consumer's record holds the intermediate's inputs), made all the same because another
    consumer read the value, which the program does not need. The plain program prunes that
    reader, and the intermediate is left with one consumer, which grappler may rewrite with it
    ((x * y) / 6 -> x * (y / 6) in a hard-swish gradient, where the gradient with respect to
    the constant 6 is pruned): the record would be the second consumer that stops it."""
    from nddebug.tracer.instrument import DEFERRED  # instrument imports this module

    found = set()
    every = REGISTRY.graph_cache(graph).get(DEFERRED, {}).values()
    for d in {id(d): d for d in every}.values():
        if not (d.done and d.covered) or d.sender is None:
            continue
        readers = {c for c in d.tensor.consumers() if not ours(c) and c in use}
        if len(readers) <= 1:
            found.add(d.sender)
    return found


def cut_unneeded_records(graph: Any) -> set[Any] | None:
    """Take nddebug's ops that read an unneeded op out of what ``graph`` must run (its
    control outputs and other ops' control inputs), and put back those cut earlier that are
    needed now. A record waiting for a cut one (a variable's rows in order) waits for what
    that one waited for. Returns the ops the program needs (:func:`needed`), None for a
    graph that is not a function's."""
    control = getattr(graph, "control_outputs", None)
    if control is None or not hasattr(graph, "outputs"):
        return None
    graph_ops = graph.get_operations()
    use = needed(graph)
    dead = _reads_unneeded(graph_ops, use) | _fused_after_pruning(graph, use)
    cache = REGISTRY.graph_cache(graph)
    cut: list[Any] = cache.setdefault(_CUT, [])
    for op in cut:
        if op not in dead and op not in control:
            control.append(op)  # needed again (a gradient made its op an output)
    cut[:] = [op for op in cut if op in dead]
    if not dead:
        return use
    cut.extend(op for op in control if op in dead and op not in cut)
    control[:] = [op for op in control if op not in dead]

    def instead(op: Any) -> list[Any]:
        """What waiting for ``op`` comes to once it is cut."""
        if op not in dead:
            return [op]
        return [x for c in op.control_inputs for x in instead(c)]

    for op in graph_ops:
        inputs = op.control_inputs
        if op in dead or not any(c in dead for c in inputs):
            continue
        # An ordered set: an op that waits for every record (a function's control outputs
        # gathered by a NoOp) has thousands of control inputs; a list made this quadratic.
        keep: dict[Any, None] = {}
        for c in inputs:
            keep.update(dict.fromkeys(instead(c)))
        op._remove_all_control_inputs()
        op._add_control_inputs(list(keep))
    return use
