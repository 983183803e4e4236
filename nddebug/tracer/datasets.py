"""What in a tf.data pipeline can make its elements differ from run to run, read from the
dataset's own graph when an iterator is made from it in a block.

An input pipeline that differs is seen where the step reads it (``IteratorGetNext``), and the
report used to list every possible cause (probe round 33, finding 3). The dataset an iterator
is bound to (``MakeIterator``'s input) serializes to a GraphDef with its functions: the stages
that make elements differ are there, with their attributes. They are kept on the iterator's
``MakeIterator`` op (``OpInfo.attrs[DATASET_STAGES]``) and named with the source.
"""

from __future__ import annotations

from typing import Any

from nddebug.recording import RANDOM_OPS
from nddebug.tracer.registry import inside_nddebug

#: Parallel stages with a ``deterministic`` attribute: which Dataset method makes each.
_PARALLEL = {
    "ParallelMapDataset": "map",
    "ParallelMapDatasetV2": "map",
    "ParallelInterleaveDatasetV2": "interleave",
    "ParallelInterleaveDatasetV3": "interleave",
    "ParallelInterleaveDatasetV4": "interleave",
    "ParallelBatchDataset": "batch",
    "ParallelFilterDataset": "filter",
    "MapAndBatchDataset": "map and batch",
}
#: Shuffles, and the positions of their seed and seed2 inputs.
_SHUFFLES = {
    "ShuffleDataset": (2, 3),
    "ShuffleDatasetV2": None,  # a seed generator resource only: not readable here
    "ShuffleDatasetV3": (2, 3),
    "ShuffleAndRepeatDataset": (2, 3),
    "ShuffleAndRepeatDatasetV2": (2, 3),
}
_PYTHON = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


def dataset_stages(variant: Any) -> list[str]:
    """The stages of the dataset behind an eager dataset variant tensor that can make its
    elements differ between runs, one sentence each ([] where none, or the dataset cannot
    be serialized)."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    try:
        with inside_nddebug():  # nddebug's own op: not one of the block's
            serialized = tf.raw_ops.DatasetToGraphV2(
                input_dataset=variant, external_state_policy=1, strip_device_assignment=True
            ).numpy()
        graph = graph_pb2.GraphDef()
        graph.ParseFromString(serialized)
    except Exception:  # noqa: BLE001 - a dataset TF cannot serialize: nothing named
        return []
    return stages_of(graph)


def stages_of(graph: Any) -> list[str]:
    """:func:`dataset_stages` over a dataset's GraphDef."""
    consts = {n.name: n for n in graph.node if n.op == "Const"}
    found: list[str] = []

    def say(text: str) -> None:
        if text not in found:
            found.append(text)

    for node in graph.node:
        if node.op in _PARALLEL and node.attr["deterministic"].s == b"false":
            say(
                f"Dataset.{_PARALLEL[node.op]}(num_parallel_calls=..., deterministic=False) "
                f"({node.op}): its elements come out in the order their work finishes"
            )
        elif node.op == "OptionsDataset" and _options_nondeterministic(node):
            say(
                "tf.data.Options().deterministic = False: every parallel stage hands out "
                "elements in the order their work finishes"
            )
        elif node.op in _SHUFFLES and _unseeded(node, _SHUFFLES[node.op], consts):
            say(
                f"Dataset.shuffle with no seed and no tf.random.set_seed ({node.op}): a new "
                "order in every run"
            )
    functions = list(graph.library.function)
    if any(n.op in _PYTHON for f in functions for n in f.node_def):
        say(
            "Python code the pipeline runs (Dataset.from_generator, or tf.py_function / "
            "tf.numpy_function in a map): whatever varies in it (unseeded random, set or dict "
            "order, the clock, files listed unsorted) makes the data differ"
        )
    unseeded = sorted(
        {
            n.op
            for f in functions
            for n in f.node_def
            if n.op in RANDOM_OPS and not (n.attr["seed"].i or n.attr["seed2"].i)
        }
    )
    if unseeded:
        say(
            f"unseeded random op(s) in a dataset function ({', '.join(unseeded)}): they "
            "draw other numbers in every run"
        )
    return found


def _options_nondeterministic(node: Any) -> bool:
    try:
        from tensorflow.core.framework import dataset_options_pb2

        options = dataset_options_pb2.Options()
        options.ParseFromString(node.attr["serialized_options"].s)
    except Exception:  # noqa: BLE001 - options TF cannot parse here: not named
        return False
    return options.WhichOneof("optional_deterministic") is not None and not options.deterministic


def _unseeded(node: Any, at: tuple[int, int] | None, consts: dict[str, Any]) -> bool:
    """Whether a shuffle's seed and seed2 inputs are both the constant 0 (no seed anywhere:
    tf.data then picks one at random when the iterator is made)."""
    if at is None or len(node.input) <= max(at):
        return False
    values = []
    for i in at:
        const = consts.get(node.input[i].split(":")[0].lstrip("^"))
        if const is None:
            return False
        tensor = const.attr["value"].tensor
        values.append(tensor.int64_val[0] if tensor.int64_val else None)
    return values == [0, 0]
