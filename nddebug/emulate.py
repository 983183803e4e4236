"""Emulate GPU atomics on the CPU: "will this training be reproducible on the GPU, and does my
fix cover it?" answered on a laptop.

Under :func:`emulate_gpu`, the op types that the knowledge base lists as non-deterministic on
GPU compute the same mathematics with a floating-point accumulation order that changes from
execution to execution, which is what CUDA ``atomicAdd`` does. Each op is rebuilt, when a
``tf.function`` graph is traced, as the same op applied to two random halves of the input it
is linear in: ``op(x*m) + op(x*(1-m))`` with a fresh random 0/1 mask ``m`` per execution. Every
term of the sum is in exactly one half, so the result is the true sum grouped differently:
correct within rounding, different in the last bits. The determinism switches act as on a GPU,
from the knowledge base: with ``enable_op_determinism()`` (or ``TF_DETERMINISTIC_OPS=1``) the
ops TensorFlow fixed run for real, the ops it only guards raise ``UnimplementedError`` with
TensorFlow's message and nddebug's advice, and the others stay emulated.

The tracer is not told which ops were emulated: it sees the op with its original inputs and the
emulated outputs, so the emulated culprits are found by measurement like any other. Only graphs
(``tf.function``, Keras ``fit``/``train_on_batch``) can be emulated: TensorFlow ignores what an
op callback returns for an eager op, so eager ops run unchanged, with a warning.

What an emulated finding means: the op *could* diverge on a GPU, when the GPU runs a
non-deterministic kernel for it. Whether it does depends on the shapes, the GPU and the library
versions: on an H100 the seed-000 CNN's Conv2DBackpropInput was deterministic (cuDNN chose a
deterministic kernel) while a ResNet-like model's was not. :data:`FINDING` says so in words;
``emulated_op_types()`` shows, per op, what a real GPU measurement found.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import random
import re
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from nddebug import knowledge
from nddebug.graph_memo import GraphMemo
from nddebug.switch import Switch

if TYPE_CHECKING:
    import pandas

__all__ = ["FINDING", "RECIPES", "Recipe", "emulate_gpu", "emulated_op_types", "is_active"]

#: How to present an op found under emulation: a possibility, not a measurement of a GPU.
FINDING = (
    "could diverge on a GPU when the non-deterministic kernel is chosen (emulated on the CPU: "
    "whether a GPU chooses it depends on the shapes, the GPU and the cuDNN/TF versions)"
)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How one op type is rebuilt with a per-execution accumulation order.

    ``method`` is one of:

    - ``"split"``: ``op(x·m) + op(x·(1−m))``; the op is linear in input ``index``.
    - ``"product"``: ``op(x^m) · op(x^(1−m))`` (the other half filled with ones).
    - ``"chain"``: ``op(op(t, i, u·m), i, u·(1−m))`` for accumulating ops such as
      ``TensorScatterAdd``.
    - ``"state"``: a variable update: the op applies ``u·m``, a second op right after it
      applies the rest (``ResourceScatterAdd`` and friends).
    """

    method: str
    index: int
    input_name: str
    linear_outputs: int | None = None  # leading outputs that are linear (None: all)
    note: str = ""


def _r(method: str, index: int, name: str, **kw: Any) -> Recipe:
    return Recipe(method, index, name, **kw)


