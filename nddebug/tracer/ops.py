"""What the tracer needs to know about an op: which ops pass bytes through, which write
variables, which call functions, and small readers for TensorFlow's attribute forms."""

from __future__ import annotations

import functools
import re
from typing import Any

from nddebug import digest as dg
from nddebug.recording import (  # noqa: F401 - FUNCTION_CALL, UID_SUFFIX: used from here too
    CALL_OPS,
    FUNCTION_CALL,
    RERUN_INNER,
    UID_SUFFIX,
    WRITER,
    Recording,
    function_name,
)
from nddebug.replicas import COLLECTIVE_OP_TYPES

# Ops whose outputs are their inputs' bytes: not digested again (the digest is over bytes).
ALIAS_OPS = {
    "Identity": None,  # output i <- input i
    "IdentityN": None,
    "Snapshot": None,
    "StopGradient": None,
    "PreventGradient": None,
    "EnsureShape": None,
    "Bitcast": None,
    "Reshape": 0,  # output 0 <- input 0 (other inputs are shapes/axes)
    # TF1 control flow's Switch: either output is its data input (the other is dead). Its
    # own record would read both and never run, nor the records reading its digest.
    "Switch": 0,
    "RefSwitch": 0,
    "ExpandDims": 0,
    "Squeeze": 0,
}
# Outputs that are inputs' bytes under an attribute value: output position -> the input it
# copies (None: an empty output). FusedBatchNorm in inference (is_training=False) hands back
# its mean and variance inputs as batch_mean, batch_variance and reserve_space_1/2, and an
# empty reserve_space_3 (measured, TF 2.21 CPU: bitwise equal, in eager and graph calls).
# Digested there, they were readers that stopped grappler's Conv2D + FusedBatchNorm fusion,
# which needs them unread: the traced step computed other bits than the plain one.
_FBN_COPIES = {1: 3, 2: 4, 3: 3, 4: 4}
INPUT_COPIES: dict[str, tuple[tuple[str, Any], dict[int, int | None]]] = {
    "FusedBatchNorm": (("is_training", False), _FBN_COPIES),
    "FusedBatchNormV2": (("is_training", False), _FBN_COPIES),
    "FusedBatchNormV3": (("is_training", False), {**_FBN_COPIES, 5: None}),
}


def input_copies(op_type: str, attrs: Any) -> dict[int, int | None]:
    """The outputs of an op that copy one of its inputs with these attributes (see
    INPUT_COPIES): output position -> input position (None: empty); {} for none."""
    entry = INPUT_COPIES.get(op_type)
    if entry is None:
        return {}
    (name, want), copies = entry
    return copies if attr_value(attr(attrs, name)) == want else {}


#: Ops whose output only moves the bytes of their inputs, keeping every one (no arithmetic,
#: nothing dropped): equal inputs give an equal output on any kernel, and unequal inputs an
#: unequal one. Their output's digest is derived from their inputs' (instrument.derived_digest)
#: instead of read: a ResNet-like step's BatchNorm gradients Tile 136 of the 600 MB it
#: digests a step. (Reshape, Identity and the like pass their input's digest on as it is.)
#: Not here: Slice, Gather and the like drop elements, so unequal inputs can give an equal
#: output.
BYTE_MOVERS = frozenset(
    {
        "Tile",
        "BroadcastTo",
        "Transpose",
        "ConcatV2",
        "Pack",
        "Pad",
        "PadV2",
        "MirrorPad",
        "ReverseV2",
        "SpaceToDepth",
        "DepthToSpace",
    }
)

# Ops with nothing to digest. A Python function's call (tf.py_function, tf.numpy_function:
# EagerPyFunc, PyFunc) is an op like any other, eagerly and in graphs: what the Python code
# returned (NumPy's random, the clock, a file) is compared through its outputs, so a call
# that returns other values for the same inputs is the source.
SKIP_OPS = {"NoOp"}
# WRITER (recording.py): ops that write a resource variable (input 0); the value written is
# read back and digested.
# Ops that route a resource handle (TF1 control flow, identities): they hand the handle on and
# neither read nor change the state behind it.
HANDLE_ROUTING = frozenset(
    {"Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
     "NextIteration", "RefNextIteration", "Identity", "IdentityN", "RefIdentity"}
)  # fmt: skip
# UID_SUFFIX, FUNCTION_CALL and function_name (recording.py): a traced function's name.
# Name scopes get "_1", "_2" … when a model, layer or function is built again (retrace, a new
# process, a second model); keys drop them and tell real duplicates apart by creation order.
# Keras numbers its own names too (a second model's optimizer is "sgd_1"), and TensorFlow then
# uniquifies the scope ("sgd_1_1"): every trailing number goes, or two identical runs in one
# process had no op in common and were "NOT reproducible".
UID_IN_NAME = re.compile(r"(?:_\d+)+(?=/|$)")


