"""What one traced run saw: plain data that saves, loads and compares without TensorFlow."""

from __future__ import annotations

import dataclasses
import re
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

#: Ops of CALL_OPS that run a loop or a branch (not a function call): they compute nothing
#: themselves.
LOOPS_AND_BRANCHES = frozenset(CALL_OPS - {"PartitionedCall", "StatefulPartitionedCall"})

#: OpInfo.note of a variable update's record: what it holds is the variable's value after it.
UPDATE_NOTE = "value of the variable after this update"
#: OpInfo.note of an op whose value a nested function returned and its caller recorded (where
#: grappler rewrites it with its reader there): its record's inputs are the call's inputs, so,
#: like a call, it is not a source when an op inside the function is.
RECORDED_BY_CALLER = "returned by its function and recorded in the caller, with the call's inputs"
#: OpInfo.note of an op in a nested function that reads one of the function's arguments where
#: grappler, once it inlines the call, may rewrite it with the op in the caller that makes the
#: argument: the function does not digest that argument (a digest would be the second reader
#: that stops the rewrite), the call's record holds it (or what it is made of). Like a call,
#: such an op is not a source when another op is.
ARGUMENT_BY_CALLER = "reads an argument of its function that the call's record holds"


#: Ops that read only the shapes of their inputs, never their values. The tracer digests
#: none of their inputs (a digest would be a second reader of the value: grappler then keeps
#: a chain of sums it would merge without nddebug, and the bits change), so their record holds
#: no inputs; what they output is a function of shapes alone, so they are never a source: a
#: differing output means a shape upstream differed.
SHAPE_ONLY_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})
#: TF1 control flow's Merge: it hands on whichever input a branch made, the other being dead
#: (not computed). Its record reads no input digest: one from the branch that did not run is
#: dead too, and a record with a dead input never runs, nor any record that reads its digest
#: (everything after a tf.compat.v1.cond went unrecorded, and a run that differed there was
#: "reproducible": probe round 46, F2). It computes nothing: a difference is the branch's.
MERGE_OPS = frozenset({"Merge", "RefMerge"})
#: Ops that read the state behind their resource handle (OpInfo.resource) and leave it as it
#: was. Every other op on a resource may change it (an update, an insert, a dequeue, an
#: iterator's next), so a later read of the same resource after one that diverged carries its
#: difference; a read that diverged changed nothing, so it explains no later read.
STATE_READERS = frozenset(
    {
        "ReadVariableOp",
        "ResourceGather",
        "ResourceGatherNd",
        "VariableShape",
        "VarIsInitializedOp",
        "LookupTableFindV2",
        "LookupTableSizeV2",
        "LookupTableExportV2",
        "VariableState",  # check()'s pseudo-op: a variable's value after the step
    }
)
#: Ops with no output that fill state later ops read back (a table's insert, a queue's
#: enqueue, a TensorArray's write): when their inputs differed, what they wrote differs, and
#: that is a finding. Other ops with no output (a summary write, an assertion, a print) leave
#: nothing the step reads.
STATE_FILLERS = re.compile(
    r"^(LookupTable(Insert|Import|Remove)|InitializeTable|QueueEnqueue|StackPush|"
    r"TensorArray(Write|Scatter|Split))"
)
#: OpInfo.attrs key of a variable update whose variable a distribution strategy keeps per
#: replica by design (synchronization=ON_READ: a Keras metric's totals, summed when read):
#: replica_consistency does not compare its replicas.
PER_REPLICA = "per_replica"
#: Ops that change a mutable lookup table's contents (state= holds such a table).
TABLE_WRITERS = re.compile(r"^LookupTable(Insert|Import|Remove)")
#: Ops that take a queue's next elements (nothing can put them back) or fill it.
QUEUE_TAKERS = re.compile(r"^QueueDequeue")
QUEUE_FILLERS = re.compile(r"^QueueEnqueue")
#: Ops that read a table or a queue back.
TABLE_OR_QUEUE_READS = re.compile(r"^(LookupTable(Find|Size|Export)|Queue(Dequeue|Size))")
#: OpInfo.function of a TF1 while loop's Exit, whose frame nddebug cannot record (see
#: tracer.session.loop_frames): the loop is judged at its outputs, as an opaque call.
TF1_LOOP = "tf1 loop"
#: OpInfo.function of calls nddebug cannot see inside: a tf.function traced before the block
#: ("uninstrumented"), compiled with XLA ("xla"), or a TF1 while loop (TF1_LOOP). Their
#: outputs and the variables they can write are compared; the ops inside them are not.
OPAQUE = ("uninstrumented", "xla", TF1_LOOP)
#: OpInfo.attrs key of a sum that grappler's memory optimizer turned into one AssignAdd per
#: term, added in arrival order (tracer.optimized_sums): a known non-deterministic construct.
ACCUMULATED_SUM = "accumulated in arrival order"
#: Warnings that start with this say what a run could not compare: the verdict cannot be "ok".
NOT_COMPARED = "Not compared: "
#: In a run a storage.RunWriter writes, until close(): the run's status reads "interrupted"
#: and this warning is in its warnings; close() replaces both.
UNCLOSED_WARNING = (
    "This run was not closed: the process writing it stopped (or is still writing it) after "
    "the op executions stored here; the rest of the run is not in the file."
)
#: The name scope of nddebug.emulate_gpu()'s ops (see nddebug.emulate), and of the gradient
#: ops TensorFlow makes for them: its random masks run only while its switch is on, and are
#: no op of the user's.
EMULATION_SCOPE = "/emulate_gpu/"
#: Op types that write a resource variable (input 0).
WRITER = re.compile(
    r"^(ResourceApply|ResourceSparseApply|AssignVariableOp|AssignAddVariableOp|"
    r"AssignSubVariableOp|ResourceScatter|ResourceStridedSliceAssign)"
)
#: OpInfo.attrs key of a dataset op, an iterator's read or an op that runs a dataset: the op
#: types the tf.data functions behind it run (as ``tracer.opaque.ops_inside`` lists them),
#: which nddebug does not record.
PIPELINE_OPS = "pipeline_ops"
#: OpInfo.attrs key of an eager call nddebug does not see into (XLA-compiled, or traced before
#: the block): the identities (as OpInfo.resource names them) of the variables it captures,
#: whose values after the call it outputs. A read of one after a divergent call only carries
#: the difference (a read of the weights after an XLA step was named the source, "changed
#: outside the traced block", probe round 43, F1).
CALL_WRITES = "writes"
#: OpInfo.attrs key of a TF1 loop's Exit (TF1_LOOP): the state its frame reads (resource
#: identities, as OpInfo.resource names them): a divergent update of one before it explains
#: the loop's outputs, which its recorded inputs do not show.
LOOP_READS = "loop reads"
#: OpInfo.attrs key of a variable read in a TF1 graph: the names of the updates of the same
#: variable that the graph orders before it in the same Session.run (records arrive in no
#: fixed order, so their sequence cannot tell).
AFTER_WRITES = "after writes"
#: OpInfo.attrs key of a TF1_LOOP op: the name of the loop ("while", "gradients/while").
TF1_LOOP_NAME = "loop"
#: The suffix of an op type in such a list (``ops_inside``, ``PIPELINE_OPS``) whose outputs
#: are integers or booleans (its ``T`` or ``dtype`` attribute): an unweighted bincount of
#: ``tf.strings.split``'s row lengths sums counts, the same in any order (knowledge:
#: ``integer_outputs_exact``).
INTEGER_OUTPUTS = "(integer)"


