"""Steps of a long run: where two runs first part, and how the divergence grows step by step.

Pure functions over recordings and the comparison's findings; no TensorFlow.

A *step* is one top-level call of the block's training step: the k-th call of the function the
block calls most often (a tf.function, Keras's train function, a function traced before the
block), or the k-th ``Session.run``. Eager ops between two steps belong to the step they lead
into, and those after the last step to the last one. A block with no such call (purely eager
code) has no steps: its first divergence is placed by execution only.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any

from nddebug.recording import (
    BATCHES_PER_CALL,
    Event,
    OpInfo,
    Recording,
    function_name,
    is_int,
    step_callee,
)

#: The pseudo-op of a step folded into one digest (nddebug.tracer.steps.STEP_OP).
STEP_OP = "Step"

SPARK = " ▁▂▃▄▅▆▇█"

#: Step functions whose one call can be more than one training step, and what a call is.
CALL_IS = {
    "multi_step_on_iterator": (
        "Keras's train function: steps_per_execution batches a call, 1 by default"
    ),
}
#: The same where the recording holds the model's steps_per_execution (k; see
#: recording.BATCHES_PER_CALL).
CALL_IS_K = {
    "multi_step_on_iterator": "Keras's train function: steps_per_execution={k}, so a call "
    "trains {batches}",
}


@dataclass
class FirstDivergence:
    """The first op execution that differed between the runs, and the step it ran in."""

    step: int | None  # 1-based step (None: the block has no steps)
    steps: int  # how many steps the reference run made
    op_type: str
    op_name: str
    key: str
    location: str
    role: str  # the op's role in the comparison: source, propagated or control flow
    index: int  # 0-based position of the execution among the executions of run ``run``
    explanation: str = ""
    # The run ``index`` counts in: 0, the reference, unless only a later run made the op (a
    # step that one run made and the reference did not).
    run: int = 0
    # Each run's number of steps, where they differ (an early stop, a time budget): the
    # reference's count alone read "step 48 of 47".
    steps_per_run: list[int] | None = None
    # The Python name of the function whose calls are the steps ("Session.run" in TF1; ""
    # where unknown): with Keras's steps_per_execution a call trains several batches, and
    # "step 5 of 9" counted calls without saying so.
    step_function: str = ""
    # The call the first divergent execution ran in where that is another function's call
    # that leads into the step (fit's validation, an evaluation loop), not the step's own:
    # "step 5 ... Steps 1 to 4 agree" read as if training had diverged (probe round 34).
    other_call: str = ""
    other_call_after: bool = False  # after the last step's call, not before the step's own
    # The most batches one call of step_function takes (Keras's steps_per_execution; 0 where
    # the recording does not say): "1 by default" did not say what the user had set.
    batches_per_call: int = 0

    def sentence(self) -> str:
        """:meth:`describe` as a sentence of its own."""
        text = self.describe()
        return text[0].upper() + text[1:] + "."

    def describe(self) -> str:
        """The sentence a report opens with."""
        where = f"{self.op_type} ({self.location or self.op_name or self.key})"
        if self.step is None:
            at = f"at op execution {self.index + 1}"
        elif self.steps_per_run:
            made = ", ".join(f"run {i + 1}: {n}" for i, n in enumerate(self.steps_per_run))
            at = f"at step {self.step} (the runs made different numbers of steps: {made})"
        else:
            at = f"at step {self.step} of {self.steps}"
        when = "after" if self.other_call_after else "before"
        if self.step is not None and self.other_call:
            at += f", in a call of {self.other_call} {when} that step's own call"
        elif self.step is not None and self.other_call_after:
            at += ", after that step's own call"
        role = "control-flow difference" if self.role == "control flow" else self.role
        text = f"the runs first part {at}, in {where}, a {role}"
        if self.explanation:
            text += f": {self.explanation.rstrip('.')}"
        if self.step is not None and self.step > 1:
            text += f". Steps 1 to {self.step - 1} agree bit for bit"
        if self.step is not None and self.step_function and self.steps > 1:
            text += f". A step is one call of {self.step_function}"
            if self.batches_per_call and self.step_function in CALL_IS_K:
                k = self.batches_per_call
                batches = "one batch" if k == 1 else f"up to {k} batches"
                text += f" ({CALL_IS_K[self.step_function].format(k=k, batches=batches)})"
            elif self.step_function in CALL_IS:
                text += f" ({CALL_IS[self.step_function]})"
        return text


@dataclass
class Window:
    """Long runs compared as arrays of digests, call by call, with only the first divergent
    call analysed op by op (:mod:`nddebug.longruns`): where that call sits in the whole run."""

    step: int | None  # the whole run's step the window's call belongs to (None: no steps)
    steps: int  # steps of the whole reference run
    first_index: int  # index in the whole reference run of the window's first execution
    executions: int  # op executions of the whole reference run, all compared
    timeline: list[int]  # executions that differ, per step of the whole reference run
    executed: frozenset[int]  # op ids the reference run executed anywhere (for risks)

    def place(self, fd: FirstDivergence | None) -> FirstDivergence | None:
        """A first divergence found in the window, placed in the whole run."""
        if fd is None:
            return None
        # The window's runs hold one call each: their step counts say nothing of the runs'.
        return dataclasses.replace(
            fd,
            step=self.step,
            steps=self.steps,
            index=self.first_index + fd.index,
            steps_per_run=None,
        )


def step_calls(rec: Recording) -> list[int]:
    """The seqs of the reference run's step calls, in order (empty: no steps). A run recorded
    with ``detail="steps"`` or ``"step:K"`` has its folded steps as ``Step`` pseudo-executions:
    each is a step too, and comes before the calls recorded in full."""
    return steps_among([(ev.seq, rec.ops.get(ev.op_id)) for ev in rec.events if ev.call == ev.seq])


def steps_among(eager: list[tuple[int, OpInfo | None]]) -> list[int]:
    """:func:`step_calls` over a run's top-level executions, given as (seq, op) in order.
    A folded step (``Step``) names the call that ended it (``attrs["callee"]``) and counts
    as a call of that. One that names none holds the eager ops after the last call, part of
    the last step as in a block recorded in full; in a recording made before steps named
    their call, none does, and each is a step."""
    calls: Counter[str] = Counter()
    first: dict[str, int] = {}
    folded = []
    callees: list[tuple[int, str]] = []
    for seq, op in eager:
        if op is None:
            continue
        if op.op_type == STEP_OP and not op.attrs.get("callee"):
            folded.append(seq)
            continue
        if op.op_type == STEP_OP:
            callee = str(op.attrs["callee"])
        elif op.function or op.op_type == "Session.run":
            callee = step_callee(op)
        else:
            continue
        calls[callee] += 1
        first.setdefault(callee, seq)
        callees.append((seq, callee))
    if not calls:
        return folded
    top = max(calls, key=lambda k: (calls[k], -first[k]))
    return [seq for seq, callee in callees if callee == top]


def step_function(rec: Recording, steps: list[int]) -> str:
    """The Python name of the function whose calls are ``rec``'s steps (``steps`` from
    :func:`step_calls`): "" where there are none or the steps name no call."""
    if not steps:
        return ""
    first = next((ev for ev in rec.events if ev.seq == steps[0]), None)
    op = rec.ops.get(first.op_id) if first is not None else None
    if op is None:
        return ""
    if op.op_type == STEP_OP:  # a folded step: the key of the call that ended it
        # ("eager:__inference_step_12@train.py:40 (main) via ...", "session:Session.run@...")
        callee = str(op.attrs.get("callee") or "").split(" via ")[0].split("@")[0]
        callee = callee.split(":", 1)[-1]
        return function_name(callee) if callee else ""
    return op.op_type if op.op_type == "Session.run" else function_name(op.op_type)


def batches_per_call(rec: Recording, steps: list[int]) -> int:
    """The most batches one step's call takes, where the first step's op says (Keras's
    steps_per_execution; recording.BATCHES_PER_CALL), else 0."""
    first = next((ev for ev in rec.events if steps and ev.seq == steps[0]), None)
    op = rec.ops.get(first.op_id) if first is not None else None
    k = op.attrs.get(BATCHES_PER_CALL, 0) if op is not None else 0
    return k if is_int(k) and k > 0 else 0


def other_call(rec: Recording, call_seq: int, steps: list[int]) -> str:
    """The function of top-level call ``call_seq`` where it is a call of another function than
    the steps' (with the library function that made it, as "evaluate"), else ""."""
    if not steps or call_seq in steps:
        return ""
    by_seq = {ev.seq: ev for ev in rec.events if ev.call == ev.seq}
    call, step = by_seq.get(call_seq), by_seq.get(steps[0])
    op = rec.ops.get(call.op_id) if call is not None else None
    first = rec.ops.get(step.op_id) if step is not None else None
    if op is None or first is None or not op.function or op.op_type == STEP_OP:
        return ""  # an eager op between steps is part of the step it leads into
    if step_callee(op) == step_callee(first):
        return ""
    callers = [c for c in op.key.partition(" via ")[2].split(" > ") if c and "<" not in c]
    name = function_name(op.op_type)
    return f"{name} (from {callers[-1]})" if callers else name


