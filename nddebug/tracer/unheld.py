"""Variables that check()'s step writes and state= does not hold: put back between its runs.

check() runs a step several times, then once more as an ordinary step. ``state=`` names
what the step changes, so that every run starts from the same values and the training after
the check goes on from one step's worth. A variable the step writes that ``state=`` does not
hold was moved on by every run: the runs started from other values, so a reproducible step
looked "NOT reproducible", and the steps after the check went on from further along than
they would have without it. Probe rounds found it for a ``tf.random.Generator`` the step
only captured (round 33; source ``RngReadAndSkip``, advice to seed a generator that was
seeded), a Keras ``SeedGenerator`` made outside the model (round 37: ``keras.random.dropout(h,
seed=sg)``; 7 draws further on after the check, other weights), a Keras model's compiled
metrics that do not exist until its first step (round 38: an AUC's totals, another fit
History) and a custom loop's optimizer slots.

So in check()'s warm-up every variable the step writes is found where it is first written,
and read as it was then: a function call has the inputs that reach the resource input of an
op that writes a variable (``opaque.written_args``: a variable update, an optimizer's apply,
a scatter, a generator's draw), in it or in a function it calls, read just before TensorFlow
runs it; an eager ``RngReadAndSkip`` hands back the state it read. check() puts them back
before every later run and before its final ordinary step. A variable an eager op wrote
first cannot be read as it was before the write (an op callback runs after its op), and one
first written after the warm-up has been moved on by the runs before: both are left to
check()'s warnings, and so are lookup tables (``state=`` holds them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from nddebug import knowledge
from nddebug.recording import WRITER
from nddebug.state import fresh_copy
from nddebug.tracer import ops
from nddebug.tracer.opaque import INT64, python_function_variables, written_args
from nddebug.tracer.registry import inside_nddebug


class UnheldVariables:
    """The variables one check() found its step writing that it does not restore otherwise,
    as they were before it."""

    def __init__(
        self, held: Callable[[], set[str]], settle: Callable[[], None] = lambda: None
    ) -> None:
        # The identities (ops.eager_identity) of the variables check() restores already:
        # state=, and those the step created (asked when a variable is found).
        self.held = held
        # Reads the variables the step made while a function was traced, as the call about
        # to run finds them (state.StateKeeper.settle): before they are asked about here.
        self.settle = settle
        self.states: dict[str, tuple[Any, np.ndarray]] = {}  # identity -> (handle, before)
        # Set once the warm-up has run: a variable first found after it is already moved
        # on by the earlier runs, and is not put back (said in a warning).
        self.closed = False
        self.late: set[str] = set()
        self.unread: set[str] = set()  # written by an eager op before it could be read
        # Those a Python function of the step can reach (opaque.python_function_variables):
        # nothing records their writes, so their values after each run are compared.
        self.python: dict[int, Any] = {}

    def before_call(self, name: str, tensor_inputs: Any) -> None:
        """A function is about to run: keep the variables it can write, as they are, with
        those the Python functions it calls (tf.numpy_function, tf.py_function) can reach."""
        self.settle()
        written = written_args(name)
        python = python_function_variables(name)
        if not written and not python:
            return
        held = self.held()  # once per call: a model's hundreds of variables, each written
        for i, dtype in written.items():
            if i < len(tensor_inputs):
                self._keep(tensor_inputs[i], dtype, None, held)
        for variable in python:
            self._keep(variable.handle, variable.dtype.as_datatype_enum, None, held)
            if ops.eager_identity(variable.handle) in self.states:
                self.python[id(variable)] = variable

    def after_eager(self, op_type: str, inputs: Any, outputs: Any) -> None:
        """An eager op ran: an ``RngReadAndSkip`` returns the state it found (padded to 3);
        another that wrote a variable (an eager ``assign_add``, ``StatefulRandomBinomial``)
        leaves no trace of what it held, and that variable is not put back: a later read
        before a call would find it written already (a later ``RngReadAndSkip`` found a
        binomial's generator moved: probe round 34), so it is left to the unrestored-update
        warning."""
        advances = knowledge.advances_generator(op_type)
        if not advances and not WRITER.match(op_type):
            return
        handle = ops.state_input(op_type, inputs)
        if handle is None:
            return
        if op_type == "RngReadAndSkip" and outputs:
            self._keep(handle, INT64, outputs[0], None)
        else:
            identity = ops.eager_identity(handle)
            if identity not in self.states:
                self.unread.add(identity)

    def _keep(self, handle: Any, dtype: int, found: Any, held: set[str] | None) -> None:
        identity = ops.eager_identity(handle)
        if identity in self.states or identity in self.late or identity in self.unread:
            return
        if identity in (self.held() if held is None else held):
            return
        if self.closed:
            self.late.add(identity)
            return
        from tensorflow.python.ops import gen_resource_variable_ops as gen

        try:
            with inside_nddebug():  # nddebug's read: not one of the step's ops
                if not bool(gen.var_is_initialized_op(handle)):
                    # Made by the step and not yet given its value: the call about to run
                    # initializes it (TensorFlow's `initialize_variables`, for a
                    # tf.Variable a tf.function creates on its first call), and the call
                    # after it finds it as initialized. Read now, it was an empty array
                    # that every later run was "restored" to: the step raised, and the
                    # variable was left empty (probe round 47, F1).
                    return
                now = gen.read_variable_op(handle, dtype).numpy()
                before = now if found is None else found.numpy()
        except Exception:  # noqa: BLE001 - unreadable: left to the unrestored-update warning
            return
        before = np.asarray(before).reshape(-1)[: now.size]  # RngReadAndSkip pads to 3
        self.states[identity] = (handle, before.reshape(now.shape))

    def restore(self) -> list[str]:
        """Put every variable found back as it was before the check. Returns the errors of
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