#: op type -> recipe. Which of these are emulated, and how they behave under op determinism,
#: comes from the knowledge base's GPU entries.
RECIPES: dict[str, Recipe] = {
    "BiasAddGrad": _r("split", 0, "out_backprop"),
    "Conv2DBackpropFilter": _r("split", 2, "out_backprop"),
    "Conv2DBackpropInput": _r("split", 2, "out_backprop"),
    "Conv3DBackpropFilter": _r("split", 2, "out_backprop"),
    "Conv3DBackpropFilterV2": _r("split", 2, "out_backprop"),
    "Conv3DBackpropInput": _r("split", 2, "out_backprop"),
    "Conv3DBackpropInputV2": _r("split", 2, "out_backprop"),
    "DepthwiseConv2dNativeBackpropFilter": _r("split", 2, "out_backprop"),
    "MaxPoolGrad": _r("split", 2, "grad"),
    "MaxPoolGradV2": _r("split", 2, "grad"),
    "MaxPool3DGrad": _r("split", 2, "grad"),
    "ResizeBilinearGrad": _r("split", 0, "grads"),
    "ResizeNearestNeighborGrad": _r("split", 0, "grads"),
    "CropAndResizeGradImage": _r("split", 0, "grads"),
    "CropAndResizeGradBoxes": _r("split", 0, "grads"),
    "SegmentSum": _r("split", 0, "data"),
    "SegmentMean": _r("split", 0, "data"),
    "UnsortedSegmentSum": _r("split", 0, "data"),
    "SegmentProd": _r("product", 0, "data"),
    "UnsortedSegmentProd": _r("product", 0, "data"),
    "ScatterNd": _r("split", 1, "updates"),
    "TensorScatterAdd": _r("chain", 2, "updates"),
    "TensorScatterSub": _r("chain", 2, "updates"),
    "ScatterNdNonAliasingAdd": _r("chain", 2, "updates"),
    "ResourceScatterNdAdd": _r("state", 2, "updates"),
    "ResourceScatterNdSub": _r("state", 2, "updates"),
    "ResourceScatterAdd": _r("state", 2, "updates"),
    "ResourceScatterSub": _r("state", 2, "updates"),
    "ResourceScatterMul": _r("state", 2, "updates"),
    "ResourceScatterDiv": _r("state", 2, "updates"),
    "SparseTensorDenseMatMul": _r("split", 1, "a_values"),
    "Bincount": _r("split", 2, "weights", note="only with non-empty float weights"),
    "DenseBincount": _r("split", 2, "weights", note="only with non-empty float weights"),
    "AdjustContrastv2": _r("split", 0, "images"),
    "FakeQuantWithMinMaxVarsGradient": _r("split", 0, "gradients"),
    "FakeQuantWithMinMaxVarsPerChannelGradient": _r("split", 0, "gradients"),
    "FusedBatchNormGrad": _r(
        "split", 0, "y_backprop", linear_outputs=3, note="only with is_training=False"
    ),
    "FusedBatchNormGradV2": _r(
        "split", 0, "y_backprop", linear_outputs=3, note="only with is_training=False"
    ),
    "FusedBatchNormGradV3": _r(
        "split", 0, "y_backprop", linear_outputs=3, note="only with is_training=False"
    ),
}

#: Why a GPU culprit of the knowledge base has no recipe.
NOT_EMULATED: dict[str, str] = {
    "Conv2D": "cuDNN algorithm choice by autotuning (per process, not per execution)",
    "Conv3D": "cuDNN algorithm choice by autotuning (per process, not per execution)",
    "ScatterNdAdd": "TF1 reference-variable op",
    "ScatterNdSub": "TF1 reference-variable op",
    "ScatterNdUpdate": "TF1 reference-variable op",
    **dict.fromkeys(
        [f"Scatter{name}" for name in ("Update", "Add", "Sub", "Mul", "Div", "Min", "Max")],
        "TF1 reference-variable op",
    ),
    "DepthwiseConv2dNativeBackpropInput": (
        "only cuDNN's path (one input channel) can vary, and it was not yet measured on a GPU"
    ),
    "ResourceScatterNdUpdate": "racing writes (which duplicate wins), not a sum",
    "TensorScatterUpdate": "racing writes (which duplicate wins), not a sum",
    "ResourceScatterUpdate": "racing writes (which duplicate wins), not a sum",
    "ResourceScatterMin": "min is exact in any order",
    "ResourceScatterMax": "max is exact in any order",
    "SoftmaxCrossEntropyWithLogits": "fused non-linear reduction",
    "SparseSoftmaxCrossEntropyWithLogits": "fused non-linear reduction",
    "AdjustContrast": "removed from TensorFlow (use AdjustContrastv2)",
    "CTCLossV2": "cuDNN kernel",
    "DebugNumericSummaryV2": "debugging op",
    "XlaLaunch": "XLA cluster",
    "XlaLaunchV2": "XLA cluster",
    "_XlaCompile": "XLA cluster",
    "_XlaRun": "XLA cluster",
}