#: The second half of the digest an eager op's inputs end with that stands for the form of
#: the call (its inputs' shapes and its attributes, ``tracer.eager.input_form``): a data
#: digest has it once in 2**64, so analysis tells by it where a call's arguments end and the
#: captured variables' values before the call begin.
INPUT_FORM = -1
#: Stateless random ops (by type prefix): they draw what their seed tensor says, so where
#: that seed comes from (a constant, a Keras SeedGenerator's variable, a value drawn in Python
#: when the model or pipeline was built) decides whether runs draw alike.
STATELESS_RANDOM = (
    "StatelessRandom",
    "StatelessTruncated",
    "StatelessParameterized",
    "StatelessMultinomial",
    "StatelessShuffle",
)


def unseen_op_type(entry: str) -> str:
    """The op type of an ``ops_inside``/``PIPELINE_OPS`` entry, without its
    :data:`INTEGER_OUTPUTS` tag."""
    return entry.removesuffix(INTEGER_OUTPUTS)


#: OpInfo.attrs key of an eager ``MakeIterator``: per iterator it bound (its identity, as
#: ``OpInfo.resource`` names it), what in the dataset can make the elements differ between
#: runs (a parallel map with deterministic=False, an unseeded shuffle, Python code), one
#: sentence each, [] for a dataset that holds none (see ``tracer.datasets``).
DATASET_STAGES = "dataset_stages"
#: OpInfo.attrs key next to DATASET_STAGES: per iterator, the dataset object it was bound to
#: ("dataset", its variant's eager identity) where that holds seeded shuffles that reshuffle
#: on every pass ("shuffles", one sentence each; see ``tracer.datasets.reshuffles``).
DATASET_PASSES = "dataset_passes"
#: OpInfo.attrs key of a call of Keras's train or test function: the model's
#: ``steps_per_execution`` when the call was first made, the most batches one call takes
#: (a step of a long run is one call; see timeline.FirstDivergence).
BATCHES_PER_CALL = "batches_per_call"
#: OpInfo.attrs key of a while loop (its While op) that runs iterations side by side
#: (parallel_iterations > 1) and holds stateful random ops: their types (see
#: risks.known_risks and the knowledge entry "legacy random ops in parallel loop iterations").
PARALLEL_RANDOM = "parallel_random"
#: Ops that hand on a dataset's elements: a dataset's iterator, and the ops that run a
#: dataset inside the step (``Dataset.get_single_element``, ``Dataset.reduce``, a ``for``
#: loop over a dataset inside a tf.function).
PIPELINE_READERS = (
    "IteratorGetNext",
    "OptionalGetValue",
    "DatasetToSingleElement",
    "ReduceDataset",
)
#: How the warning starts that says other threads did TensorFlow work during the block (see
#: nddebug.tracer.threads): not recorded, so a source whose inputs or state came in from
#: outside may have come from there.
OTHER_THREADS = NOT_COMPARED + "TensorFlow work that other threads did during the block"
#: The tail of the one warning a run gives for all its XLA-compiled functions.
XLA_NOTE = (
    "XLA compiles each as a whole, so nddebug compares its inputs, its outputs and the variables "
    "it writes, not the ops inside it. nddebug.check() checks such a step as compiled, then with "
    "XLA off to name the op; or set jit_compile=False while debugging."
)


