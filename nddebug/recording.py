"""What one traced run saw: plain data that saves, loads and compares without TensorFlow."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from typing import Any

Digest = tuple[int, int]  # see nddebug.digest
#: OpInfo.rerun of an op that runs other ops (a function call, a branch, a loop): it is covered
#: by re-executing the ops inside it.
RERUN_INNER = "function call or control flow (its inner ops are re-executed)"
#: Graph ops that run other ops (function bodies, branches, loops): what they output, their
#: inner ops computed. Rerun mode re-executes those inner ops, not the call, and a call whose
#: outputs differ is not a source when an op inside it is.
CALL_OPS = {
    "PartitionedCall",
    "StatefulPartitionedCall",
    "If",
    "StatelessIf",
    "While",
    "StatelessWhile",
    "Case",
    "StatelessCase",
}


#: OpInfo.function of calls nddebug cannot see inside: a tf.function traced before the block
#: ("uninstrumented") or compiled with XLA ("xla"). Their outputs and the variables they can
#: write are compared; the ops inside them are not.
OPAQUE = ("uninstrumented", "xla")
#: Warnings that start with this say what a run could not compare: the verdict cannot be "ok".
NOT_COMPARED = "Not compared: "
#: The tail of the one warning a run gives for all its XLA-compiled functions.
XLA_NOTE = (
    "XLA compiles each as a whole, so nddebug compares its inputs, its outputs and the variables "
    "it writes, not the ops inside it. nddebug.check() checks such a step as compiled, then with "
    "XLA off to name the op; or set jit_compile=False while debugging."
)


#: OpInfo.graph of the ops of a TF1 graph (tf.compat.v1 Session): one graph whose variables
#: persist from one Session.run to the next.
TF1_GRAPH = "tf.compat.v1 graph"


@dataclass
class OpInfo:
    """A traced op: one per eager op execution site or graph node (static facts)."""

    op_id: int
    key: str  # stable across processes: graph name without unique ids + op name (or eager site)
    op_type: str
    op_name: str
    graph: str  # "" for eager ops
    device: str
    location: str  # "file:line (function)" in the user's code
    dtypes: list[str]  # per output
    shapes: list[list[int | None] | None]  # static shape per output (None: unknown rank)
    digestible: list[bool]  # per output: False for string/resource/variant outputs
    stateful: bool = False
    attrs: dict[str, Any] = field(default_factory=dict)  # e.g. {"seed": 0, "seed2": 0}
    note: str = ""  # e.g. "value of the variable after this update"
    resource: str = ""  # the variable an op reads or writes (ReadVariableOp, updates)
    # For a tf.function call: "instrumented", or one of OPAQUE ("uninstrumented", "xla").
    function: str = ""
    # For an opaque call: the variables whose values after the call fill its last output
    # slots (and, read before the call, its last input digests).
    written: list[str] = field(default_factory=list)
    # In a rerun recording: "" if the op was re-executed, else why not ("stateful", ...).
    rerun: str = ""


@dataclass
class Event:
    """One execution of an op: the digests of its outputs (None where unreadable)."""

    seq: int  # order of arrival in the run
    op_id: int
    call: int  # seq of the top-level eager op during which it ran (its own seq for eager ops)
    digests: list[Digest | None]
    inputs: list[Digest] | None = None  # digests of its readable inputs, in order
    shapes: list[list[int]] | None = None  # actual shapes, when known (eager ops)
    # In a rerun recording: the output digests of each extra execution on the same inputs.
    reruns: list[list[Digest | None]] | None = None


@dataclass
class Recording:
    """One run of a traced block."""

    ops: dict[int, OpInfo] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    label: str = ""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    digest_algorithm: str = ""
    status: str = "complete"  # or "interrupted"
    # "run": compared with other runs; "capture": kept full values to measure divergence;
    # "rerun": every re-executable op also ran again on its own inputs (compared within).
    kind: str = "run"
    # Full values captured for chosen outputs, keyed by "<event seq>:<output slot>".
    values: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        return (
            f"<Recording {self.label or self.run_id[:8]}: {len(self.events)} op executions, "
            f"{len(self.ops)} ops, {self.status}>"
        )

    def save(self, path: str) -> None:
        """Append this run to a recording file (created if absent)."""
        from nddebug import storage

        storage.save([self], path)


def op_from_row(row: dict[str, Any]) -> OpInfo:
    """Build an OpInfo from its JSON form, tolerating the tuple/list round trip."""
    fields = {f.name for f in dataclasses.fields(OpInfo)}
    data = {k: v for k, v in row.items() if k in fields}
    return OpInfo(**data)