def callees(node: Any) -> list[str]:
    """The functions a FunctionDef node calls: its function attributes (a call's ``f``,
    branches, loop bodies, lists of them) and, for an op type that is no op, the function it
    calls by its own name."""
    found = [v.func.name for v in node.attr.values() if v.HasField("func")]
    found += [f.name for v in node.attr.values() if v.HasField("list") for f in v.list.func]
    if op_def(node.op) is None:
        found.append(node.op)
    return found


def xla_must_compile(fdef: Any) -> bool:
    """Whether a FunctionDef is compiled by XLA as a whole (``jit_compile=True``)."""
    return "_XlaMustCompile" in fdef.attr and fdef.attr["_XlaMustCompile"].b


def as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def attr(attrs: Any, name: str) -> Any:
    """An attribute from the op callback's attrs (a flat name/value tuple, or a dict)."""
    if not attrs:
        return None
    items = attrs.items() if isinstance(attrs, dict) else zip(attrs[::2], attrs[1::2], strict=False)
    for k, v in items:
        if k == name:
            return v
    return None


def attr_value(v: Any) -> Any:
    """An attribute value from an op callback (an AttrValue, or a plain value)."""
    which = getattr(v, "WhichOneof", None)
    if which is None:
        return v
    kind = which("value")
    return getattr(v, kind) if kind else None


def dtype_attr(attrs: Any) -> Any:
    import tensorflow as tf

    value = attr(attrs, "T")
    if value is None:
        value = attr(attrs, "dtype")
    if value is None:
        return None
    return tf.as_dtype(getattr(value, "type", value))


def op_def(op_type: str) -> Any:
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op_type)


def written_value(op_type: str, inputs: Any) -> Any:
    """A plain assignment writes exactly its value input's bits: that is the value after it."""
    return inputs[1] if op_type == "AssignVariableOp" and len(inputs) > 1 else None


def reads_or_writes_variable(op_type: str) -> bool:
    return op_type == "ReadVariableOp" or bool(WRITER.match(op_type))


def state_input(op_type: str, inputs: Any) -> Any:
    """The state an op reads or writes besides its tensor inputs: its first resource-handle
    input (a variable, a lookup table, a queue, an iterator, a random generator), or None.

    Such state is not digested where it is read, so "identical inputs" does not cover it:
    the op is linked to the other ops on the same resource (OpInfo.resource), and a read
    after a divergent write of it carries that write's difference on (an embedding's
    ResourceGather in the loop step after a divergent scatter update; a table lookup after
    a divergent insert). Function calls, loops and branches hand their resources on to the
    ops inside; a collective's ordering token only orders collectives."""
    if op_type in CALL_OPS or FUNCTION_CALL.match(op_type) or op_type in COLLECTIVE_OP_TYPES:
        return None
    if op_type in HANDLE_ROUTING:
        return None  # it passes the handle on (a TF1 cond's Switch), not what is behind it
    for t in inputs or ():
        if _is_resource(t):
            return t
    return None


def _is_resource(t: Any) -> bool:
    return getattr(getattr(t, "dtype", None), "name", "") == "resource"


def eager_identity(handle: Any) -> str:
    """The identity of the state behind an eager resource handle (a variable's, a table's),
    as OpInfo.resource names it: the same for every op, graph and call that uses it."""
    return f"eager:{getattr(handle, '_id', '?')}"


#: Sums whose kernel takes over the buffer of a term nothing else holds and adds the others
#: to it, in an order set by which term that is (the first free one is moved to the front).
SUMS_IN_PLACE = frozenset({"AddN", "AccumulateNV2"})
#: OpInfo.rerun of such a sum of three or more terms (two add alike in either order).
RERUN_SUMS = (
    "a sum of three or more terms, added in an order set by which term's buffer is free when "
    "it runs: a copy cannot add them as the original does"
)


