"""The census's catalogue: one case per (op type, TF call, input size), with input builders.

Each case says which op type it measures, how to create that op from ordinary TF code, and
how to build its inputs from a seeded NumPy generator, so every run of every process sees the
same bytes. The catalogue covers every op type of the knowledge base and the common training
ops. It does not import TensorFlow at module level: the parent process of a census only needs
the names (to validate ``ops=`` and to list the catalogue); the builders import TF when a
worker calls them.

Conventions for builders: ``build(rng)`` runs inside ``tf.device(...)`` of the measured device
and returns a :class:`Program`. Its ``fn`` is traced into a ``tf.function``. For a backward
case the census differentiates ``fn``'s output with respect to ``wrt`` (and ``variables``) with
a fixed upstream gradient, so ``fn`` itself is the forward computation.

Random and other by-design varying ops (kind "random", "other") are built the way code without
seeds creates them (``seed=0, seed2=0``, ``Generator.from_non_deterministic_state()``):
differing per call is their definition; what the census checks for them is what op determinism
does (the knowledge base says: raise). The input-pipeline cases are seeded and have a parallel
map with ``deterministic=False``, which op determinism forces into order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["CASES", "Case", "Program", "cases", "op_types"]


@dataclass
class Program:
    """What a builder returns: the function to trace and its inputs."""

    fn: Callable[..., Any]
    #: NumPy arrays become ``tf.constant`` on the device; anything else is passed as is.
    args: tuple[Any, ...] = ()
    #: Backward cases: differentiate with respect to these positions of ``args`` ...
    wrt: tuple[int, ...] = ()
    #: ... and these variables.
    variables: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Case:
    """One measurement: an op type created by one TF call at one input size."""

    op_type: str
    pass_: str  # "forward" or "backward"
    api: str
    size: str
    dtype: str
    build: Callable[[np.random.Generator], Program] | None = field(compare=False, default=None)
    kind: str = "numerical"  # as in the knowledge base; not "numerical" = varies by design
    devices: tuple[str, ...] = ("CPU", "GPU")
    #: Why the op cannot be measured at all (then ``build`` is None).
    skip: str = ""
    #: Which outputs of the op to compare (None: all). Some outputs are scratch space whose
    #: bytes are not defined (FusedBatchNorm* reserve spaces) and would look non-deterministic.
    outputs: tuple[int, ...] | None = None
    #: Why the knowledge-base entry's ``condition`` does not hold for this case (e.g. training-
    #: mode batch norm): the row is then compared as for an op the knowledge base does not list.
    outside_condition: str = ""
    #: The TF call may legitimately not create the op (the tf.nn cross-entropy functions avoid
    #: the fused op under op determinism): then the call's own outputs are measured.
    call_outputs_if_absent: bool = False

    @property
    def key(self) -> str:
        """Unique name of the case, stable across processes."""
        return f"{self.op_type} | {self.api} | {self.size}"


# --------------------------------------------------------------------------- input helpers


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def _uniform(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.random(shape, dtype=np.float32)


def _ids(rng: np.random.Generator, high: int, n: int, sort: bool = False) -> np.ndarray:
    ids = rng.integers(0, high, size=n).astype(np.int32)
    return np.sort(ids) if sort else ids


def _boxes(rng: np.random.Generator, n: int) -> np.ndarray:
    """Boxes that overlap heavily (centres near the middle): the CropAndResize race needs it."""
    centre = rng.uniform(0.35, 0.65, size=(n, 2))
    half = rng.uniform(0.15, 0.3, size=(n, 2))
    return np.concatenate([centre - half, centre + half], axis=1).astype(np.float32)


def _tf() -> Any:
    import tensorflow as tf

    return tf


# --------------------------------------------------------------------------- the catalogue

CASES: list[Case] = []


def _add(
    op_type: str,
    pass_: str,
    api: str,
    sizes: dict[str, Callable[[np.random.Generator], Program]],
    dtype: str = "float32",
    **extra: Any,
) -> None:
    for size, build in sizes.items():
        CASES.append(Case(op_type, pass_, api, size, dtype, build, **extra))


def _skip(op_type: str, api: str, reason: str, kind: str = "numerical") -> None:
    CASES.append(Case(op_type, "forward", api, "-", "-", None, kind=kind, skip=reason))


# Convolutions ---------------------------------------------------------------------------


def _conv2d(
    n: int,
    hw: int,
    c: int,
    f: int,
    wrt: int | None,
    k: int = 3,
    stride: int = 1,
    padding: str = "SAME",
    dilation: int = 1,
) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        x, w = _normal(rng, n, hw, hw, c), _normal(rng, k, k, c, f) * 0.1

        def fn(x: Any, w: Any) -> Any:
            return tf.nn.conv2d(x, w, strides=stride, padding=padding, dilations=dilation)

        return Program(fn, (x, w), wrt=() if wrt is None else (wrt,))

    return build


_CONV2D = {"8x32x32x16, 3x3x16x32": (8, 32, 16, 32), "8x56x56x64, 3x3x64x64": (8, 56, 64, 64)}
for _label, _dims in _CONV2D.items():
    _add("Conv2D", "forward", "tf.nn.conv2d", {_label: _conv2d(*_dims, None)})
    _add("Conv2DBackpropInput", "backward", "tf.nn.conv2d", {_label: _conv2d(*_dims, 0)})
    _add("Conv2DBackpropFilter", "backward", "tf.nn.conv2d", {_label: _conv2d(*_dims, 1)})

# Whether cuDNN picks an atomic backprop algorithm depends on the shapes: the small sizes above
# were deterministic on an H100 while training steps were not. These are the shapes of real
# models (the seed-000 MNIST CNN, a ResNet block) and TensorFlow's own d9m test configurations
# (cudnn_deterministic_base.py), keyed by the API text. The model shapes take seconds per run
# on a 2-core CPU, whose convolutions were deterministic at every size: GPU only.
_CONV2D_REAL: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "128x28x28x1, 3x3x1x32 VALID": (
        "Keras Conv2D (seed-000 MNIST CNN, first layer)",
        {"n": 128, "hw": 28, "c": 1, "f": 32, "padding": "VALID"},
        ("GPU",),
    ),
    "128x26x26x32, 3x3x32x64 VALID": (
        "Keras Conv2D (seed-000 MNIST CNN, second layer)",
        {"n": 128, "hw": 26, "c": 32, "f": 64, "padding": "VALID"},
        ("GPU",),
    ),
    "128x32x32x64, 3x3x64x64": (
        "Keras Conv2D (ResNet basic block, 64x64 images)",
        {"n": 128, "hw": 32, "c": 64, "f": 64},
        ("GPU",),
    ),
    "128x32x32x64, 3x3x64x128 stride 2": (
        "Keras Conv2D (ResNet downsampling block)",
        {"n": 128, "hw": 32, "c": 64, "f": 128, "stride": 2},
        ("GPU",),
    ),
    "8x64x64x8, 3x3x8x8": (
        "tf.nn.conv2d (TF d9m test: filter-gradient config)",
        {"n": 8, "hw": 64, "c": 8, "f": 8},
        ("CPU", "GPU"),
    ),
    "1x16x16x1, 7x7x1x3": (
        "tf.nn.conv2d (TF d9m test: input-gradient config)",
        {"n": 1, "hw": 16, "c": 1, "f": 3, "k": 7},
        ("CPU", "GPU"),
    ),
    "1x16x16x1, 7x7x1x3 dilation 2": (
        "tf.nn.conv2d (TF d9m test: input-gradient config, dilated)",
        {"n": 1, "hw": 16, "c": 1, "f": 3, "k": 7, "dilation": 2},
        ("CPU", "GPU"),
    ),
}
for _label, (_api, _kw, _devices) in _CONV2D_REAL.items():
    for _op, _wrt in (("Conv2DBackpropInput", 0), ("Conv2DBackpropFilter", 1)):
        _add(_op, "backward", _api, {_label: _conv2d(wrt=_wrt, **_kw)}, devices=_devices)


def _conv3d(n: int, d: int, hw: int, c: int, f: int, wrt: int | None) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        x, w = _normal(rng, n, d, hw, hw, c), _normal(rng, 3, 3, 3, c, f) * 0.1
        fn = lambda x, w: tf.nn.conv3d(x, w, [1] * 5, padding="SAME")  # noqa: E731
        return Program(fn, (x, w), wrt=() if wrt is None else (wrt,))

    return build


def _conv3d_v1(which: str, n: int, d: int, hw: int, c: int, f: int) -> Callable:
    """The pre-V2 backprop ops: only reachable through tf.raw_ops."""

    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        x, w = _normal(rng, n, d, hw, hw, c), _normal(rng, 3, 3, 3, c, f) * 0.1
        dy = _normal(rng, n, d, hw, hw, f)
        op = getattr(tf.raw_ops, which)
        fn = lambda x, w, dy: op(  # noqa: E731
            input=x, filter=w, out_backprop=dy, strides=[1] * 5, padding="SAME"
        )
        return Program(fn, (x, w, dy))

    return build


_CONV3D = {
    "4x8x16x16x8, 3x3x3x8x16": (4, 8, 16, 8, 16),
    "4x8x32x32x16, 3x3x3x16x32": (4, 8, 32, 16, 32),
}
for _label, _dims in _CONV3D.items():
    _add("Conv3D", "forward", "tf.nn.conv3d", {_label: _conv3d(*_dims, None)})
    _add("Conv3DBackpropInputV2", "backward", "tf.nn.conv3d", {_label: _conv3d(*_dims, 0)})
    _add("Conv3DBackpropFilterV2", "backward", "tf.nn.conv3d", {_label: _conv3d(*_dims, 1)})
_label, _dims = next(reversed(_CONV3D.items()))
for _which in ("Conv3DBackpropInput", "Conv3DBackpropFilter"):
    _add(
        _which,
        "backward",
        f"tf.raw_ops.{_which} (deprecated V1)",
        {_label: _conv3d_v1(_which, *_dims)},
    )


def _depthwise(
    n: int, hw: int, c: int, wrt: int | None, k: int = 3, mult: int = 1, w_: int = 0
) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        x, w = _normal(rng, n, hw, w_ or hw, c), _normal(rng, k, k, c, mult) * 0.1
        fn = lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME")  # noqa: E731
        return Program(fn, (x, w), wrt=() if wrt is None else (wrt,))

    return build


_NATIVE = "more than one input channel: the native kernel, not the cuDNN path the entry is about"
for _label, _dims in {"8x32x32x32, 3x3": (8, 32, 32), "8x28x28x128, 3x3": (8, 28, 128)}.items():
    _api = "tf.nn.depthwise_conv2d"
    _add("DepthwiseConv2dNative", "forward", _api, {_label: _depthwise(*_dims, None)})
    _add(
        "DepthwiseConv2dNativeBackpropInput",
        "backward",
        _api,
        {_label: _depthwise(*_dims, 0)},
        outside_condition=_NATIVE,
    )
    _add("DepthwiseConv2dNativeBackpropFilter", "backward", _api, {_label: _depthwise(*_dims, 1)})
# TensorFlow's d9m test configuration (depthwise_conv_op_d9m_test.py): one input channel takes
# the cuDNN path for both gradients. About 1 GFLOP per run: GPU only.
_api = "tf.nn.depthwise_conv2d (TF d9m test config, cuDNN path)"
_label = "2x500x1000x1, 7x7, multiplier 10"
for _op, _wrt in (
    ("DepthwiseConv2dNativeBackpropInput", 0),
    ("DepthwiseConv2dNativeBackpropFilter", 1),
):
    _add(
        _op,
        "backward",
        _api,
        {_label: _depthwise(2, 500, 1, _wrt, k=7, mult=10, w_=1000)},
        devices=("GPU",),
    )


def _bias_add(shape: tuple[int, ...]) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        x, b = _normal(rng, *shape), _normal(rng, shape[-1])
        return Program(lambda x, b: tf.nn.bias_add(x, b), (x, b), wrt=(1,))

    return build


_add(
    "BiasAddGrad",
    "backward",
    "tf.nn.bias_add (Keras Dense/Conv bias)",
    {"64x1024": _bias_add((64, 1024)), "16x56x56x64": _bias_add((16, 56, 56, 64))},
)


# Matrix products -------------------------------------------------------------------------


def _matmul(m: int, k: int, n: int) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        return Program(lambda a, b: tf.matmul(a, b), (_normal(rng, m, k), _normal(rng, k, n)))

    return build


_add(
    "MatMul",
    "forward",
    "tf.matmul (Dense; also its gradients)",
    {
        "128x512 @ 512x512": _matmul(128, 512, 512),
        "1024x1024 @ 1024x1024": _matmul(1024, 1024, 1024),
    },
)


def _batch_matmul(b: int, h: int, t: int, d: int) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        q, k = _normal(rng, b, h, t, d), _normal(rng, b, h, t, d)
        return Program(lambda q, k: tf.matmul(q, k, transpose_b=True), (q, k))

    return build


_add(
    "BatchMatMulV2",
    "forward",
    "tf.matmul on batches (attention scores)",
    {"8x4x128x64": _batch_matmul(8, 4, 128, 64), "16x8x256x64": _batch_matmul(16, 8, 256, 64)},
)


def _sparse_dense_matmul(rows: int, nnz: int, cols: int) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        idx = np.stack([_ids(rng, rows, nnz), _ids(rng, rows, nnz)], axis=1).astype(np.int64)
        idx = np.unique(idx, axis=0)  # a valid SparseTensor: sorted, no duplicates
        values = _normal(rng, len(idx))
        dense = _normal(rng, rows, cols)

        def fn(idx: Any, values: Any, dense: Any) -> Any:
            sp = tf.SparseTensor(idx, values, [rows, rows])
            return tf.sparse.sparse_dense_matmul(sp, dense)

        return Program(fn, (idx, values, dense))

    return build


_add(
    "SparseTensorDenseMatMul",
    "forward",
    "tf.sparse.sparse_dense_matmul",
    {
        "1024x1024 (10k nnz) @ 1024x256": _sparse_dense_matmul(1024, 10_000, 256),
        "8192x8192 (200k nnz) @ 8192x128": _sparse_dense_matmul(8192, 200_000, 128),
    },
)


# Reductions, softmax, cross-entropy ----------------------------------------------------------


def _reduce(name: str, shape: tuple[int, ...], axis: int | None) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        op = getattr(tf, name)
        return Program(lambda x: op(x, axis=axis), (_normal(rng, *shape),))

    return build


_add(
    "Sum",
    "forward",
    "tf.reduce_sum (all elements)",
    {
        "1e5": _reduce("reduce_sum", (100_000,), None),
        "1e7": _reduce("reduce_sum", (10_000_000,), None),
    },
)
_add(
    "Sum", "forward", "tf.reduce_sum(axis=0)", {"4096x2048": _reduce("reduce_sum", (4096, 2048), 0)}
)
_add(
    "Mean",
    "forward",
    "tf.reduce_mean (all elements)",
    {
        "1e5": _reduce("reduce_mean", (100_000,), None),
        "1e7": _reduce("reduce_mean", (10_000_000,), None),
    },
)
_add(
    "Max",
    "forward",
    "tf.reduce_max (all elements)",
    {"1e7": _reduce("reduce_max", (10_000_000,), None)},
)
_add(
    "Prod",
    "forward",
    "tf.reduce_prod(axis=1)",
    {"4096x2048": _reduce("reduce_prod", (4096, 2048), 1)},
)


def _addn(k: int, n: int) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        return Program(lambda *xs: tf.add_n(list(xs)), tuple(_normal(rng, n) for _ in range(k)))

    return build


_add("AddN", "forward", "tf.add_n (gradient accumulation)", {"8 x 1e6": _addn(8, 1_000_000)})


def _softmax(name: str, b: int, c: int) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        op = getattr(tf.nn, name)
        return Program(lambda x: op(x), (_normal(rng, b, c) * 3,))

    return build


for _op, _fn in (("Softmax", "softmax"), ("LogSoftmax", "log_softmax")):
    _add(
        _op,
        "forward",
        f"tf.nn.{_fn}",
        {"64x10": _softmax(_fn, 64, 10), "4096x1000": _softmax(_fn, 4096, 1000)},
    )


def _xent(sparse: bool, b: int, c: int) -> Callable:
    """The raw op, because under op determinism the Python API switches to a composite."""

    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        logits = _normal(rng, b, c) * 3
        if sparse:
            labels = _ids(rng, c, b)
            op = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits
        else:
            labels = np.eye(c, dtype=np.float32)[_ids(rng, c, b)]
            op = tf.raw_ops.SoftmaxCrossEntropyWithLogits
        return Program(lambda f, y: op(features=f, labels=y), (logits, labels))

    return build


for _op, _sparse in (
    ("SoftmaxCrossEntropyWithLogits", False),
    ("SparseSoftmaxCrossEntropyWithLogits", True),
):
    _add(
        _op,
        "forward",
        f"tf.raw_ops.{_op} (loss and its gradient; tf.nn.*softmax_cross_entropy_with_logits)",
        {"64x10": _xent(_sparse, 64, 10), "4096x1000": _xent(_sparse, 4096, 1000)},
    )


def _xent_api(sparse: bool, b: int, c: int) -> Callable:
    """The public path (also Keras' losses): under op determinism it builds no fused op."""

    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        logits = _normal(rng, b, c) * 3
        if sparse:
            labels = _ids(rng, c, b)
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits
        else:
            labels = np.eye(c, dtype=np.float32)[_ids(rng, c, b)]
            loss = tf.nn.softmax_cross_entropy_with_logits

        def fn(f: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                tape.watch(f)
                cost = loss(labels=y, logits=f)
            return cost, tape.gradient(cost, f)

        return Program(fn, (logits, labels))

    return build


for _op, _sparse, _size in (
    ("SoftmaxCrossEntropyWithLogits", False, (1024, 3000)),
    ("SparseSoftmaxCrossEntropyWithLogits", True, (1024, 1000)),
):
    _add(
        _op,
        "forward",
        f"tf.nn.{'sparse_' if _sparse else ''}softmax_cross_entropy_with_logits "
        "(loss and its gradient; Keras losses)",
        {f"{_size[0]}x{_size[1]}": _xent_api(_sparse, *_size)},
        call_outputs_if_absent=True,
    )


# Normalisation ----------------------------------------------------------------------------


def _batch_norm(
    shape: tuple[int, ...], training: bool, backward: bool, version: str = "V3"
) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        c = shape[-1]
        x, scale, offset = _normal(rng, *shape), _uniform(rng, c) + 0.5, _normal(rng, c)
        mean, var = (
            (_normal(rng, c) * 0.1, _uniform(rng, c) + 0.5)
            if not training
            else (np.zeros(c, np.float32), np.ones(c, np.float32))
        )
        op = getattr(tf.raw_ops, "FusedBatchNorm" + ("" if version == "V1" else version))

        def fn(x: Any, scale: Any, offset: Any, mean: Any, var: Any) -> Any:
            return op(
                x=x, scale=scale, offset=offset, mean=mean, variance=var, is_training=training
            )[0]

        return Program(fn, (x, scale, offset, mean, var), wrt=(0, 1, 2) if backward else ())

    return build


_BN = {"8x28x28x32": (8, 28, 28, 32), "32x28x28x64": (32, 28, 28, 64)}
_TRAINING = "is_training=True: the knowledge base's entry is about inference-mode backprop"
for _label, _shape in _BN.items():
    _add(
        "FusedBatchNormV3",
        "forward",
        "tf.compat.v1.nn.fused_batch_norm / Keras BatchNormalization (training)",
        {_label: _batch_norm(_shape, True, False)},
        outputs=(0, 1, 2),
    )
    _add(
        "FusedBatchNormGradV3",
        "backward",
        "Keras BatchNormalization (training)",
        {_label: _batch_norm(_shape, True, True)},
        outputs=(0, 1, 2),
        outside_condition=_TRAINING,
    )
    _add(
        "FusedBatchNormGradV3",
        "backward",
        "BatchNormalization(training=False) while trainable",
        {_label: _batch_norm(_shape, False, True)},
        outputs=(0, 1, 2),
    )
for _version, _grad in (("V1", "FusedBatchNormGrad"), ("V2", "FusedBatchNormGradV2")):
    for _training in (False, True):
        _add(
            _grad,
            "backward",
            f"tf.raw_ops.FusedBatchNorm{_version.replace('V1', '')}"
            f"(is_training={_training}) gradient",
            {"32x28x28x64": _batch_norm((32, 28, 28, 64), _training, True, _version)},
            outputs=(0, 1, 2),
            outside_condition=_TRAINING if _training else "",
        )


# Pooling ---------------------------------------------------------------------------------


def _pool(kind: str, shape: tuple[int, ...], k: int, s: int, backward: bool) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        # Rounded values: ties inside a window test which maximum the gradient goes to.
        x = np.round(_normal(rng, *shape) * 4) / 4
        if kind == "max_v2":
            fn = lambda x: tf.raw_ops.MaxPoolV2(  # noqa: E731
                input=x, ksize=[1, k, k, 1], strides=[1, s, s, 1], padding="SAME"
            )
        elif kind == "max3d":
            fn = lambda x: tf.nn.max_pool3d(x, k, s, "SAME")  # noqa: E731
        else:
            op = tf.nn.max_pool2d if kind == "max" else tf.nn.avg_pool2d
            fn = lambda x: op(x, k, s, "SAME")  # noqa: E731
        return Program(fn, (x,), wrt=(0,) if backward else ())

    return build


_POOL = {
    "8x32x32x16, 2x2/2": ((8, 32, 32, 16), 2, 2),
    "16x56x56x64, 3x3/2": ((16, 56, 56, 64), 3, 2),
}
for _label, (_shape, _k, _s) in _POOL.items():
    _add("MaxPool", "forward", "tf.nn.max_pool2d", {_label: _pool("max", _shape, _k, _s, False)})
    _add(
        "MaxPoolGrad",
        "backward",
        "tf.nn.max_pool2d / Keras MaxPooling2D",
        {_label: _pool("max", _shape, _k, _s, True)},
    )
    _add("AvgPool", "forward", "tf.nn.avg_pool2d", {_label: _pool("avg", _shape, _k, _s, False)})
    _add(
        "AvgPoolGrad",
        "backward",
        "tf.nn.avg_pool2d / Keras AveragePooling2D",
        {_label: _pool("avg", _shape, _k, _s, True)},
    )
_add(
    "MaxPoolGradV2",
    "backward",
    "tf.raw_ops.MaxPoolV2 (window as a tensor)",
    {"16x56x56x64, 3x3/2": _pool("max_v2", (16, 56, 56, 64), 3, 2, True)},
)
_add(
    "MaxPool3DGrad",
    "backward",
    "tf.nn.max_pool3d / Keras MaxPooling3D",
    {"4x16x32x32x16, 3x3x3/2": _pool("max3d", (4, 16, 32, 32, 16), 3, 2, True)},
)


# Resizing and crop-and-resize ---------------------------------------------------------------


def _resize(method: str, shape: tuple[int, ...], out: int, backward: bool) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        fn = lambda x: tf.image.resize(x, (out, out), method=method)  # noqa: E731
        return Program(fn, (_normal(rng, *shape),), wrt=(0,) if backward else ())

    return build


# Upsampling 2x (UpSampling2D, decoders) and downsampling 0.75x (every input cell gets
# contributions from several outputs in the gradient).
_RESIZE = {
    "8x32x32x32 -> 64x64": ((8, 32, 32, 32), 64),
    "8x64x64x32 -> 48x48": ((8, 64, 64, 32), 48),
}
for _method, _fwd, _bwd in (
    ("bilinear", "ResizeBilinear", "ResizeBilinearGrad"),
    ("nearest", "ResizeNearestNeighbor", "ResizeNearestNeighborGrad"),
):
    for _label, (_shape, _out) in _RESIZE.items():
        _api = f"tf.image.resize(method='{_method}')"
        _add(_fwd, "forward", _api, {_label: _resize(_method, _shape, _out, False)})
        _add(
            _bwd,
            "backward",
            _api + " / UpSampling2D",
            {_label: _resize(_method, _shape, _out, True)},
        )
_add(
    "ResizeBicubicGrad",
    "backward",
    "tf.image.resize(method='bicubic')",
    {"8x32x32x32 -> 64x64": _resize("bicubic", (8, 32, 32, 32), 64, True)},
)


def _crop(images: tuple[int, int, int, int], boxes: int, crop: int, wrt: int | None) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        image = _uniform(rng, *images)
        coords, index = _boxes(rng, boxes), _ids(rng, images[0], boxes)

        def fn(image: Any, coords: Any, index: Any) -> Any:
            return tf.image.crop_and_resize(image, coords, index, crop_size=(crop, crop))

        return Program(fn, (image, coords, index), wrt=() if wrt is None else (wrt,))

    return build


_CROP = {
    "4x32x32x8, 64 boxes, 7x7 crops": ((4, 32, 32, 8), 64, 7),
    "2x32x32x3, 1024 boxes, 14x14 crops": ((2, 32, 32, 3), 1024, 14),
    # The CPU race in a form that shows on a loaded 2-core machine too (1024 boxes can run
    # ten times alike when the worker threads do not overlap).
    "2x32x32x3, 4096 boxes, 14x14 crops": ((2, 32, 32, 3), 4096, 14),
}
for _label, _dims in _CROP.items():
    _api = "tf.image.crop_and_resize (detection ROI crops)"
    _add("CropAndResize", "forward", _api, {_label: _crop(*_dims, None)})
    _add("CropAndResizeGradImage", "backward", _api, {_label: _crop(*_dims, 0)})
    _add("CropAndResizeGradBoxes", "backward", _api, {_label: _crop(*_dims, 1)})


def _adjust_contrast(v1: bool, shape: tuple[int, ...]) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        images = _uniform(rng, *shape)
        if v1:
            fn = lambda x: tf.raw_ops.AdjustContrast(  # noqa: E731
                images=x, contrast_factor=1.5, min_value=0.0, max_value=1.0
            )
        else:
            fn = lambda x: tf.image.adjust_contrast(x, 1.5)  # noqa: E731
        return Program(fn, (images,))

    return build


_add(
    "AdjustContrastv2",
    "forward",
    "tf.image.adjust_contrast",
    {
        "8x64x64x3": _adjust_contrast(False, (8, 64, 64, 3)),
        "8x256x256x3": _adjust_contrast(False, (8, 256, 256, 3)),
    },
)
_add(
    "AdjustContrast",
    "forward",
    "tf.raw_ops.AdjustContrast (deprecated)",
    {"8x256x256x3": _adjust_contrast(True, (8, 256, 256, 3))},
)


# Gather, scatter, segment ops, embeddings ----------------------------------------------------


def _gather(rows: int, dim: int, n: int, nd: bool, backward: bool) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        table = _normal(rng, rows, dim)
        if nd:
            # Two index columns: with one, TF differentiates gather_nd like gather.
            table = table.reshape(100, rows // 100, dim)
            ids = np.stack([_ids(rng, 100, n), _ids(rng, rows // 100, n)], axis=1)
            fn = lambda t, i: tf.gather_nd(t, i)  # noqa: E731
        else:
            ids = _ids(rng, rows, n)
            fn = lambda t, i: tf.gather(t, i)  # noqa: E731
        return Program(fn, (table, ids), wrt=(0,) if backward else ())

    return build


_GATHER = {
    "10000x64 table, 4096 ids": (10_000, 64, 4096),
    "40000x128 table, 32768 ids": (40_000, 128, 32_768),
}
for _label, _dims in _GATHER.items():
    _add("GatherV2", "forward", "tf.gather", {_label: _gather(*_dims, False, False)})
    _add(
        "UnsortedSegmentSum",
        "backward",
        "tf.gather backward (IndexedSlices made dense)",
        {_label: _gather(*_dims, False, True)},
    )
    _add("GatherNd", "forward", "tf.gather_nd", {_label: _gather(*_dims, True, False)})
    _add("ScatterNd", "backward", "tf.gather_nd backward", {_label: _gather(*_dims, True, True)})


def _embedding(rows: int, dim: int, n: int, backward: bool) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        table = tf.Variable(_normal(rng, rows, dim))
        ids = _ids(rng, rows, n)
        fn = lambda i: tf.nn.embedding_lookup(table, i)  # noqa: E731
        return Program(fn, (ids,), variables=(table,) if backward else ())

    return build


_add(
    "ResourceGather",
    "forward",
    "tf.nn.embedding_lookup on a tf.Variable (Keras Embedding)",
    {"40000x128 table, 32768 ids": _embedding(40_000, 128, 32_768, False)},
)
_add(
    "UnsortedSegmentSum",
    "backward",
    "tf.nn.embedding_lookup backward (IndexedSlices made dense)",
    {"40000x128 table, 32768 ids": _embedding(40_000, 128, 32_768, True)},
)


def _scatter(op: str, rows: int, dim: int, n: int) -> Callable:
    """Scatter with duplicate indices: the order in which duplicates land is what may vary."""

    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        ids = _ids(rng, rows, n).reshape(n, 1)
        updates, tensor = _normal(rng, n, dim), _normal(rng, rows, dim)
        if op == "ScatterNd":
            return Program(lambda i, u: tf.scatter_nd(i, u, [rows, dim]), (ids, updates))
        fn = getattr(
            tf,
            {
                "TensorScatterAdd": "tensor_scatter_nd_add",
                "TensorScatterSub": "tensor_scatter_nd_sub",
                "TensorScatterUpdate": "tensor_scatter_nd_update",
                "TensorScatterMax": "tensor_scatter_nd_max",
            }[op],
        )
        return Program(lambda t, i, u: fn(t, i, u), (tensor, ids, updates))

    return build


_SCATTER = {
    "4096 updates into 1024x64": (1024, 64, 4096),
    "65536 updates into 4096x128": (4096, 128, 65_536),
}
for _op, _api in (
    ("ScatterNd", "tf.scatter_nd (duplicate indices)"),
    ("TensorScatterAdd", "tf.tensor_scatter_nd_add (duplicate indices)"),
    ("TensorScatterSub", "tf.tensor_scatter_nd_sub (duplicate indices)"),
    ("TensorScatterUpdate", "tf.tensor_scatter_nd_update (duplicate indices)"),
    ("TensorScatterMax", "tf.tensor_scatter_nd_max (duplicate indices)"),
):
    _add(_op, "forward", _api, {_l: _scatter(_op, *_d) for _l, _d in _SCATTER.items()})


def _resource_scatter(op: str, rows: int, dim: int, n: int) -> Callable:
    """Variable scatter with duplicate indices; the variable is reset first in every run."""

    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        init = _uniform(rng, rows, dim) + 0.5
        var = tf.Variable(init)
        nd = op.startswith("ResourceScatterNd")
        ids = _ids(rng, rows, n).reshape(n, 1) if nd else _ids(rng, rows, n)
        updates = _uniform(rng, n, dim) * 0.01 + 1.0  # near 1: Mul/Div stay finite

        def fn(init: Any, ids: Any, updates: Any) -> Any:
            var.assign(init)
            handle = {"ref" if nd else "resource": var.handle}
            getattr(tf.raw_ops, op)(**handle, indices=ids, updates=updates)
            return var.read_value()

        return Program(fn, (init, ids, updates))

    return build


for _op in (
    "ResourceScatterNdUpdate",
    "ResourceScatterNdAdd",
    "ResourceScatterNdSub",
    "ResourceScatterAdd",
    "ResourceScatterSub",
    "ResourceScatterMul",
    "ResourceScatterDiv",
    "ResourceScatterUpdate",
    "ResourceScatterMin",
    "ResourceScatterMax",
):
    _api = (
        "tf.Variable.scatter_* / tf.compat.v1.scatter_* on resource variables (duplicate indices)"
    )
    _add(
        _op,
        "forward",
        _api,
        {"65536 updates into a 4096x64 variable": _resource_scatter(_op, 4096, 64, 65_536)},
    )
for _op in ("ScatterNdAdd", "ScatterNdSub", "ScatterNdUpdate"):
    _skip(
        _op,
        f"tf.compat.v1.{_op.replace('ScatterNd', 'scatter_nd_').lower()} on a reference variable",
        "works only on TF1 reference variables (tf.compat.v1 graphs); the census measures the "
        "resource-variable twins ResourceScatterNd*",
    )
_REF_SCATTER = ("Update", "Add", "Sub", "Mul", "Div", "Min", "Max")
for _op in (f"Scatter{_name}" for _name in _REF_SCATTER):
    _skip(
        _op,
        f"tf.compat.v1.{_op.replace('Scatter', 'scatter_').lower()} on a reference variable",
        "works only on TF1 reference variables (tf.compat.v1 graphs); the census measures the "
        "resource-variable twins ResourceScatter*",
    )


def _sparse_adagrad(op: str, rows: int, dim: int, n: int) -> Callable:
    """Sparse Adagrad with duplicate indices; the variable and its accumulator are reset first
    in every run."""

    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        init = _uniform(rng, rows, dim) + 0.5
        var, accum = tf.Variable(init), tf.Variable(init)
        ids = _ids(rng, rows, n)
        grad = _normal(rng, n, dim)

        def fn(init: Any, ids: Any, grad: Any) -> Any:
            var.assign(init)
            accum.assign(init)
            eps = {"epsilon": tf.constant(1e-7)} if op.endswith("V2") else {}
            getattr(tf.raw_ops, op)(
                var=var.handle, accum=accum.handle, lr=tf.constant(0.1), grad=grad, indices=ids,
                **eps,
            )  # fmt: skip
            return var.read_value()

        return Program(fn, (init, ids, grad))

    return build


for _op in ("ResourceSparseApplyAdagrad", "ResourceSparseApplyAdagradV2"):
    _add(
        _op,
        "forward",  # run as called: what it leaves in the variable is the output compared
        f"tf.raw_ops.{_op} (Adagrad on a sparse gradient with duplicate indices)",
        {"60000 rows into a 64x64 variable": _sparse_adagrad(_op, 64, 64, 60_000)},
    )
for _op in ("SparseApplyAdagrad", "SparseApplyAdagradV2"):
    _skip(
        _op,
        f"tf.raw_ops.{_op} on a reference variable",
        "works only on TF1 reference variables (tf.compat.v1 graphs); the census measures the "
        "resource-variable twins ResourceSparseApplyAdagrad(V2)",
    )


def _non_aliasing(n: int, rows: int, dim: int) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        t, u = _normal(rng, rows, dim), _normal(rng, n, dim)
        ids = _ids(rng, rows, n).reshape(-1, 1)
        return Program(lambda t, i, u: tf.scatter_nd_non_aliasing_add(t, i, u), (t, ids, u))

    return build


_add(
    "ScatterNdNonAliasingAdd",
    "forward",
    "tf.scatter_nd_non_aliasing_add (duplicate indices)",
    {"65536 updates into 4096x128": _non_aliasing(65536, 4096, 128)},
)


def _segment(op: str, n: int, dim: int, segments: int, backward: bool = False) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        sorted_ids = op.startswith(("Segment", "SparseSegment"))
        data = _uniform(rng, n, dim) + 0.5 if "Prod" in op else _normal(rng, n, dim)
        ids = _ids(rng, segments, n, sort=sorted_ids)
        if op.startswith("SparseSegment"):
            idx = _ids(rng, n, n)
            fn_ = tf.sparse.segment_mean if "Mean" in op else tf.sparse.segment_sum
            fn = lambda d, i, s: fn_(d, i, s)  # noqa: E731
            return Program(fn, (data, idx, ids), wrt=(0,) if backward else ())
        if op.startswith("Unsorted"):
            fn_ = {
                "UnsortedSegmentSum": tf.math.unsorted_segment_sum,
                "UnsortedSegmentProd": tf.math.unsorted_segment_prod,
                "UnsortedSegmentMax": tf.math.unsorted_segment_max,
            }[op]
            return Program(lambda d, s: fn_(d, s, segments), (data, ids))
        fn_ = {
            "SegmentSum": tf.math.segment_sum,
            "SegmentProd": tf.math.segment_prod,
            "SegmentMean": tf.math.segment_mean,
            "SegmentMax": tf.math.segment_max,
        }[op]
        return Program(lambda d, s: fn_(d, s), (data, ids))

    return build


_SEGMENT = {
    "20000x16 into 1000 segments": (20_000, 16, 1000),
    "250000x16 into 1000 segments": (250_000, 16, 1000),
}
for _op, _api in (
    ("SegmentSum", "tf.math.segment_sum"),
    ("SegmentProd", "tf.math.segment_prod"),
    ("SegmentMean", "tf.math.segment_mean"),
    ("SegmentMax", "tf.math.segment_max"),
    ("UnsortedSegmentSum", "tf.math.unsorted_segment_sum"),
    ("UnsortedSegmentProd", "tf.math.unsorted_segment_prod"),
    ("UnsortedSegmentMax", "tf.math.unsorted_segment_max"),
    ("SparseSegmentSum", "tf.sparse.segment_sum (embedding_lookup_sparse)"),
    ("SparseSegmentMean", "tf.sparse.segment_mean (embedding_lookup_sparse)"),
):
    _add(_op, "forward", _api, {_l: _segment(_op, *_d) for _l, _d in _SEGMENT.items()})
_add(
    "SparseSegmentMeanGrad",
    "backward",
    "tf.sparse.segment_mean (embedding_lookup_sparse)",
    {
        "250000x16 into 1000 segments": _segment(
            "SparseSegmentMean", 250_000, 16, 1000, backward=True
        )
    },
)


def _bincount(raw: bool, n: int, bins: int, weighted: bool) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        values = _ids(rng, bins, n)
        weights = _uniform(rng, n) if weighted else np.zeros(0, np.float32)
        if raw:
            fn = lambda v, w: tf.raw_ops.Bincount(arr=v, size=bins, weights=w)  # noqa: E731
        elif weighted:
            fn = lambda v, w: tf.math.bincount(v, weights=w, minlength=bins)  # noqa: E731
        else:
            fn = lambda v, w: tf.math.bincount(v, minlength=bins)  # noqa: E731
        return Program(fn, (values, weights))

    return build


for _n in (10_000, 4_000_000):
    _label = f"{_n:.0e} values into 100 bins, float weights".replace("e+0", "e")
    _add(
        "Bincount",
        "forward",
        "tf.raw_ops.Bincount (with weights)",
        {_label: _bincount(True, _n, 100, True)},
    )
    _add(
        "DenseBincount",
        "forward",
        "tf.math.bincount(weights=...)",
        {_label: _bincount(False, _n, 100, True)},
    )
_add(
    "DenseBincount",
    "forward",
    "tf.math.bincount (counts, no weights)",
    {"1e6 values into 100 bins": _bincount(False, 1_000_000, 100, False)},
    dtype="int32",
)


# Sorting, top-k, unique, cumulative ops --------------------------------------------------------


def _topk(rows: int, cols: int, k: int | None) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        x = np.round(_normal(rng, rows, cols) * 8)  # many ties: which index wins is tested
        if k is None:
            return Program(lambda x: tf.argsort(x, axis=-1, stable=True), (x,))
        return Program(lambda x: tf.math.top_k(x, k=k), (x,))

    return build


_add(
    "TopKV2", "forward", "tf.math.top_k (k=10, many ties)", {"1024x10000": _topk(1024, 10_000, 10)}
)
_add(
    "TopKV2",
    "forward",
    "tf.argsort / tf.sort (top_k with k=n, many ties)",
    {"64x4096": _topk(64, 4096, None), "16x65536": _topk(16, 65_536, None)},
)


def _unique(n: int, distinct: int) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        return Program(lambda x: tf.unique(x), (_ids(rng, distinct, n),))

    return build


_add(
    "Unique",
    "forward",
    "tf.unique",
    {"1e6 values, 1000 distinct": _unique(1_000_000, 1000)},
    dtype="int32",
)


def _cumulative(name: str, shape: tuple[int, ...]) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        op = getattr(tf.math, name)
        x = _uniform(rng, *shape) * 0.01 + 1.0 if name == "cumprod" else _normal(rng, *shape)
        return Program(lambda x: op(x, axis=1), (x,))

    return build


_add(
    "Cumsum",
    "forward",
    "tf.math.cumsum(axis=1)",
    {
        "64x4096": _cumulative("cumsum", (64, 4096)),
        "256x16384": _cumulative("cumsum", (256, 16_384)),
    },
)
_add(
    "Cumprod",
    "forward",
    "tf.math.cumprod(axis=1)",
    {"256x16384": _cumulative("cumprod", (256, 16_384))},
)


# CTC ---------------------------------------------------------------------------------------


def _ctc(version: str, t: int, b: int, c: int, label_len: int) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        logits = _normal(rng, t, b, c)
        idx = np.array([(i, j) for i in range(b) for j in range(label_len)], np.int64)
        # CTCLoss uses the last class as blank, CTCLossV2 (cuDNN) the first.
        low, high = (0, c - 1) if version == "CTCLoss" else (1, c)
        values = rng.integers(low, high, size=len(idx)).astype(np.int32)
        lengths = np.full(b, t, np.int32)
        op = getattr(tf.raw_ops, version)
        fn = lambda x, i, v, n: op(inputs=x, labels_indices=i, labels_values=v, sequence_length=n)  # noqa: E731
        return Program(fn, (logits, idx, values, lengths))

    return build


_add(
    "CTCLoss",
    "forward",
    "tf.nn.ctc_loss with sparse labels (loss and its gradient)",
    {
        "T=50, batch 16, 20 classes": _ctc("CTCLoss", 50, 16, 20, 10),
        "T=200, batch 64, 50 classes": _ctc("CTCLoss", 200, 64, 50, 40),
    },
)
_add(
    "CTCLossV2",
    "forward",
    "tf.nn.ctc_loss on GPU (cuDNN CTC, loss and its gradient)",
    {"T=200, batch 64, 50 classes": _ctc("CTCLossV2", 200, 64, 50, 40)},
    devices=("GPU",),
)


# Debugging and quantisation ---------------------------------------------------------------------


def _debug_summary(mode: int, n: int) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        x = _normal(rng, n)
        x[:: n // 7] = np.inf  # something for the health counts to find
        fn = lambda x: tf.raw_ops.DebugNumericSummaryV2(  # noqa: E731
            input=x, output_dtype=tf.float32, tensor_debug_mode=mode, tensor_id=1
        )
        return Program(fn, (x,))

    return build


_add(
    "DebugNumericSummaryV2",
    "forward",
    "tfdbg2 FULL_HEALTH (enable_dump_debug_info)",
    {"1e7": _debug_summary(4, 10_000_000)},
)


def _fake_quant(shape: tuple[int, ...], per_channel: bool = False) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        x = _normal(rng, *shape) * 3
        if per_channel:
            lo, hi = np.full(shape[-1], -2.0, np.float32), np.full(shape[-1], 2.0, np.float32)
            quant = tf.quantization.fake_quant_with_min_max_vars_per_channel
        else:
            lo, hi = np.float32(-2.0), np.float32(2.0)
            quant = tf.quantization.fake_quant_with_min_max_vars

        def fn(x: Any, lo: Any, hi: Any) -> Any:
            return quant(x, lo, hi)

        return Program(fn, (x, lo, hi), wrt=(0, 1, 2))

    return build


_add(
    "FakeQuantWithMinMaxVarsGradient",
    "backward",
    "tf.quantization.fake_quant_with_min_max_vars",
    {"64x128x128": _fake_quant((64, 128, 128))},
)
_add(
    "FakeQuantWithMinMaxVarsPerChannelGradient",
    "backward",
    "tf.quantization.fake_quant_with_min_max_vars_per_channel",
    {"64x128x128": _fake_quant((64, 128, 128), per_channel=True)},
)


# XLA -----------------------------------------------------------------------------------------

for _op in ("XlaLaunch", "XlaLaunchV2", "_XlaCompile", "_XlaRun"):
    _skip(
        _op,
        "tf.function(jit_compile=True), Keras jit_compile, auto-clustering",
        "created by XLA's graph rewrite, not by a TF call: check a jit_compile function with "
        "nddebug.check() instead",
    )


# Collectives (tf.distribute) ---------------------------------------------------------------------

for _op in (
    "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3", "CollectiveReduceScatterV2",
    "NcclAllReduce", "NcclReduce", "CollectiveGather", "CollectiveGatherV2",
    "CollectiveAllToAllV2", "CollectiveAllToAllV3", "CollectiveBcastSend", "CollectiveBcastSendV2",
    "CollectiveBcastRecv", "CollectiveBcastRecvV2", "CollectivePermute", "NcclBroadcast",
):  # fmt: skip
    _skip(
        _op,
        "tf.distribute all-reduce / all-gather / broadcast",
        "needs a group of replicas, not one op in one worker: check a distributed step with "
        "nddebug.check() and nddebug.replica_consistency() (docs/distributed.md)",
        kind="collective",
    )


# Random ops (unseeded), Timestamp, input pipelines ----------------------------------------------


def _random(op: str) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        raw = getattr(tf.raw_ops, op)
        shape = np.array([1000], np.int32)
        calls: dict[str, Callable[[], Any]] = {
            "RandomUniform": lambda: raw(shape=shape, dtype=tf.float32),
            "RandomUniformInt": lambda: raw(shape=shape, minval=0, maxval=1000),
            "RandomStandardNormal": lambda: raw(shape=shape, dtype=tf.float32),
            "TruncatedNormal": lambda: raw(shape=shape, dtype=tf.float32),
            "ParameterizedTruncatedNormal": lambda: raw(
                shape=shape, means=0.0, stdevs=1.0, minvals=-1.0, maxvals=1.0
            ),
            "RandomGamma": lambda: raw(shape=shape, alpha=tf.constant([2.0])),
            "RandomPoissonV2": lambda: raw(shape=shape, rate=tf.constant([3.0])),
            "RandomPoisson": lambda: raw(shape=shape, rate=tf.constant([3.0])),
            "Multinomial": lambda: raw(logits=tf.zeros([4, 10]), num_samples=1000),
            "RandomShuffle": lambda: raw(value=tf.range(1000)),
            "RandomCrop": lambda: raw(
                image=tf.zeros([64, 64, 3]), size=tf.constant([32, 32], tf.int64)
            ),
        }
        return Program(calls[op])

    return build


for _op in (
    "RandomUniform",
    "RandomUniformInt",
    "RandomStandardNormal",
    "TruncatedNormal",
    "ParameterizedTruncatedNormal",
    "RandomGamma",
    "RandomPoissonV2",
    "Multinomial",
    "RandomShuffle",
    "RandomPoisson",
    "RandomCrop",
):
    _add(
        _op,
        "forward",
        f"tf.raw_ops.{_op} without a seed (seed=0, seed2=0)",
        {"1000 values": _random(_op)},
        kind="random",
    )


def _generator(op: str) -> Callable:
    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        gen = tf.random.Generator.from_non_deterministic_state()
        algorithm = tf.constant(gen.algorithm, tf.int64)
        shape = np.array([1000], np.int32)
        raw = getattr(tf.raw_ops, op)
        calls: dict[str, Callable[[], Any]] = {
            "StatefulUniform": lambda: raw(
                resource=gen.state.handle, algorithm=algorithm, shape=shape
            ),
            "StatefulUniformInt": lambda: raw(
                resource=gen.state.handle,
                algorithm=algorithm,
                shape=shape,
                minval=tf.constant(0, tf.int64),
                maxval=tf.constant(1000, tf.int64),
            ),
            "StatefulUniformFullInt": lambda: raw(
                resource=gen.state.handle, algorithm=algorithm, shape=shape
            ),
            "StatefulStandardNormal": lambda: raw(resource=gen.state.handle, shape=shape),
            "StatefulStandardNormalV2": lambda: raw(
                resource=gen.state.handle, algorithm=algorithm, shape=shape
            ),
            "StatefulTruncatedNormal": lambda: raw(
                resource=gen.state.handle, algorithm=algorithm, shape=shape
            ),
            "StatefulRandomBinomial": lambda: raw(
                resource=gen.state.handle,
                algorithm=algorithm,
                shape=shape,
                counts=tf.fill([1000], 10.0),
                probs=tf.fill([1000], 0.5),
            ),
            "RngReadAndSkip": lambda: raw(
                resource=gen.state.handle,
                alg=tf.constant(gen.algorithm, tf.int32),
                delta=tf.constant(1000, tf.uint64),
            ),
        }
        if op == "RngSkip":

            def skip() -> Any:
                raw(
                    resource=gen.state.handle,
                    algorithm=algorithm,
                    delta=tf.constant(1000, tf.int64),
                )
                return gen.state.read_value()

            return Program(skip)
        return Program(calls[op])

    return build


for _op in (
    "StatefulUniform",
    "StatefulUniformInt",
    "StatefulUniformFullInt",
    "StatefulStandardNormal",
    "StatefulStandardNormalV2",
    "StatefulTruncatedNormal",
    "StatefulRandomBinomial",
    "RngReadAndSkip",
    "RngSkip",
):
    _add(
        _op,
        "forward",
        "tf.random.Generator.from_non_deterministic_state()",
        {"1000 values": _generator(_op)},
        kind="random",
    )


def _timestamp(rng: np.random.Generator) -> Program:
    tf = _tf()
    return Program(lambda: tf.timestamp())


_add("Timestamp", "forward", "tf.timestamp", {"scalar": _timestamp}, dtype="float64", kind="other")
for _op, _api in (
    ("PyFunc", "tf.numpy_function"),
    ("PyFuncStateless", "tf.numpy_function(stateful=False)"),
    ("EagerPyFunc", "tf.py_function"),
):
    _skip(
        _op,
        _api,
        "runs the user's Python code: whether it returns the same values for the same inputs "
        "is that code's property, not a kernel's; nddebug.check() of the step tells",
        kind="other",
    )


def _lookup(op: str) -> Callable:
    """A fixed table read with the same keys: the kernel returns what the table holds (a
    table built in another order is what differs between runs: the knowledge base's entry)."""

    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        n = 100_000
        keys = tf.constant([f"k{i}" for i in range(n)])
        table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, -1)
        table.insert(keys, tf.range(n, dtype=tf.int64))
        picked = tf.constant(keys.numpy()[rng.integers(0, n, 10_000)])
        if op == "LookupTableExportV2":
            return Program(lambda: table.export())
        if op == "LookupTableSizeV2":
            return Program(lambda: table.size())
        return Program(lambda: table.lookup(picked))

    return build


for _op in ("LookupTableFindV2", "LookupTableExportV2", "LookupTableSizeV2"):
    _add(
        _op,
        "forward",
        "tf.lookup (Keras StringLookup)",
        {"1e5 keys": _lookup(_op)},
        dtype="int64",
        kind="other",
        devices=("CPU",),
    )
for _op in ("LookupTableFind", "LookupTableExport", "LookupTableSize"):
    _skip(
        _op,
        "tf.compat.v1 lookup tables (reference handles)",
        "TF1 reference tables only; the same kernel as its V2 op, which is measured",
        kind="other",
    )

for _op in (
    "QueueDequeueV2",
    "QueueDequeueManyV2",
    "QueueDequeueUpToV2",
    "QueueDequeue",
    "QueueDequeueMany",
    "QueueDequeueUpTo",
):
    _skip(
        _op,
        "tf.queue.RandomShuffleQueue, tf.compat.v1.train.shuffle_batch",
        "hands out what its queue holds, which the queue's seed and its enqueue threads decide; "
        "measured by hand (the knowledge base entry's 'measured')",
        kind="input pipeline",
    )


def _iterator(op: str) -> Callable:
    """A seeded pipeline with a parallel map that may reorder (``deterministic=False``), which op
    determinism forces into order. (An unseeded shuffle would only show that op determinism
    refuses to build it: RuntimeError before any iterator op runs.) On a 2-core CPU this map
    kept its order in every run we tried, so the off-setting row is usually deterministic."""

    def build(rng: np.random.Generator) -> Program:
        tf = _tf()
        ds = (
            tf.data.Dataset.range(10_000)
            .shuffle(10_000, seed=1, reshuffle_each_iteration=False)
            .map(lambda x: x * 2, num_parallel_calls=4, deterministic=False)
            .batch(10_000)
        )

        def fn() -> Any:
            it = iter(ds)
            if op == "IteratorGetNextSync":
                return tf.raw_ops.IteratorGetNextSync(
                    iterator=it._iterator_resource,
                    output_types=[ds.element_spec.dtype],
                    output_shapes=[ds.element_spec.shape],
                )
            if op in ("IteratorGetNextAsOptional", "OptionalGetValue"):
                return it.get_next_as_optional().get_value()
            return next(it)

        return Program(fn)

    return build


_SHUFFLE = "seeded Dataset.shuffle, map(num_parallel_calls=4, deterministic=False)"
for _op in (
    "IteratorGetNext",
    "IteratorGetNextSync",
    "IteratorGetNextAsOptional",
    "OptionalGetValue",
):
    _add(
        _op,
        "forward",
        _SHUFFLE,
        {"10000 elements": _iterator(_op)},
        dtype="int64",
        kind="input pipeline",
    )


# --------------------------------------------------------------------------- queries


def op_types() -> list[str]:
    """Every op type the catalogue has a case for (measured or skipped), in catalogue order."""
    return list(dict.fromkeys(case.op_type for case in CASES))


def cases(ops: list[str] | tuple[str, ...] | None = None) -> list[Case]:
    """The cases for these op types (case-insensitive), or all; ValueError names unknown ones."""
    if ops is None:
        return list(CASES)
    by_lower = {name.lower(): name for name in op_types()}
    wanted, unknown = set(), []
    for name in ops:
        found = by_lower.get(name.strip().lower())
        if found is None:
            unknown.append(name)
        else:
            wanted.add(found)
    if unknown:
        import difflib

        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, op_types(), n=3, cutoff=0.6)
            hints.append(f"{name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        raise ValueError(
            f"the census has no case for op type(s) {', '.join(hints)}; "
            "`nddebug census --list` shows the op types it measures"
        )
    return [case for case in CASES if case.op_type in wanted]