#: OpInfo.graph of the ops of a TF1 graph (tf.compat.v1 Session): one graph whose variables
#: persist from one Session.run to the next.
TF1_GRAPH = "tf.compat.v1 graph"


def restored_function(name: str) -> bool:
    """Whether a called function is the wrapper TensorFlow traces around the graphs of a
    function restored from a SavedModel (``restored_function_body``): nddebug has no Python
    code of it to retrace."""
    return re.fullmatch(r"__inference_restored_function_body_\d+", name) is not None


#: Stateful ops whose kernel holds a random generator seeded from their seed and seed2
#: attributes: each kernel keeps its place in its stream, so each call draws the next numbers
#: (with seed and seed2 both 0 it seeds itself at random). TensorFlow's LEGACY_RANDOM_OPS, and
#: the candidate samplers (tf.nn.sampled_softmax_loss, nce_loss), the bounding-box sampler
#: (tf.image.sample_distorted_bounding_box) and RandomCrop, which keep one the same way; a
#: test holds this list to every stateful op TensorFlow registers with those attributes but
#: the queues (a resource, not a stream) and cuDNN's RNNs (GPU kernels whose dropout seed
#: only matters with dropout on a GPU).
RANDOM_OPS = (
    "RandomUniform",
    "RandomUniformInt",
    "RandomStandardNormal",
    "TruncatedNormal",
    "ParameterizedTruncatedNormal",
    "RandomShuffle",
    "RandomGamma",
    "RandomPoisson",
    "RandomPoissonV2",
    "Multinomial",
    "RandomCrop",
    "SampleDistortedBoundingBox",
    "SampleDistortedBoundingBoxV2",
    "AllCandidateSampler",
    "FixedUnigramCandidateSampler",
    "LearnedUnigramCandidateSampler",
    "LogUniformCandidateSampler",
    "ThreadUnsafeUnigramCandidateSampler",
    "UniformCandidateSampler",
)