#: TensorFlow's own UnimplementedError texts for the GPU kernels it only guards (TF 2.21
#: kernel sources). Ops not listed get the most common form of the message.
TF_MESSAGES: dict[str, str] = {
    "ResizeNearestNeighborGrad": (
        "A deterministic GPU implementation of ResizeNearestNeighborGrad is not currently "
        "available."
    ),
    "SparseTensorDenseMatMul": (
        "A deterministic GPU implementation of SparseTensorDenseMatmulOp is not currently "
        "available."
    ),
    "CropAndResizeGradImage": (
        "Deterministic GPU implementation of CropAndResizeBackpropImage not available."
    ),
    "CropAndResizeGradBoxes": (
        "Deterministic GPU implementation of CropAndResizeBackpropBoxes not available."
    ),
    "Bincount": "Determinism is not yet supported in GPU implementation of Bincount.",
    "DenseBincount": "Determinism is not yet supported in GPU implementation of DenseBincount.",
    "AdjustContrast": (
        "A deterministic GPU implementation of AdjustContrast is not currently available."
    ),
    "AdjustContrastv2": (
        "A deterministic GPU implementation of AdjustContrastv2 is not currently available."
    ),
    "FakeQuantWithMinMaxVarsGradient": (
        "Determinism is not yet supported in GPU implementation of FakeQuantWithMinMaxVarsGradient."
    ),
    "FakeQuantWithMinMaxVarsPerChannelGradient": (
        "Determinism is not yet supported in GPU implementation of "
        "FakeQuantWithMinMaxVarsPerChannelGradient."
    ),
    "SoftmaxCrossEntropyWithLogits": (
        "The GPU implementation of SoftmaxCrossEntropyWithLogits that would have been executed "
        "is not deterministic. Note that the Python API uses an alternative, deterministic, "
        "GPU-accelerated path when determinism is enabled."
    ),
    "SparseSoftmaxCrossEntropyWithLogits": (
        "The GPU implementation of SparseSoftmaxCrossEntropyWithLogits that would have been "
        "executed is not deterministic. Note that the Python API uses an alternative, "
        "deterministic, GPU-accelerated path when determinsim is enabled."  # sic: TF's typo
    ),
    **dict.fromkeys(
        ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"),
        "A deterministic GPU implementation of fused batch-norm backprop, when training is "
        "disabled, is not currently available.",
    ),
}

# Additive identities that leave every value's bits unchanged when added elementwise:
# x + (-0.0) == x for every x (including -0.0), x - (+0.0) == x, x * 1 == x / 1 == x.
_STATE_FILL = {
    "ResourceScatterAdd": -0.0,
    "ResourceScatterSub": 0.0,
    "ResourceScatterNdAdd": -0.0,
    "ResourceScatterNdSub": 0.0,
    "ResourceScatterMul": 1.0,
    "ResourceScatterDiv": 1.0,
}
_CHAIN_FILL = {"TensorScatterAdd": -0.0, "TensorScatterSub": 0.0, "ScatterNdNonAliasingAdd": -0.0}
_UID = re.compile(r"_\d+$")


# ---------------------------------------------------------------------- knowledge base view


@functools.cache
def _gpu_culprits() -> dict[str, knowledge.Culprit]:
    """The knowledge base's GPU entries by op type: they decide what is emulated."""
    return {
        op_type: culprit
        for culprit in knowledge.culprits()
        if culprit.device == "GPU"
        for op_type in culprit.op_types
    }


def _gpu_variant(op_type: str, op: Any, inputs: Any) -> bool:
    """Whether this op instance is the one the knowledge base means (same checks as the GPU
    kernels: fused batch-norm backprop only in inference mode, bincount only with weights)."""
    if op_type.startswith("FusedBatchNormGrad"):
        return not op.get_attr("is_training")
    if op_type == "DebugNumericSummaryV2":
        return op.get_attr("tensor_debug_mode") in (3, 4)  # CONCISE_HEALTH, FULL_HEALTH
    if op_type in ("Bincount", "DenseBincount"):
        return inputs[2].shape.num_elements() != 0
    return True


def _determinism_enabled() -> bool:
    from tensorflow.python.framework import config

    return bool(config.is_op_determinism_enabled())


def _behaviour(op_type: str) -> str:
    """What this GPU culprit does now: "emulate", "real" (fixed/host under determinism),
    "raise" (TF only guards it) or "ignore" (not a GPU culprit)."""
    culprit = _gpu_culprits().get(op_type)
    if culprit is None:
        return "ignore"
    if _determinism_enabled():
        if culprit.under_determinism in ("fixed", "host"):
            return "real"
        if culprit.under_determinism == "raises":
            return "raise"
    return "emulate" if op_type in RECIPES else "ignore"


def _unimplemented(op_type: str, op_name: str) -> Exception:
    import tensorflow as tf

    message = TF_MESSAGES.get(
        op_type, f"A deterministic GPU implementation of {op_type} is not currently available."
    )
    culprit = _gpu_culprits()[op_type]
    text = (
        f"{message}\n\t [[{{{{node {op_name}}}}}]]\n"
        "(raised by nddebug.emulate_gpu(): TensorFlow raises this on a GPU when op determinism "
        "is enabled)\n"
        f"nddebug advice: {culprit.fix}"
    )
    return tf.errors.UnimplementedError(None, None, text)


