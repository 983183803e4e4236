"""Per-step digests for very long runs (``trace(detail="steps")``) and the one step recorded in
full when two runs part (``trace(detail="step:K")``, what ``nddebug run --bisect`` uses).

A step ends with each top-level call (a function call or a ``Session.run``); the eager ops
before a call belong to its step. In steps mode every op execution of a step is folded into
one pseudo-execution of the pseudo-op ``Step``: the sum of a 64-bit hash of each execution's
op key and output digests, with the count, so a 100k-step run is 100k rows. The fold is a
sum, not a chain: graph ops of one call record in the order threads finish them, so the same
step must fold to the same value whatever that order was.
"""

from __future__ import annotations

import hashlib
from typing import Any

from nddebug.recording import BATCHES_PER_CALL, Event, OpInfo, step_callee

STEP_OP = "Step"
SESSION_RUN = "Session.run"  # the pseudo-op of a TF1 Session.run (a top-level call)
STEP_KEY = "step"
_MASK = (1 << 64) - 1


def parse(detail: str) -> tuple[str, tuple[int, int] | None]:
    """``"ops"`` (every op execution), ``"steps"`` (one digest per step), ``"step:K"`` (step
    K in full, the steps before it as digests, nothing after it) or ``"step:K-L"`` (steps K
    to L in full: an evaluation call that leads into a training step, and that step)."""
    if detail in ("ops", "steps"):
        return detail, None
    if detail.startswith("step:"):
        first, _, last = detail.split(":", 1)[1].partition("-")
        try:
            k = int(first)
            k2 = int(last) if last else k
        except ValueError:
            k = k2 = 0
        if 1 <= k <= k2:
            return "step", (k, k2)
    raise ValueError(
        f"detail must be 'ops', 'steps', 'step:K' or 'step:K-L' with 1 <= K <= L, got {detail!r}"
    )


def _hash(key: str, digests: list[Any]) -> int:
    text = f"{key}|{digests!r}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


class StepFolder:
    """Folds a recording's events step by step, as the recorder appends them."""

    def __init__(self, detail: str) -> None:
        self.mode, self.keep = parse(detail)
        self.step = 0  # steps completed so far
        # A call appended while the tf.function call that made it is still under way (the
        # variable initializer TensorFlow runs before a function's first call): the step
        # ends when that outer call returns (:func:`end_outer_call`).
        self.held = False
        self.start = 0  # index in recording.events where the current step began
        self.op_ids: dict[str, int] = {}  # callee -> its Step pseudo-op (see _step_op)

    @property
    def active(self) -> bool:
        return self.mode != "ops"

    def end_step(self, recorder: Any) -> None:
        """A top-level call was just appended: its step is complete."""
        self.held = False
        self.step += 1
        self._close(recorder, self.step)

    def finish(self, recorder: Any) -> None:
        """The block ended: eager ops after the last call form one last step."""
        if len(recorder.recording.events) > self.start:
            self.step += 1
            self._close(recorder, self.step)

    def _close(self, recorder: Any, step: int) -> None:
        events = recorder.recording.events
        mine = events[self.start :]
        if self.mode == "step" and self.keep[0] <= step <= self.keep[1]:
            self.start = len(events)  # this step in full
            return
        del events[self.start :]
        if self.mode == "step" and step > self.keep[1]:
            self.start = len(events)  # after the step of interest: nothing is kept
            return
        total, count = 0, 0
        ops = recorder.recording.ops
        callee, batches = "", 0
        for ev in mine:
            op = ops.get(ev.op_id)
            total = (total + _hash(op.key if op is not None else str(ev.op_id), ev.digests)) & _MASK
            count += 1
            if op is not None and ev.call == ev.seq and (op.function or op.op_type == SESSION_RUN):
                callee = step_callee(op)  # the call that ends the step comes last
                batches = op.attrs.get(BATCHES_PER_CALL, 0)
        seq = recorder.next_seq()
        step_op = self._step_op(recorder, callee, batches)
        events.append(Event(seq, step_op, seq, [(_signed(total), count)], []))
        self.start = len(events)

    def _step_op(self, recorder: Any, callee: str, batches: int = 0) -> int:
        """The pseudo-op of the steps that a call of ``callee`` ends: one per function, so
        that steps are counted as the calls of the function called most often, as for a
        block recorded in full (Keras's evaluation calls between training steps are not
        steps)."""
        op_id = self.op_ids.get(callee)
        if op_id is None:
            from nddebug.tracer.registry import REGISTRY

            op_id = self.op_ids[callee] = REGISTRY.new_id()
            recorder.recording.ops[op_id] = OpInfo(
                op_id=op_id,
                key=f"{STEP_KEY}:{callee}" if callee else STEP_KEY,
                op_type=STEP_OP,
                op_name="all op executions of one step",
                graph="",
                device="",
                location="",
                dtypes=["int64"],
                shapes=[[2]],
                digestible=[True],
                note="per-step digest (trace(detail='steps')): record the step in full to "
                "name its ops",
                attrs={"callee": callee} if callee else {},
            )
            if batches:  # Keras's steps_per_execution, as the call's op holds it
                recorder.recording.ops[op_id].attrs[BATCHES_PER_CALL] = batches
        return op_id


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x
