"""What in a tf.data pipeline can make its elements differ from run to run, read from the
dataset an iterator is made from in a block.

An input pipeline that differs is seen where the step reads it (``IteratorGetNext``), and the
report used to list every possible cause (probe round 33, finding 3). The dataset that an
iterator is bound to (``MakeIterator``) says which of them it holds: its parallel stages'
``deterministic`` setting, its shuffles' seeds, its options, the ops of its functions. They
are kept on the iterator's ``MakeIterator`` op (``OpInfo.attrs[DATASET_STAGES]``) and named
with the source.

The dataset is read as the Python object tf.data's iterator constructor holds while it binds
the iterator, found by its variant tensor, not serialized: a dataset's graph holds its data
(``from_tensor_slices`` of a 200 MB array serialized to 200 MB in 0.6 s).
"""

from __future__ import annotations

import sys
from typing import Any

from nddebug.recording import STATELESS_RANDOM, WRITER, unseen_op_type
from nddebug.tracer import opaque

#: Python code a dataset function runs (Dataset.from_generator, tf.py_function, numpy_function).
_PYTHON = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
#: The attributes of tf.data's dataset classes that hold a function they run per element.
_FUNCTIONS = (
    "_map_func",
    "_predicate",
    "_scan_func",
    "_reduce_func",
    "_key_func",
    "_init_func",
    "_finalize_func",
    "_window_size_func",
)
#: What a parallel stage's class name says it was made by.
_METHODS = (("Interleave", "interleave"), ("Filter", "filter"), ("Map", "map"), ("Batch", "batch"))


#: Dataset classes whose every way of making elements differ :func:`dataset_stages` reads
#: (their attributes, the ops of their functions): a pipeline of these alone, with no stage
#: named, makes the same elements from the same values. Any other (a parallel interleave keeps
#: ``deterministic`` only in its op, ``sample_from_datasets`` draws, a flat_map's function
#: builds datasets of its own) leaves the question open.
_READ_THROUGH = frozenset(
    {
        "TensorSliceDataset",
        "TensorDataset",
        "RangeDataset",
        "BatchDataset",
        "PaddedBatchDataset",
        "ParallelBatchDataset",
        "UnbatchDataset",
        "MapDataset",
        "ParallelMapDataset",
        "FilterDataset",
        "ShuffleDataset",
        "RepeatDataset",
        "TakeDataset",
        "SkipDataset",
        "CacheDataset",
        "PrefetchDataset",
        "ZipDataset",
        "ConcatenateDataset",
        "OptionsDataset",
        "RestructuredDataset",
        "AssertCardinalityDataset",
    }
)


def read_through(dataset: Any) -> bool:
    """Whether :func:`dataset_stages` sees every way ``dataset`` could make its elements differ
    (see ``_READ_THROUGH``): [] from it then means none is there. Not where a function of it
    draws with stateless random ops: whether their seeds differ between runs cannot be read
    (an unseeded Keras ``RandomFlip`` in a map was said to hold "no random op", probe round
    44, F1)."""
    tree = _tree(dataset)
    if not all(type(d).__name__.lstrip("_") in _READ_THROUGH for d in tree):
        return False
    return not any(t.startswith(STATELESS_RANDOM) for d in tree for t in _function_ops(d))


def _function_ops(dataset: Any) -> set[str]:
    """The op types the functions of one dataset stage run (see ``opaque.ops_inside``)."""
    found: set[str] = set()
    for attr in _FUNCTIONS:
        fn = getattr(getattr(dataset, attr, None), "function", None)
        if fn is not None:
            found.update(opaque.ops_inside(fn.name, fn.graph))
    return found


def dataset_of(variant: Any, depth: int = 30) -> Any:
    """The ``tf.data.Dataset`` whose variant tensor is ``variant``, from the frames of the code
    that is binding an iterator to it (tf.data's iterator holds it in a local); None."""
    from tensorflow.python.data.ops import dataset_ops

    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        for value in frame.f_locals.values():
            # Not ._variant_tensor: a dataset being constructed has none yet (a frame of its
            # __init__ holds it as self), and reading it raised out of the op's instrumentation.
            if (
                isinstance(value, dataset_ops.DatasetV2)
                and getattr(value, "_variant_tensor_attr", None) is variant
            ):
                return value
        frame = frame.f_back
    return None


def iterator_dataset(handle_id: int, depth: int = 30) -> Any:
    """The ``tf.data.Dataset`` a tf.data iterator reads, from the frames of the code reading
    it: the iterator whose resource handle has ``_id`` ``handle_id`` keeps the dataset it was
    made from (``OwnedIterator._dataset``). For an iterator made before the block, whose
    binding nddebug did not see; None where no such frame is found."""
    from tensorflow.python.data.ops import iterator_ops

    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        it = frame.f_locals.get("self")
        if isinstance(it, iterator_ops.OwnedIterator):
            handle = getattr(it, "_iterator_resource", None)
            if getattr(handle, "_id", None) == handle_id:
                return getattr(it, "_dataset", None)
        frame = frame.f_back
    return None


def _deterministic(dataset: Any) -> str:
    """A parallel stage's ``deterministic`` setting: from the Python object, or, where it
    keeps it only in its op (a parallel interleave), from that op in a graph (a dataset
    built inside a tf.function; an eager dataset's op is gone)."""
    value = getattr(dataset, "_deterministic", None)
    if value is None:
        op = getattr(getattr(dataset, "_variant_tensor_attr", None), "op", None)
        try:
            value = op.get_attr("deterministic") if op is not None else None
        except Exception:  # noqa: BLE001 - an op without the attribute, or no graph op
            value = None
    return value.decode() if isinstance(value, bytes) else str(value or "")