def sums_in_place(op_type: str, n_inputs: int) -> bool:
    """Whether the op sums three or more terms in place (two add alike in either order)."""
    return op_type in SUMS_IN_PLACE and n_inputs >= 3


def rerun_blocker(
    op_type: str, stateful: bool, n_inputs: int, out_digests: list[Any], writes: bool
) -> str:
    """Why an op is not re-executed in rerun mode ("" if it is): running a stateful op again
    would change the state the step goes on with (a random generator, a variable, an
    iterator), so only repeated steps can compare those."""
    if stateful or writes:
        return "stateful"
    if op_type in CALL_OPS or FUNCTION_CALL.match(op_type):
        return RERUN_INNER
    if sums_in_place(op_type, n_inputs):
        return RERUN_SUMS
    if not n_inputs:
        return "no inputs"
    if not any(d is not None for d in out_digests):
        return "no readable output"
    return ""


def interesting_attrs(attrs: Any) -> dict[str, Any]:
    out = {}
    for name in ("seed", "seed2"):
        v = attr(attrs, name)
        if v is not None:
            out[name] = int(getattr(v, "i", v))
    return out


#: Attributes that are not part of what an op computes on its inputs: a random op's seeds (a
#: seed that differs makes the op the source, as it should), names and keys that are new in
#: every run or process (a variable's shared_name, a collective's instance key, a Send's
#: incarnation), and how a call is run.
NOT_FORM = frozenset(
    {"seed", "seed2", "shared_name", "container", "debug_name", "_class", "config_proto",
     "executor_type", "instance_key", "group_key", "send_device_incarnation"}
)  # fmt: skip


def _form_text(value: Any) -> str | None:
    """An attribute value as text, if it is one Python hands an op as a value: a number, a
    flag, a dtype, a shape, or a list of them (eager callbacks give Python values, graph ones
    AttrValue protos). Strings, functions and tensors: None (they hold names TensorFlow makes
    anew in every run: a dataset op's function and metadata, a resource's name)."""
    if type(value).__name__ == "TensorShapeProto":  # TF1 get_attr("shape")
        return f"shape:{value}"
    if type(value).__name__ == "AttrValue":
        kind = value.WhichOneof("value")
        if kind in ("i", "f", "b", "type", "shape"):
            return f"{kind}:{getattr(value, kind)}"
        if kind == "list":
            items = value.list
            if items.s or items.func or items.tensor:
                return None
            return f"list:{items}"
        return None
    if hasattr(value, "DESCRIPTOR"):  # another proto: a function, a tensor
        return None
    if isinstance(value, (list, tuple)):
        texts = [_form_text(v) for v in value]
        return None if None in texts else f"[{','.join(texts)}]"  # type: ignore[arg-type]
    if isinstance(value, (bool, int, float)) or type(value).__name__ in ("DType", "TensorShape"):
        return repr(value)
    return None


def attrs_form(attrs: Any) -> str:
    """An op's attributes that are values (see :func:`_form_text`), as one sorted text: part
    of what the op computes on, like its inputs. ``alpha=0.2`` in one run and ``0.3`` in the
    next made identical tensor inputs give other outputs, and the op was named a source,
    "the kernel itself is non-deterministic"."""
    if not attrs:
        return ""
    items = attrs.items() if isinstance(attrs, dict) else zip(attrs[::2], attrs[1::2], strict=False)
    parts = []
    for name, value in items:
        name = as_str(name)
        if name in NOT_FORM:
            continue
        try:
            text = _form_text(value)
        except Exception:  # noqa: BLE001 - a form it cannot read compares as absent
            text = None
        if text is not None:
            parts.append(f"{name}={text}")
    return ";".join(sorted(parts))


def form_code(text: str) -> str:
    """A short stable code of a text (an op's form), the same in every process."""
    import hashlib

    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def kept_value(value: Any) -> Any:
    """An output's value as a recording keeps it to measure a difference (a NumPy array), or
    None for strings: their difference has no size, and a file stores no Python objects."""
    import numpy as np

    array = np.array(value)
    return None if dg.is_strings(array) else array


def warn_once(recording: Recording, message: str) -> None:
    if message not in recording.warnings:
        recording.warnings.append(message)


@functools.cache
def default_device() -> str:
    """Where ops without outputs ran: TensorFlow's first device (a GPU when there is one)."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return (gpus[0] if gpus else tf.config.list_logical_devices("CPU")[0]).name