def seeded_random(op: OpInfo) -> bool:
    """Whether ``op`` is one of :data:`RANDOM_OPS` given a seed (its own, or one derived from
    the global seed): its kernel draws a seeded stream, not numbers seeded at random."""
    return op.op_type in RANDOM_OPS and bool(op.attrs.get("seed", 0) or op.attrs.get("seed2", 0))


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
    digestible: list[bool]  # per output: False for resource/variant and undefined outputs
    stateful: bool = False
    attrs: dict[str, Any] = field(default_factory=dict)  # e.g. {"seed": 0, "seed2": 0}
    note: str = ""  # e.g. UPDATE_NOTE
    # The state an op reads or writes through a resource handle: a variable (ReadVariableOp,
    # updates, ResourceGather), a lookup table, a queue, an iterator, a random generator.
    resource: str = ""
    # For a tf.function call: "instrumented", or one of OPAQUE ("uninstrumented", "xla").
    function: str = ""
    # For an opaque call: the variables whose values after the call fill its last output
    # slots (and, read before the call, its last input digests).
    written: list[str] = field(default_factory=list)
    # In a rerun recording: "" if the op was re-executed, else why not ("stateful", ...).
    rerun: str = ""
    # Ops grappler rewrites together with this one where each intermediate has one consumer
    # (data/rewrites.toml), recorded as one unit with it: key -> op type, in data-flow
    # order. Their outputs are not digested (a digest would stop the rewrite); this op's
    # record holds their inputs.
    fused: dict[str, str] = field(default_factory=dict)

    def copy(self) -> OpInfo:
        """A shallow copy, made cheaply: each traced block takes its own copy of every op it
        saw (thousands per call of a large step), and dataclasses.replace costs 5x this."""
        new = object.__new__(OpInfo)
        new.__dict__.update(self.__dict__)
        return new


#: A traced function's call op, or its graph: TensorFlow's prefix before the Python name.
FUNCTION_CALL = re.compile(r"^(__inference_|__forward_|__backward_)")
#: The process-specific number TensorFlow appends to a function's (or a scope's) name.
UID_SUFFIX = re.compile(r"_\d+$")


def function_name(name: str) -> str:
    """The Python name of a traced function, from its graph's or its call op's name."""
    return FUNCTION_CALL.sub("", UID_SUFFIX.sub("", name))


def step_callee(op: OpInfo) -> str:
    """What a top-level call calls, as steps are counted (:mod:`nddebug.timeline`): its key
    without the line it was called from (``eager:__inference_step@train.py:40 (main)`` ->
    ``eager:__inference_step``), so that one function called from two loops (a first epoch,
    then the rest) is one training step; but with the library functions that made the call
    (``via TensorFlowTrainer.fit > ...``), so that Keras's train and test functions (both
    ``multi_step_on_iterator``, called from the user's ``model.fit`` line) are two."""
    if not op.function:
        return op.key
    base, _, rest = op.key.partition("@")
    _, via, callers = rest.partition(" via ")
    return f"{base}{via}{callers}"


@dataclass(slots=True)
class Event:
    """One execution of an op: the digests of its outputs (None where unreadable). Slotted:
    a step makes one per op execution (thousands), and a slotted one is made faster and
    holds no dict."""

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
    # The file a long trace(path=...) block wrote its events to as it ran: they are there,
    # not in ``events`` (see whole()). Not saved: a loaded run holds its events.
    streamed_to: str = field(default="", compare=False, metadata={"saved": False})

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        n = (
            f"op executions in {self.streamed_to}"
            if self.streamed_to
            else (f"{len(self.events)} op executions")
        )
        return (
            f"<Recording {self.label or self.run_id[:8]}: {n}, {len(self.ops)} ops, {self.status}>"
        )

    def whole(self) -> Recording:
        """This run with all its events: itself, or, for a long block that was written to
        its file as it ran (``streamed_to``), the run read back from that file."""
        if not self.streamed_to:
            return self
        from nddebug import storage

        return storage.load_run(self.streamed_to, self.run_id)

    def save(self, path: str) -> None:
        """Append this run to a recording file (created if absent)."""
        from nddebug import storage

        storage.save([self.whole()], path)


class RowError(ValueError):
    """A stored row does not have the form the data model needs; the message says what is
    wrong in words (the loader adds the file and the run)."""