def dataset_stages(dataset: Any) -> list[str]:
    """The stages of a ``tf.data.Dataset`` (with those it is built on) that can make its
    elements differ between runs, one sentence each ([] where none)."""
    found: list[str] = []

    def say(text: str) -> None:
        if text not in found:
            found.append(text)

    tree = _tree(dataset)
    parallel = any("Parallel" in type(d).__name__ for d in tree)
    try:
        # Only parallel stages hand out elements as their work finishes.
        if parallel and dataset.options().deterministic is False:
            say(
                "tf.data.Options().deterministic = False: every parallel stage hands out "
                "elements in the order their work finishes"
            )
    except Exception:  # noqa: BLE001 - options that cannot be read: not named
        pass
    inside: set[str] = set()
    for d in tree:
        name = type(d).__name__.lstrip("_")
        if _deterministic(d) == "false":
            method = next((m for key, m in _METHODS if key in name), "map")
            say(
                f"Dataset.{method}(num_parallel_calls=..., deterministic=False) ({name}): its "
                "elements come out in the order their work finishes"
            )
        if "Shuffle" in name and _unseeded(d):
            say(
                f"Dataset.shuffle with no seed and no tf.random.set_seed ({name}): a new order "
                "in every run"
            )
        if name == "RandomDataset" and _unseeded(d):
            say(
                "Dataset.random() with no seed and no tf.random.set_seed (RandomDataset, also "
                "behind an unseeded sample_from_datasets or choose_from_datasets): other "
                "numbers in every run"
            )
        here = _function_ops(d)
        inside |= here
        seeded = sorted({t.split("(")[0] for t in here if t.endswith("(random)")})
        if seeded and "Parallel" in name:
            say(
                f"seeded random op(s) in a parallel stage's function ({', '.join(seeded)} in "
                f"{name}): its parallel calls share each op's one random state, so which "
                "element gets which draw follows the order the threads run in"
            )
        writes = sorted({t for t in map(unseen_op_type, here) if WRITER.match(t)})
        if writes and "Parallel" in name:
            # A shared counter, or a seeded Keras random layer's SeedGenerator, which every
            # call advances (probe round 44, F1: three processes, three weights).
            say(
                f"a parallel stage's function updates a variable ({', '.join(writes)} in "
                f"{name}): its parallel calls read and update it in the order the threads "
                "run in (a seeded Keras random layer's SeedGenerator advances so)"
            )
    if any(t in _PYTHON for t in inside):
        say(
            "Python code the pipeline runs (Dataset.from_generator, or tf.py_function / "
            "tf.numpy_function in a map): whatever varies in it (unseeded random, set or dict "
            "order, the clock, files listed unsorted) makes the data differ"
        )
    unseeded = sorted({t.split("(")[0] for t in inside if t.endswith("(unseeded)")})
    if unseeded:
        say(
            f"unseeded random op(s) in a dataset function ({', '.join(unseeded)}): they "
            "draw other numbers in every run"
        )
    return found


def reshuffles(dataset: Any) -> dict[str, Any]:
    """The seeded shuffles of ``dataset`` (with those it is built on) that reshuffle on every
    pass (``reshuffle_each_iteration=True``, the default), made eagerly: pass k has the same
    order in every fresh process, but each new iterator over the same dataset object is the
    next pass, so passes repeated in one process differ by design. A shuffle made inside a
    tf.function is made anew by every call, and starts with the same pass.
    As ``recording.DATASET_PASSES`` keeps it: {"dataset": the first such shuffle's eager
    identity, "shuffles": one sentence each}, or {} where there is none."""
    found, first = [], ""
    # Below a cache() the first pass is kept and replayed: its shuffles do not reshuffle.
    for d in _tree(dataset, below=lambda d: "Cache" not in type(d).__name__):
        name = type(d).__name__.lstrip("_")
        if "Shuffle" in name and not _unseeded(d) and getattr(d, "_reshuffle_each_iteration", 0):
            variant = getattr(d, "_variant_tensor", None)
            if getattr(variant, "_id", None) is None or hasattr(variant, "op"):
                continue  # a graph tensor: made anew by every call
            first = first or f"eager:{variant._id}"
            found.append(
                f"Dataset.shuffle(seed=...) ({name}) with reshuffle_each_iteration=True, the "
                "default"
            )
    return {"dataset": first, "shuffles": found} if found else {}


def _tree(dataset: Any, below: Any = None) -> list[Any]:
    """``dataset`` and every dataset it is built on (its inputs, theirs, ...); with
    ``below``, only the inputs of the datasets for which ``below(dataset)`` is true."""
    out: list[Any] = []
    seen: set[int] = set()
    todo = [dataset]
    while todo:
        d = todo.pop()
        if id(d) in seen:
            continue
        seen.add(id(d))
        out.append(d)
        if below is not None and not below(d):
            continue
        try:
            todo += list(d._inputs())
        except Exception:  # noqa: BLE001 - a dataset class that cannot list its inputs
            pass
    return out


def _unseeded(dataset: Any) -> bool:
    """Whether a shuffle's (or Dataset.random()'s) seeds are both 0 (no seed anywhere:
    tf.data then picks one at random when an iterator is made)."""
    try:
        seeds = [int(dataset._seed), int(dataset._seed2)]
    except Exception:  # noqa: BLE001 - seeds that are not readable numbers: not named
        return False
    return seeds == [0, 0]
