"""Random generators in check()'s runs: put back where they were, as the global one is.

A ``tf.random.Generator`` keeps its state in an int64 variable that every draw moves on
(``RngReadAndSkip``, the ``Stateful*`` ops: ``advances_generator`` in data/culprits.toml).
check() runs a step several times, then once more as an ordinary step. A generator that
``state=`` does not hold and that is not TensorFlow's global one (which check() restores
with the process's other streams) was moved on by every run: the runs drew other noise, so a
reproducible step was "NOT reproducible" (source ``RngReadAndSkip``, and the advice to seed
a generator that was seeded), and the steps after the check drew further along than they
would have without it (other weights; probe round 33).

So in check()'s warm-up each generator a step draws from is found where it is first used,
and read as it was then: a function call has the inputs that reach a generator op's state
(:func:`generator_args`) read just before TensorFlow runs it; an eager ``RngReadAndSkip``
hands back the state it read. check() puts them back before every later run and before its
final ordinary step. A generator that only an eager ``Stateful*`` op drew from cannot be
read as it was before the draw, and one first drawn from after the warm-up has been moved
on by the runs before: both are left to check()'s warnings.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from nddebug import knowledge
from nddebug.state import fresh_copy
from nddebug.tracer import opaque, ops
from nddebug.tracer.registry import inside_nddebug

_INT64 = 9  # types_pb2.DT_INT64
#: Ops that pass their inputs on to the functions they call, from this input on (a branch's
#: first input is its condition); other calls (PartitionedCall, While, a function called by
#: name) from input 0. A tf.data op's functions take other arguments: not followed.
_BRANCHES = {"If": 1, "StatelessIf": 1, "Case": 1, "StatelessCase": 1}
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "While", "StatelessWhile"})


@functools.lru_cache(maxsize=1024)
def generator_args(name: str) -> frozenset[int]:
    """The positions of a function's inputs that reach the state input of an op that
    advances a generator, in it or in a function it calls (through Identity ops): the
    generators a call of it moves on. Only those are read before the call: an int64 counter
    it also takes (an optimizer's iterations) is the step's own state, not a generator's.
    FunctionDefs are immutable per name."""
    fdef = opaque.function_def(name)
    if fdef is None:
        return frozenset()
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

    found: set[int | None] = set()  # None: an input that is no argument of this function
    for node in fdef.node_def:
        inputs = [x for x in node.input if not x.startswith("^")]
        if knowledge.advances_generator(node.op) and inputs:
            found.add(arg_of(inputs[0]))
        if node.op in _BRANCHES or node.op in _CALLS or ops.op_def(node.op) is None:
            offset = _BRANCHES.get(node.op, 0)
            for callee in ops.callees(node):
                for k in generator_args(callee):
                    if offset + k < len(inputs):
                        found.add(arg_of(inputs[offset + k]))
    return frozenset(i for i in found if i is not None)


class GeneratorStates:
    """The generators one check() found its step drawing from, as they were before it."""

    def __init__(self, held: Callable[[], set[str]]) -> None:
        # The identities (ops.eager_identity) of the variables check() restores already:
        # state=, and those the step created (asked when a generator is found).
        self.held = held
        self.states: dict[str, tuple[Any, np.ndarray]] = {}  # identity -> (handle, before)
        # Set once the warm-up has run: a generator first found after it is already moved
        # on by the earlier runs, and is not put back (said in a warning).
        self.closed = False
        self.late: set[str] = set()
        self.unread: set[str] = set()  # moved on by an eager op before it could be read

    def before_call(self, name: str, tensor_inputs: Any) -> None:
        """A function is about to run: keep the generators it can move on, as they are."""
        for i in generator_args(name):
            if i < len(tensor_inputs):
                self._keep(tensor_inputs[i], None)

    def after_eager(self, op_type: str, inputs: Any, outputs: Any) -> None:
        """An eager op ran: an ``RngReadAndSkip`` returns the state it found (padded to 3);
        another that moved a generator on (``StatefulRandomBinomial``) leaves no trace of
        where it was, and that generator is not put back: a later ``RngReadAndSkip`` found it
        moved already (probe round 34), and it is left to the unrestored-update warning."""
        if not knowledge.advances_generator(op_type):
            return
        handle = ops.state_input(op_type, inputs)
        if handle is None:
            return
        if op_type == "RngReadAndSkip" and outputs:
            self._keep(handle, outputs[0])
        else:
            identity = ops.eager_identity(handle)
            if identity not in self.states:
                self.unread.add(identity)

    def _keep(self, handle: Any, found: Any) -> None:
        identity = ops.eager_identity(handle)
        if identity in self.states or identity in self.late or identity in self.unread:
            return
        if identity in self.held():
            return
        if self.closed:
            self.late.add(identity)
            return
        from tensorflow.python.ops import gen_resource_variable_ops as gen

        try:
            with inside_nddebug():  # nddebug's read: not one of the step's ops
                now = gen.read_variable_op(handle, _INT64).numpy()
                before = now if found is None else found.numpy()
        except Exception:  # noqa: BLE001 - unreadable: left to the unrestored-update warning
            return
        before = np.asarray(before).reshape(-1)[: now.size]  # RngReadAndSkip pads to 3
        self.states[identity] = (handle, before.reshape(now.shape))

    def restore(self) -> list[str]:
        """Put every generator found back as it was before the check. Returns the errors of
        those that could not be (one each; the others are put back all the same)."""
        from tensorflow.python.eager import context
        from tensorflow.python.ops import gen_resource_variable_ops as gen

        errors = []
        with context.eager_mode():
            for identity, (handle, value) in self.states.items():
                try:
                    gen.assign_variable_op(handle, fresh_copy(value))
                except Exception as exc:  # noqa: BLE001 - said by the caller
                    errors.append(f"{identity}: {exc}")
        return errors

    def identities(self) -> set[str]:
        """The variables restored here, as ``OpInfo.resource`` names them."""
        return set(self.states)