def step_of(steps: list[int], call_seq: int) -> int | None:
    """The 1-based step an execution belongs to, given the seq of its top-level call."""
    if not steps:
        return None
    k = bisect.bisect_left(steps, call_seq)  # steps strictly before the call
    return min(k + 1, len(steps))


def _eager(rec: Recording) -> list[Event]:
    return [ev for ev in rec.events if ev.call == ev.seq]


_ROLE_RANK = {"source": 0, "control flow": 1, "propagated": 2}


def first_divergence(recordings: list[Recording], findings: list[Any]) -> FirstDivergence | None:
    """The first divergent execution, over every finding (a source, what it propagated to, an
    op that ran in some runs only). None when nothing diverged.

    Ordered by the top-level call it ran in, then by role (within one call, graph ops record
    in an order threads decide, so a read that only propagated can arrive before the op that
    caused it), then by arrival. Executions of the reference run are placed by it; a
    top-level op that only a later run made, by that run (the runs made the same top-level
    ops up to where they part, so its position there is the reference's): an assignment run 1
    alone made was left out, and the read it changed named as where the runs part."""
    from nddebug.analysis import extra_origin

    if not recordings or not findings:
        return None
    ref = recordings[0]
    by_seq = {ev.seq: (i, ev) for i, ev in enumerate(ref.events)}
    ranked: list[tuple[int, int, int, Any, int, int]] = []  # (call, role, seq, f, run, index)
    eager_of: dict[int, list[Event]] = {}
    for f in findings:
        role = _ROLE_RANK.get(f.role, 3)
        units = getattr(f, "divergent_units", None) or f.units
        own = [u for u in units if u[0] >= 0]
        if own and f.first_seq in by_seq:
            ranked.append((min(u[0] for u in own), role, f.first_seq, f, 0, by_seq[f.first_seq][0]))
        for u in units:
            origin = extra_origin(u[0])
            if origin is None or origin[0] >= len(recordings):
                continue
            run, at = origin
            eager = eager_of.setdefault(run, _eager(recordings[run]))
            if at < len(eager):
                ranked.append((at, role, eager[at].seq, f, run, 0))
    if not ranked:
        return None
    _, _, seq, f, run, index = min(ranked, key=lambda r: r[:3])
    rec = recordings[run]
    if run:
        index = next(i for i, ev in enumerate(rec.events) if ev.seq == seq)
    steps = step_calls(rec)
    counts = [len(steps) if r is rec else len(step_calls(r)) for r in recordings]
    return FirstDivergence(
        step=step_of(steps, rec.events[index].call),
        steps=counts[0],
        op_type=f.op.op_type,
        op_name=f.op.op_name,
        key=f.key,
        location=f.op.location,
        role=f.role,
        index=index,
        explanation=f.explanation,
        run=run,
        steps_per_run=counts if len(set(counts)) > 1 else None,
        step_function=step_function(rec, steps),
        batches_per_call=batches_per_call(rec, steps),
        other_call=other_call(rec, rec.events[index].call, steps),
        other_call_after=bool(steps) and rec.events[index].call > steps[-1],
    )