def json_kind(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


def _dim(value: Any) -> bool:
    return value is None or is_int(value)


def _list_of(check: Any) -> Any:
    return lambda value: isinstance(value, list) and all(check(v) for v in value)


def _or_null(check: Any) -> Any:
    return lambda value: value is None or check(value)


_SHAPE = _list_of(_dim)
# OpInfo field -> (check, what it must be). Fields with a default may be absent (older files).
_OP_FIELDS: dict[str, tuple[Any, str]] = {
    "op_id": (is_int, "an integer"),
    "key": (_str, "a string"),
    "op_type": (_str, "a string"),
    "op_name": (_str, "a string"),
    "graph": (_str, "a string"),
    "device": (_str, "a string"),
    "location": (_str, "a string"),
    "dtypes": (_list_of(_str), "a list of strings"),
    "shapes": (_list_of(_or_null(_SHAPE)), "a list of shapes (lists of integers or null)"),
    "digestible": (_list_of(_bool), "a list of booleans"),
    "stateful": (_bool, "a boolean"),
    "attrs": (lambda v: isinstance(v, dict), "an object"),
    "note": (_str, "a string"),
    "resource": (_str, "a string"),
    "function": (_str, "a string"),
    "written": (_list_of(_str), "a list of strings"),
    "rerun": (_str, "a string"),
    "fused": (
        lambda v: isinstance(v, dict) and all(_str(k) and _str(t) for k, t in v.items()),
        "an object of strings",
    ),
}


def op_from_row(row: Any) -> OpInfo:
    """Build an OpInfo from its JSON form, tolerating the tuple/list round trip, fields that
    older files lack (they get their defaults) and unknown fields (ignored). Raises RowError
    when the row is not an object, lacks a required field or holds a value of the wrong
    type."""
    if not isinstance(row, dict):
        raise RowError(f"op info is a JSON {json_kind(row)}, not an object")
    data = {}
    for f in dataclasses.fields(OpInfo):
        if f.name not in row:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RowError(f"op info lacks the field {f.name!r}")
            continue
        value = row[f.name]
        check, what = _OP_FIELDS.get(f.name, (lambda v: True, ""))
        if not check(value):
            raise RowError(
                f"op info field {f.name!r} is {json_kind(value)} {value!r:.60}, not {what}"
            )
        data[f.name] = value
    return OpInfo(**data)


_DIGEST = _list_of(is_int)


def _digest(value: Any) -> bool:
    return _DIGEST(value) and len(value) == 2


def digests_from_row(value: Any, what: str, nulls: bool = True) -> list[Digest | None]:
    """A JSON list of digests ``[[lo, hi] | null, ...]`` as a list of tuples (RowError if it
    is anything else)."""
    check = _or_null(_digest) if nulls else _digest
    if not isinstance(value, list) or not all(check(d) for d in value):
        raise RowError(
            f"{what} is {json_kind(value)} {value!r:.60}, not a list of [lo, hi] digests"
            + (" or null" if nulls else "")
        )
    return [tuple(d) if d is not None else None for d in value]


def event_from_row(
    seq: Any, op_id: Any, call: Any, digests: Any, inputs: Any, shapes: Any
) -> Event:
    """Build an Event from its stored columns (digests, inputs and shapes already parsed from
    JSON); RowError if a column has the wrong type."""
    for name, value in (("seq", seq), ("op_id", op_id), ("call", call)):
        if not is_int(value):
            raise RowError(f"event {name} is {json_kind(value)} {value!r:.60}, not an integer")
    where = f"event seq {seq}"
    if shapes is not None and not _list_of(_or_null(_SHAPE))(shapes):
        raise RowError(
            f"{where}: shapes is {json_kind(shapes)} {shapes!r:.60}, not a list of shapes"
        )
    return Event(
        seq=seq,
        op_id=op_id,
        call=call,
        digests=digests_from_row(digests, f"{where}: digests"),
        inputs=None if inputs is None else digests_from_row(inputs, f"{where}: inputs"),
        shapes=shapes,
    )


def reruns_from_row(value: Any, seq: int) -> list[list[Digest | None]]:
    """The extra executions' digests of one event (JSON list of digest lists)."""
    if not isinstance(value, list):
        raise RowError(f"reruns of event seq {seq} is {json_kind(value)}, not a list")
    return [digests_from_row(row, f"reruns of event seq {seq}") for row in value]