# ---------------------------------------------------------------------- state


class _State(threading.local):
    def __init__(self) -> None:
        self.depth = 0


_local = _State()
_lock = threading.Lock()
_active_threads = 0
_rng = random.Random()
_warned: set[str] = set()
# A process-wide switch read by every emulated graph: a graph traced under emulate_gpu() and
# run after it computes exactly what the plain op computes.
_GATE = Switch("emulate_gpu")
_graph_gates = GraphMemo("emulation_gate")


def is_active() -> bool:
    """True inside :func:`emulate_gpu` (in this thread): recordings made now stand for a GPU."""
    return _local.depth > 0


def _set_gate(on: bool) -> None:
    with _callbacks_paused():
        _GATE.set(on)


@contextlib.contextmanager
def _callbacks_paused() -> Iterator[None]:
    """Hide nddebug's own eager ops (the gate) from op callbacks, e.g. an active trace()."""
    from tensorflow.python.eager import context

    callbacks = context.context().op_callbacks
    saved = list(callbacks)
    callbacks.clear()
    try:
        yield
    finally:
        callbacks.extend(saved)


def _graph_gate(graph: Any) -> Any:
    import tensorflow as tf
    from tensorflow.python.framework import ops as tf_ops

    if graph not in _graph_gates:
        with graph.as_default(), tf_ops.control_dependencies(None), tf.name_scope("nddebug"):
            _graph_gates[graph] = tf.cast(_GATE.read(graph), tf.bool)
    return _graph_gates[graph]


@contextlib.contextmanager
def emulate_gpu() -> Iterator[None]:
    """Run the GPU's non-deterministic kernels' accumulation order on this CPU, in graphs
    traced inside the block (see the module docstring and docs/emulation.md).

    ``with nddebug.emulate_gpu(): report = nddebug.check(step, x, y, state=model)``. Nested
    blocks are allowed. The random masks are seeded from ``os.urandom`` at entry, so separate
    processes differ, as they do on a GPU.
    """
    global _active_threads
    from tensorflow.python.eager import context
    from tensorflow.python.framework import op_callbacks

    outermost = _local.depth == 0
    if outermost:
        with _lock:
            _rng.seed(os.urandom(16))
            _active_threads += 1
            if _active_threads == 1:
                _set_gate(True)
        op_callbacks.add_op_callback(_head)
        callbacks = context.context().op_callbacks
        callbacks.remove(_head)
        callbacks.insert(0, _head)  # before nddebug's tracer, whatever the nesting order
    _local.depth += 1
    try:
        yield
    finally:
        _local.depth -= 1
        if outermost:
            if _head in context.context().op_callbacks:
                op_callbacks.remove_op_callback(_head)
            with _lock:
                _active_threads -= 1
                if _active_threads == 0:
                    _set_gate(False)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Plain ops for the block's length, inside :func:`emulate_gpu` or not: its switch off
    (graphs traced under it compute what the plain ops compute) and its op callback out of
    this thread's list (graphs traced now are not emulated).

    For the step that carries the user's training on: ``check()``'s final ordinary step ran
    emulated under ``with emulate_gpu(): check(...)`` and left other weights than a plain
    step (53 of 94 tensors of a residual CNN), where ``check(..., emulate_gpu=True)`` left
    plain ones (probe round 40). The switch is process-wide: another thread's emulated
    graphs run plain meanwhile too."""
    from tensorflow.python.eager import context

    if not is_active():
        yield
        return
    callbacks = context.context().op_callbacks
    at = callbacks.index(_head) if _head in callbacks else None
    if at is not None:
        callbacks.pop(at)
    with _lock:
        _set_gate(False)
    try:
        yield
    finally:
        with _lock:
            if _active_threads > 0:
                _set_gate(True)
        if at is not None:
            callbacks.insert(at, _head)


# ---------------------------------------------------------------------- op callbacks


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _graph_supported(graph: Any) -> bool:
    """tf.function graphs only: not TF1 graphs, not tf.data functions (they run on the host),
    not XLA clusters (a separate knowledge-base entry)."""
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    if not ops.executing_eagerly_outside_functions() or not hasattr(graph, "outer_graph"):
        return False
    name = _as_str(getattr(graph, "name", "") or "")
    if name.startswith("Dataset_") or "_Dataset_" in name:
        return False
    try:
        return not control_flow_util.GraphOrParentsInXlaContext(graph)
    except Exception:  # noqa: BLE001 - an unknown graph type is not XLA
        return True


def _head(
    op_type: Any,
    inputs: Any,
    attrs: Any,
    outputs: Any,
    op_name: str | None = None,
    graph: Any = None,
) -> Any:
    """First op callback: replaces the outputs of emulated ops (or raises for guarded ones).
    What it hands on is a list, as the op's own outputs are (see Recorder.callback)."""
    handed = _outputs_for(op_type, inputs, outputs, op_name, graph)
    return None if handed is None else list(handed)


