"""Two passes that judge what a comparison did not see: known culprits that ran (risks) and
how rare a divergence the runs could have missed (bound).

Pure functions over recordings and findings; no TensorFlow. A race that did not show in N
runs is still a race: a report is never "reproducible" over an op that the knowledge base
says is non-deterministic on the device it ran on, with the run's settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nddebug import knowledge
from nddebug.recording import (
    ACCUMULATED_SUM,
    INTEGER_OUTPUTS,
    PARALLEL_RANDOM,
    PIPELINE_OPS,
    PIPELINE_READERS,
    TF1_LOOP,
    TF1_LOOP_NAME,
    UNCLOSED_WARNING,
    Recording,
    unseen_op_type,
)

#: Kinds of knowledge-base entries whose op is non-deterministic by its kernel alone. Random
#: ops are not here: seeded, they repeat; unseeded, every repeat shows it. Collectives are not
#: either: their order depends on the cluster, and replica/worker consistency checks them.
KERNEL_KINDS = ("numerical",)
#: What op determinism does to an entry that still leaves it a risk when it is on.
STILL_RISKY_UNDER_DETERMINISM = ("unaffected", "n/a")


@dataclass
class Risk:
    """An op that ran and that the knowledge base lists as non-deterministic."""

    op_type: str
    op_name: str
    key: str
    location: str
    device: str
    observed: bool  # diverged in these runs
    applies: bool  # on the device it ran on, with the run's settings (else: on another device)
    culprit: knowledge.Culprit
    confirmed: str = ""  # what re-executing it alone showed, when that was done

    @property
    def fix(self) -> str:
        return self.culprit.fix


def _all_integer(dtypes: list[str]) -> bool:
    """Whether every output is an integer or boolean (by dtype name: no TensorFlow here)."""
    return bool(dtypes) and all(d == "bool" or d.startswith(("int", "uint")) for d in dtypes)


def _device(op: Any, env: dict[str, Any]) -> str:
    return env.get("emulated_device") or op.device or ",".join(env.get("devices", []))


#: The knowledge base's entry for ops a TF1 Session.run leaves unordered.
RACE_TOPIC = "TF1 graphs / Session thread order"


#: The knowledge entry of stateful random ops shared by loop iterations run side by side.
LOOP_RANDOM_TOPIC = "legacy random ops in parallel loop iterations"


def _race_culprit(topic: str = RACE_TOPIC) -> knowledge.Culprit | None:
    return knowledge.by_topic(topic)


def known_risks(
    recordings: list[Recording], findings: list[Any], executed: frozenset[int] | None = None
) -> list[Risk]:
    """Every op of the runs that the knowledge base lists as non-deterministic on the device it
    ran on with the run's settings (``applies``), and those listed only for another device
    (information: a CPU run's GPU culprits), one row per op, in recording order. ``executed``:
    the op ids the reference run executed, where its events are only a window of it."""
    if not recordings:
        return []
    env = recordings[0].environment or {}
    determinism = bool(env.get("op_determinism"))
    diverged = {f.key for f in findings if f.role in ("source", "propagated")}
    # The op types that differed: a loop's random ops are recorded in its body, and its own
    # outputs (a map_fn's TensorList) may hold nothing digested.
    differed_types = {
        getattr(getattr(f, "op", None), "op_type", "")
        for f in findings
        if f.role in ("source", "propagated")
    }
    race = _race_culprit()
    seen: dict[str, Risk] = {}
    for rec in recordings[:1]:
        ran = executed if executed is not None else {ev.op_id for ev in rec.events}
        # A TF1 while loop is compared where its values leave it: at its Exits and at the ops
        # outside that read state it wrote (session.py), each listing the ops inside. A known
        # kernel inside showed if any of those differed (the gather of a TensorArray a
        # ResourceScatterAdd in the body filled), and it is one risk of the loop, not one
        # per place the loop was compared.
        loops_differed = {
            op.attrs.get(TF1_LOOP_NAME)
            for op in rec.ops.values()
            if op.function == TF1_LOOP and op.key in diverged
        }
        in_loops: set[tuple[Any, str]] = set()
        for op_id in sorted(ran):
            op = rec.ops.get(op_id)
            if op is None:
                continue
            device = _device(op, env)
            # The op, then the kernels recorded with it as one unit (OpInfo.fused): they ran
            # too, their outputs were only not digested apart; a key names each.
            members = [(op.key, op.op_type, op.op_name), *((k, t, k) for k, t in op.fused.items())]
            # Ops unseen inside a call or a dataset's functions whose outputs are integers.
            unseen = [*op.attrs.get("ops_inside", []), *op.attrs.get(PIPELINE_OPS, [])]
            integer_inside = {
                f"{op.key} > {unseen_op_type(t)}"
                for t in unseen
                # Not where the same type also runs with other outputs (float bins).
                if t.endswith(INTEGER_OUTPUTS) and unseen_op_type(t) not in unseen
            }
            loop = op.attrs.get(TF1_LOOP_NAME) if op.function == TF1_LOOP else None
            if op.function in ("uninstrumented", TF1_LOOP):
                # A call of a function traced before the block (a TF1 loop's frame): its ops
                # ran unseen, but what they are is known (OpInfo.attrs["ops_inside"]); a
                # known culprit among them is a risk of the call (and under emulate_gpu() it
                # was not emulated).
                for t in map(unseen_op_type, op.attrs.get("ops_inside", [])):
                    if "(" in t or (loop is not None and (loop, t) in in_loops):
                        continue
                    if loop is not None:
                        in_loops.add((loop, t))
                    members.append(
                        (f"{op.key} > {t}", t, f"{t} inside {loop or op.op_name or op.op_type}")
                    )
            if op.op_type in PIPELINE_READERS:
                # A dataset's tf.data functions (a `for x in dataset` loop's body inside a
                # tf.function) run unseen, when the op that reads the dataset runs: the same
                # holds, for that op (the datasets behind it list them too).
                members += [
                    (f"{op.key} > {t}", t, f"{t} in a tf.data function behind {op.op_type}")
                    for t in map(unseen_op_type, op.attrs.get(PIPELINE_OPS, []))
                    if "(" not in t
                ]
            if op.attrs.get("races_with") and op.key not in seen and race is not None:
                # A TF1 read or update that no path orders with a write of its variable in
                # the same Session.run (tracer.session): runs where it did not show are not
                # shown reproducible, whatever the thread order was in them.
                seen[op.key] = Risk(
                    op_type=op.op_type,
                    op_name=op.op_name,
                    key=op.key,
                    location=op.location,
                    device=device,
                    observed=op.key in diverged,
                    applies=True,
                    culprit=race,
                )
                continue
            # Constructs the runs may not show, each a risk of the op by its knowledge entry:
            # random ops shared by loop iterations run side by side (the traced loop runs
            # them in turn), and a sum grappler adds in arrival order (tracer.optimized_sums).
            hidden = []
            racing = op.attrs.get(PARALLEL_RANDOM)
            if racing:
                names = ", ".join(racing)
                where = f"in the loop {op.op_name or op.op_type} (its iterations run side by side)"
                hidden.append(("loop", LOOP_RANDOM_TOPIC, names, f"{names} {where}"))
            accumulated = op.attrs.get(ACCUMULATED_SUM)
            if accumulated:
                how = "(grappler made it one AssignAdd per term, added in arrival order)"
                name = f"{', '.join(accumulated)} {how}"
                hidden.append(("accumulated", knowledge.ACCUMULATED_TOPIC, "AddN", name))
            for suffix, topic, op_type, name in hidden:
                culprit = _race_culprit(topic)
                key = f"{op.key} > {suffix}"
                if culprit is not None and key not in seen:
                    # A random op of the loop that differed showed it (a map_fn's unseeded
                    # RandomUniform was the source and "no difference seen"; probe round 47,
                    # F14).
                    shown = suffix == "loop" and bool(set(racing or ()) & differed_types)
                    seen[key] = Risk(
                        op_type=op_type,
                        op_name=name,
                        key=key,
                        location=op.location,
                        device=device,
                        observed=op.key in diverged or shown,
                        applies=True,
                        culprit=culprit,
                    )
            for key, op_type, name in members:
                if key in seen:
                    continue
                culprit = knowledge.lookup(op_type, device)
                if culprit is None or culprit.kind not in KERNEL_KINDS:
                    continue
                if culprit.integer_outputs_exact and (
                    (key == op.key and _all_integer(op.dtypes)) or key in integer_inside
                ):
                    continue  # sums of integers: the same in any order
                here = knowledge.device_kind(device) or "CPU"
                on_device = culprit.device in (here, "any")
                if determinism and culprit.under_determinism not in STILL_RISKY_UNDER_DETERMINISM:
                    if on_device or culprit.under_determinism == "fixed":
                        # Fixed (or made to raise) by op determinism on this device; on
                        # another, fixed there too (one that raises there is still said).
                        continue
                seen[key] = Risk(
                    op_type=op_type,
                    op_name=name,
                    key=key,
                    location=op.location,
                    device=device,
                    observed=(
                        key in diverged
                        or op.key in diverged
                        or (loop is not None and loop in loops_differed)
                    ),
                    applies=on_device,
                    culprit=culprit,
                )
    return list(seen.values())


def rule_out_bound(runs: int, confidence: float = 0.95) -> float | None:
    """The smallest per-run probability of a divergence that ``runs`` clean runs rule out at
    ``confidence``: a source that shows in a fraction p of runs stays hidden in all of them
    with probability (1 - p) ** runs. None with fewer than two runs (nothing compared)."""
    if runs < 2:
        return None
    return 1.0 - (1.0 - confidence) ** (1.0 / runs)


def runs_for(bound: float, confidence: float = 0.95) -> int:
    """How many clean runs rule out a divergence showing in more than ``bound`` of runs."""
    return math.ceil(math.log(1.0 - confidence) / math.log(1.0 - bound))


def describe_bound(runs: int, unit: str = "runs") -> str:
    """The bound in words, with the repeats that would bring it to 10%."""
    p = rule_out_bound(runs)
    if p is None:
        return ""
    text = (
        f"a source that shows in more than {p:.0%} of {unit} would have been seen in these "
        f"{runs} (95% confidence)"
    )
    if p > 0.1:
        text += f"; {runs_for(0.1)} {unit} bring that to 10%"
    return text


def setup_notes(recordings: list[Recording]) -> list[str]:
    """What the runs' own records say about how comparable they are: runs whose block raised
    (compared only up to where they stopped), and runs made with other TensorFlow versions,
    devices or op-determinism settings than the first (their differences may be the setup's,
    not the step's)."""
    notes = []
    interrupted = [i for i, r in enumerate(recordings) if r.status == "interrupted"]
    # A run a file holds unclosed was not stopped by an exception: its process died, or is
    # still writing it (`nddebug report` on a file a long run streams to; probe round 45, F2).
    unclosed = [i for i in interrupted if UNCLOSED_WARNING in recordings[i].warnings]
    raised = [i for i in interrupted if i not in unclosed]
    if raised:
        notes.append(
            f"run(s) {raised} ended with an exception inside the block: they were "
            "compared only as far as they ran."
        )
    if unclosed:
        notes.append(
            f"run(s) {unclosed} were not closed in their file (the process writing them "
            "stopped, or is still writing them): they were compared only as far as they "
            "were written."
        )
    for field, what in (
        ("tensorflow", "TensorFlow versions"),
        ("devices", "devices"),
        ("op_determinism", "op-determinism settings"),
    ):
        values = [str((r.environment or {}).get(field)) for r in recordings]
        if len(set(values)) > 1:
            shown = ", ".join(f"run {i}: {v}" for i, v in enumerate(values))
            notes.append(
                f"the runs were made with different {what} ({shown}): a difference may be "
                "the setup's rather than the step's."
            )
    return notes


def shared_hashseed(recordings: list[Recording]) -> str:
    """A note when runs made in separate processes all had one fixed PYTHONHASHSEED (set in
    the shell ``nddebug run`` inherits, or by ``--hashseed N``): Python salts str and bytes
    hashes per process only without it, so a step fed in set or dict-of-set order (a
    vocabulary, file or feature list built from a set) came out the same in every run here
    and can differ in processes started without it. "" when not."""
    seeds = {
        str(((r.environment or {}).get("env") or {}).get("PYTHONHASHSEED")) for r in recordings
    }
    if len(recordings) < 2 or len(seeds) != 1:
        return ""
    seed = seeds.pop()
    if not seed.isdigit():  # unset ("None") or "random": a new salt per process
        return ""
    return (
        f"every run had PYTHONHASHSEED={seed}, so Python's str and bytes hashes (set and "
        "dict-of-set order) were the same in each process: a difference that order makes "
        "could not show here; run with --hashseed random (or without PYTHONHASHSEED) to "
        "include it."
    )
