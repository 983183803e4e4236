"""Fresh kernels for seeded stateful random ops in check()'s runs.

A stateful random op (``tf.random.uniform``, ``tf.nn.dropout``, ``tf.image.random_*``, the
candidate samplers: ``recording.RANDOM_OPS``) with a seed, its own or one derived from
``tf.random.set_seed`` / ``keras.utils.set_random_seed``, keeps its place in its seeded
stream in its kernel, and the kernel lives as long as the function's instantiation in the
eager context: every call of one function draws the next numbers, while a fresh process's
first call draws the first ones again. check() runs a step several times; run on the user's
own functions, its repeats drew different numbers by design (a false "NOT reproducible"),
and the training that followed drew further on in the streams than it would have without
the check (other weights after the check).

So while a check run is recorded, an eager call of a function whose call tree holds a seeded
random op goes to a copy of that tree under new names: new names are new
instantiations, whose kernels start their streams where a fresh process's do. One copy per
function per run (calls within a run go on in one stream, as the original's would within a
step); the copies are removed from the context when the run ends. The user's functions are
never called by check()'s runs, so their kernels are where they were, and the ordinary step
that ends check() draws what it would have drawn without it.

This works for every eager call, whoever made the function: a tf.function a plain Python
step calls, one traced before the check, a nested one, one restored from a SavedModel.
Calls made inside a graph (a tf.function calling another) are inside the caller's tree and
copied with it. An XLA-compiled function is left alone: XLA ignores the seeds (check.py's
``_xla_random_note``).
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Iterable
from typing import Any

from nddebug.recording import RANDOM_OPS
from nddebug.tracer import ops, unneeded

#: What a copy's name has after the original's (TensorFlow function names allow letters,
#: digits and _), then a number.
MARK = "_nddebug_fresh"

# Reentrant: forget() runs from TensorFlow's function removal, which a garbage collection
# can start on a thread that holds it (see plain._lock).
_lock = threading.RLock()
_numbers = itertools.count()
_mask_seeds = random.SystemRandom()
# copy name -> original name, for every copy alive: the eager op callback gets the copy's
# name, and records the call under the original's.
_ORIGINAL: dict[str, str] = {}
# Function name -> (the seeded random op types its tree holds, the functions of its
# tree that hold one or call one that does). FunctionDefs are immutable per name.
_TREES: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {}


def forget(name: str) -> None:
    """Drop what :func:`seeded_tree` remembers of ``name`` (TensorFlow removed the function):
    a program that rebuilds its step (DeterminismCheck, once per check) makes new names."""
    with _lock:
        _TREES.pop(name, None)


def original(name: str) -> str:
    """The name of the function ``name`` is a copy of (``name`` where it is none)."""
    return _ORIGINAL.get(name, name)


def seeded_tree(ctx: Any, name: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """The seeded random op types in ``name``'s call tree (calls, branches, loop
    bodies), and the functions of the tree that must be copied to reset them: those that
    hold one or call one that must. ((), ∅) where there is none, or the function cannot be
    read."""
    if name in _TREES:
        return _TREES[name]
    random_ops = frozenset(RANDOM_OPS)
    defs: dict[str, Any] = {}
    todo = [name]
    while todo:  # every function of the tree, read once
        fname = todo.pop()
        if fname in defs:
            continue
        try:
            defs[fname] = ctx.get_function_def(fname)
        except Exception:  # noqa: BLE001 - not a function the context holds (an op)
            defs[fname] = None
            continue
        todo += [c for n in defs[fname].node_def for c in ops.callees(n)]
    found: set[str] = set()
    holds: set[str] = set()
    for fname, fdef in defs.items():
        if fdef is None or ops.xla_must_compile(fdef):
            continue
        for node in fdef.node_def:
            if unneeded.made_by_nddebug(node.name):
                continue  # emulate_gpu()'s random masks must differ from run to run
            if node.op in random_ops and (node.attr["seed"].i or node.attr["seed2"].i):
                found.add(node.op)
                holds.add(fname)
    copied = set(holds)
    changed = bool(holds)
    while changed:  # and every function calling one of them, up to ``name``
        changed = False
        for fname, fdef in defs.items():
            if fdef is None or fname in copied or ops.xla_must_compile(fdef):
                continue
            if any(c in copied for n in fdef.node_def for c in ops.callees(n)):
                copied.add(fname)
                changed = True
    tree = (tuple(sorted(found)), frozenset(copied if name in copied else ()))
    with _lock:
        _TREES[name] = tree
    return tree


class FreshCopies:
    """The copies of one recorded run: made at a function's first call in the run, removed
    by :meth:`release` when the run ends."""

    def __init__(self) -> None:
        self.copies: dict[str, str] = {}  # original -> its copy in this run
        self.op_types: set[str] = set()  # the seeded op types the copies reset

    def name_for(self, ctx: Any, name: Any) -> Any:
        """The name to call for ``name`` in this run: a copy's where its tree holds seeded
        random ops, else ``name`` (same type, bytes or str)."""
        text = ops.as_str(name)
        if text in _ORIGINAL:
            return name
        found, copied = seeded_tree(ctx, text)
        if not copied:
            return name
        if text not in self.copies:
            try:
                self._copy(ctx, copied)
            except Exception:  # noqa: BLE001 - TensorFlow refused a copy: call the original
                return name
            self.op_types.update(found)
        copy = self.copies[text]
        return copy.encode() if isinstance(name, bytes) else copy

    def _copy(self, ctx: Any, functions: Iterable[str]) -> None:
        from tensorflow.core.framework import function_pb2

        random_ops = frozenset(RANDOM_OPS)
        todo = [f for f in functions if f not in self.copies]
        names = {f: f"{f}{MARK}{next(_numbers)}" for f in todo}
        every = {**self.copies, **names}
        made = []
        for fname in todo:
            fdef = function_pb2.FunctionDef()
            fdef.CopyFrom(ctx.get_function_def(fname))
            fdef.signature.name = names[fname]
            for node in fdef.node_def:
                if node.op in random_ops and unneeded.made_by_nddebug(node.name):
                    # emulate_gpu()'s mask: a fresh one per execution, so per copy too
                    node.attr["seed2"].i = _mask_seeds.randrange(1, 2**31)
                if node.op in every:
                    node.op = every[node.op]
                for value in node.attr.values():
                    if value.HasField("func") and value.func.name in every:
                        value.func.name = every[value.func.name]
                    if value.HasField("list"):
                        for f in value.list.func:
                            if f.name in every:
                                f.name = every[f.name]
            made.append(fdef)
        # Callees first: a caller's instantiation looks its callees up by name.
        added = []
        try:
            for fdef in _callees_first(made):
                ctx.add_function_def(fdef)
                added.append(fdef.signature.name)
        except BaseException:
            for name in added:  # none of a failed copy stays registered
                ctx.remove_function(name)
            raise
        with _lock:
            for fname, copy in names.items():
                _ORIGINAL[copy] = fname
        self.copies.update(names)

    def release(self) -> None:
        """Remove this run's copies from the context: their kernels go with them."""
        from tensorflow.python.eager import context

        ctx = context.context()
        for copy in self.copies.values():
            try:
                ctx.remove_function(copy)
            except Exception:  # noqa: BLE001 - already gone: nothing to free
                pass
        with _lock:
            for copy in self.copies.values():
                _ORIGINAL.pop(copy, None)
        self.copies.clear()


def _callees_first(fdefs: list[Any]) -> list[Any]:
    """``fdefs`` ordered so that each comes after the ones of them it calls (calls between
    functions form no cycle)."""
    by_name = {f.signature.name: f for f in fdefs}
    ordered: list[Any] = []
    placed: set[str] = set()

    def place(name: str, path: set[str]) -> None:
        if name in placed or name in path:
            return
        path.add(name)
        for node in by_name[name].node_def:
            for callee in ops.callees(node):
                if callee in by_name:
                    place(callee, path)
        placed.add(name)
        ordered.append(by_name[name])

    for name in by_name:
        place(name, set())
    return ordered


def copies_alive() -> list[str]:
    """The copies registered now (none once check()'s runs are over), for tests."""
    with _lock:
        return sorted(_ORIGINAL)