def _outputs_for(op_type: Any, inputs: Any, outputs: Any, op_name: str | None, graph: Any) -> Any:
    """The emulated op's outputs, or ``outputs`` unchanged."""
    op_type = _as_str(op_type)
    if op_type not in _gpu_culprits():
        return outputs
    if graph is None:
        _on_eager(op_type)
        return outputs
    if not _graph_supported(graph):
        return outputs
    op = outputs[0].op if outputs else graph.get_operation_by_name(op_name)
    if "CPU" in (op.device or "").upper() or not _gpu_variant(op_type, op, inputs):
        return outputs  # placed on the host: the CPU kernel runs there on a GPU machine too
    behaviour = _behaviour(op_type)
    if behaviour == "raise":
        raise _unimplemented(op_type, op.name)
    if behaviour != "emulate":
        return outputs
    x = inputs[RECIPES[op_type].index]
    if not (x.dtype.is_floating or x.dtype.is_complex):
        return outputs  # integer sums are exact in any order
    size = x.shape.num_elements()
    if size == 0 or (size is None and op_type in ("Bincount", "DenseBincount")):
        return outputs  # nothing to regroup (empty bincount weights mean "count")
    try:
        replaced = _emulate(op_type, op, list(inputs), graph)
    except Exception as exc:  # noqa: BLE001 - never break the user's program
        warnings.warn(
            f"nddebug.emulate_gpu(): could not emulate {op_type} {op.name}, it runs unchanged: "
            f"{type(exc).__name__}: {exc}",
            RuntimeWarning,
            stacklevel=2,
        )
        return outputs
    if replaced is None:
        return outputs
    return replaced


def _on_eager(op_type: str) -> None:
    if _behaviour(op_type) in ("emulate", "raise") and op_type not in _warned:
        _warned.add(op_type)
        warnings.warn(
            f"nddebug.emulate_gpu(): {op_type} ran eagerly and was neither emulated nor "
            "guarded. Only ops in graphs (tf.function, Keras fit/train_on_batch) are: "
            "TensorFlow does not let an op callback replace an eager op's outputs.",
            RuntimeWarning,
            stacklevel=3,
        )


# ---------------------------------------------------------------------- recipes


def _seeds() -> tuple[int, int]:
    with _lock:
        return _rng.randrange(1, 2**31), _rng.randrange(1, 2**31)


def _mask(x: Any, graph: Any) -> Any:
    """A fresh random boolean mask per execution (a stateful kernel with fixed seeds advances
    on every run), all true when the gate is off."""
    import tensorflow as tf
    from tensorflow.python.ops import gen_random_ops

    seed, seed2 = _seeds()
    uniform = gen_random_ops.random_uniform(
        tf.shape(x), dtype=tf.float32, seed=seed, seed2=seed2, name="mask"
    )
    return tf.logical_or(uniform < 0.5, tf.logical_not(_graph_gate(graph)))


def _clone(graph: Any, op: Any, inputs: list[Any], name: str) -> Any:
    attrs = {key: op.node_def.attr[key] for key in op.node_def.attr}
    return graph._create_op_internal(op.type, inputs, name=name, attrs=attrs)


def _final_name(op: Any) -> str:
    """A sibling name for the op that carries the result: the original name's base, so that
    nddebug's op keys (which drop TF's _1, _2 suffixes) match a run without emulation."""
    return _UID.sub("", op.name.rsplit("/", 1)[-1]) if op.name else "emulated"