def divergence_per_step(recordings: list[Recording], findings: list[Any]) -> list[int]:
    """How many op executions diverged in each step of the reference run (index 0 = step 1);
    empty when the block has no steps."""
    if not recordings:
        return []
    ref = recordings[0]
    steps = step_calls(ref)
    if not steps:
        return []
    eager = _eager(ref)
    counts = [0] * len(steps)
    for f in findings:
        for u in getattr(f, "divergent_units", None) or f.units:
            if 0 <= u[0] < len(eager):
                s = step_of(steps, eager[u[0]].seq)
                if s is not None:
                    counts[s - 1] += 1
    return counts


def sparkline(counts: list[int], width: int = 60) -> str:
    """Counts as one line of block characters, at most ``width`` wide (each character the
    largest count of the steps it stands for); a step with no divergence is a space."""
    if not counts:
        return ""
    per = max(1, -(-len(counts) // width))
    buckets = [max(counts[i : i + per]) for i in range(0, len(counts), per)]
    top = max(buckets)
    if top == 0:
        return "·" * len(buckets)
    out = []
    for c in buckets:
        if c == 0:
            out.append("·")
        else:
            level = 1 + int((len(SPARK) - 2) * (c / top))
            out.append(SPARK[min(level, len(SPARK) - 1)])
    return "".join(out)
