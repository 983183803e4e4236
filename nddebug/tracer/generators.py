"""Random generators in check()'s runs: put back where they were, as the global one is.

A ``tf.random.Generator`` keeps its state in an int64 variable that every draw moves on
(``RngReadAndSkip``, the ``Stateful*`` ops: ``advances_generator`` in data/culprits.toml).
check() runs a step several times, then once more as an ordinary step. A generator that
``state=`` does not hold and that is not TensorFlow's global one (which check() restores
with the process's other streams) was moved on by every run: the runs drew other noise, so a
reproducible step was "NOT reproducible" (source ``RngReadAndSkip``, and the advice to seed
a generator that was seeded), and the steps after the check drew further along than they
would have without it (other weights; probe round 33).

So in check()'s runs each generator a step draws from is found where it is first used, and
read as it was then: a function call whose call tree advances a generator has its int64
variable inputs read just before TensorFlow runs it; an eager ``RngReadAndSkip`` hands back
the state it read. check() puts them back before every run and before its final ordinary
step. A generator that only an eager ``Stateful*`` op drew from cannot be read as it was
before the draw: it is left to the warning about updates that ``state=`` does not hold.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nddebug import knowledge
from nddebug.tracer import opaque, ops
from nddebug.tracer.registry import inside_nddebug

_INT64 = 9  # types_pb2.DT_INT64


def draws_in_tree(name: str) -> bool:
    """Whether a function's call tree (calls, branches, loop bodies) holds an op that advances
    a generator (False where the function cannot be read)."""
    return any(knowledge.advances_generator(t.split("(")[0]) for t in opaque.ops_inside(name))


def _int64_variable(t: Any) -> bool:
    """Whether an eager tensor is the handle of an int64 variable (a generator's state)."""
    if getattr(getattr(t, "dtype", None), "name", "") != "resource":
        return False
    try:
        from tensorflow.python.ops import resource_variable_ops

        data = resource_variable_ops.get_eager_safe_handle_data(t)
    except Exception:  # noqa: BLE001 - no handle data: not a variable we can read
        return False
    return bool(data.is_set) and [x.dtype for x in data.shape_and_type] == [_INT64]


class GeneratorStates:
    """The generators one check() found its step drawing from, as they were before it."""

    def __init__(self, held: set[str]) -> None:
        self.held = held  # identities (ops.eager_identity) of the variables state= holds
        self.states: dict[str, tuple[Any, np.ndarray]] = {}  # identity -> (handle, before)

    def before_call(self, name: str, tensor_inputs: Any) -> None:
        """A function is about to run: keep the generators its call tree can move on."""
        if not draws_in_tree(name):
            return
        for t in tensor_inputs:
            if _int64_variable(t):
                self._keep(t, None)

    def after_eager(self, op_type: str, inputs: Any, outputs: Any) -> None:
        """An eager op ran: an ``RngReadAndSkip`` returns the state it found (padded to 3)."""
        if not knowledge.advances_generator(op_type) or op_type != "RngReadAndSkip":
            return
        handle = ops.state_input(op_type, inputs)
        if handle is not None and outputs:
            self._keep(handle, outputs[0])

    def _keep(self, handle: Any, found: Any) -> None:
        identity = ops.eager_identity(handle)
        if identity in self.held or identity in self.states:
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

    def restore(self) -> None:
        """Put every generator found back as it was before the check."""
        from tensorflow.python.eager import context
        from tensorflow.python.ops import gen_resource_variable_ops as gen

        with context.eager_mode():
            for handle, value in self.states.values():
                gen.assign_variable_op(handle, value)

    def identities(self) -> set[str]:
        """The variables restored here, as ``OpInfo.resource`` names them."""
        return set(self.states)