def _emulate(op_type: str, op: Any, inputs: list[Any], graph: Any) -> list[Any] | None:
    import tensorflow as tf
    from tensorflow.python.eager import record

    recipe = RECIPES[op_type]
    x = inputs[recipe.index]
    scope = op.name.rsplit("/", 1)[0] + "/" if "/" in op.name else ""
    with graph.as_default(), record.stop_recording(), graph.name_scope(op.name + "/emulate_gpu/"):
        m = _mask(x, graph)
        gate = _graph_gate(graph)
        if recipe.method == "state":
            fill = tf.constant(_STATE_FILL[op_type], x.dtype)
            op._update_input(recipe.index, tf.where(m, x, fill))
            rest = list(inputs)
            rest[recipe.index] = tf.where(m, fill, x)
            with graph.control_dependencies([op]):
                _clone(graph, op, rest, "rest")
            return None
        if recipe.method == "chain":
            fill = tf.constant(_CHAIN_FILL[op_type], x.dtype)
            first = list(inputs)
            first[recipe.index] = tf.where(m, x, fill)
            inner = _clone(graph, op, first, "part")
            rest = list(inputs)
            rest[0] = inner.outputs[0]
            rest[recipe.index] = tf.where(m, fill, x)
            with graph.name_scope(scope or None):
                outer = _clone(graph, op, rest, graph.unique_name(_final_name(op)) + "/")
            return [outer.outputs[0]]
        one = recipe.method == "product"
        fill = tf.constant(1 if one else 0, x.dtype)
        halves = []
        for keep in (tf.where(m, x, fill), tf.where(m, fill, x)):
            args = list(inputs)
            args[recipe.index] = keep
            halves.append(_clone(graph, op, args, "part").outputs)
        n = len(op.outputs) if recipe.linear_outputs is None else recipe.linear_outputs
        combine = tf.multiply if one else tf.add
        combined = [combine(a, b) for a, b in zip(halves[0][:n], halves[1][:n], strict=True)]
    # The op that carries output 0 gets the original's base name in the original's scope.
    with graph.as_default(), record.stop_recording(), graph.name_scope(scope or None):
        results = [
            tf.where(gate, c, a, name=_final_name(op) if i == 0 else None)
            for i, (c, a) in enumerate(zip(combined, halves[0][:n], strict=True))
        ]
    return results + list(halves[0][n:])


# ---------------------------------------------------------------------- introspection


_METHODS = {
    "split": "op(x*m) + op(x*(1-m))",
    "product": "op(x^m) * op(x^(1-m)) (other half filled with ones)",
    "chain": "op(op(t, i, u*m), i, u*(1-m))",
    "state": "the update applies u*m, a second update right after it applies u*(1-m)",
}
_WITH_DETERMINISM = {
    "fixed": "runs the real op (deterministic)",
    "host": "runs the real op (TF runs it on the host)",
    "raises": "raises UnimplementedError with TF's message and nddebug's advice",
    "unaffected": "still emulated",
    "n/a": "still emulated",
}


def emulated_op_types() -> pandas.DataFrame:
    """What :func:`emulate_gpu` does to each GPU culprit of the knowledge base: one row per op
    type, with the recipe (or why there is none), what an emulated finding means, what a real
    GPU showed (the knowledge base's measured_gpu) and the behaviour under op determinism."""
    import pandas

    rows = []
    for op_type, culprit in _gpu_culprits().items():
        recipe = RECIPES.get(op_type)
        rows.append(
            {
                "op_type": op_type,
                "emulated": recipe is not None,
                "recipe": (
                    _METHODS[recipe.method]
                    + (f" ({recipe.note})" if recipe.note else "")
                    + "; floating-point and complex dtypes only"
                    if recipe
                    else f"not emulated: {NOT_EMULATED.get(op_type, 'no recipe')}"
                ),
                "linear_input": f"{recipe.index}: {recipe.input_name}" if recipe else "",
                "finding": FINDING if recipe else "",
                "measured_gpu": str(culprit.measured_gpu or "not measured on a GPU"),
                "under_determinism": culprit.under_determinism,
                "with_determinism": (
                    _WITH_DETERMINISM[culprit.under_determinism]
                    if recipe or culprit.under_determinism == "raises"
                    else "runs the real op"
                ),
            }
        )
    return pandas.DataFrame(rows)


def _check_recipe_table(lookup: Callable[[str], Any]) -> list[str]:
    """Problems in RECIPES against TF's op registry (``lookup`` returns an OpDef or None)."""
    problems = []
    for op_type, recipe in RECIPES.items():
        op_def = lookup(op_type)
        if op_def is None:
            problems.append(f"{op_type}: not a registered op")
        elif op_def.input_arg[recipe.index].name != recipe.input_name:
            problems.append(
                f"{op_type}: input {recipe.index} is {op_def.input_arg[recipe.index].name!r}, "
                f"not {recipe.input_name!r}"
            )
    return problems
