"""GPU-atomics emulation on the CPU (nddebug.emulate): real TensorFlow, no mocks.

Under emulate_gpu() the knowledge base's GPU culprits regroup their sums at random on every
execution. Sizes are chosen so that two executions agreeing bit for bit is out of reach: every
case sums thousands of random terms into hundreds of outputs, and 5 of 5 executions were
distinct in every measurement; the tests only need 2 distinct of 5.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug import emulate, knowledge
from nddebug.examples import mnist_cnn
from tests.helpers import jacobian_through_a_loop, run_python

RUNS = 5
_rng = np.random.default_rng(0)


def _normal(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float32)


def _ids(n: int, high: int, *, sort: bool = False) -> np.ndarray:
    ids = _rng.integers(0, high, n).astype(np.int32)
    return np.sort(ids) if sort else ids


def _sparse(rows: int, cols: int, nnz: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    flat = np.sort(_rng.choice(rows * cols, nnz, replace=False))
    indices = np.stack([flat // cols, flat % cols], axis=1).astype(np.int64)
    return indices, _normal(nnz), np.array([rows, cols], np.int64)


_IMAGE = _normal(4, 32, 32, 8)
_CORNER = 0.5 * _rng.random((64, 2), dtype=np.float32)
_BOXES = np.concatenate([_CORNER, _CORNER + 0.5], axis=1)  # overlapping boxes: y1, x1, y2, x2
_POOL_IN = _normal(4, 16, 16, 8)
_POOL_OUT = tf.nn.max_pool2d(_POOL_IN, 3, 1, "SAME").numpy()
_SPARSE = _sparse(64, 512, 8000)
_BN_X = _normal(16, 8, 8, 32)

# name -> (op type, function of the numpy args, args). Each op reduces thousands of terms.
CASES: dict[str, tuple[str, Callable[..., Any], tuple[Any, ...]]] = {
    "BiasAddGrad": (
        "BiasAddGrad",
        lambda g: tf.raw_ops.BiasAddGrad(out_backprop=g),
        (_normal(512, 64),),
    ),
    "Conv2DBackpropFilter": (
        "Conv2DBackpropFilter",
        lambda x, g: tf.raw_ops.Conv2DBackpropFilter(
            input=x,
            filter_sizes=[3, 3, 8, 16],
            out_backprop=g,
            strides=[1, 1, 1, 1],
            padding="VALID",
        ),
        (_normal(8, 16, 16, 8), _normal(8, 14, 14, 16)),
    ),
    "Conv2DBackpropInput": (
        "Conv2DBackpropInput",
        lambda w, g: tf.raw_ops.Conv2DBackpropInput(
            input_sizes=[8, 16, 16, 8],
            filter=w,
            out_backprop=g,
            strides=[1, 1, 1, 1],
            padding="VALID",
        ),
        (_normal(3, 3, 8, 64), _normal(8, 14, 14, 64)),
    ),
    "Conv3DBackpropFilterV2": (
        "Conv3DBackpropFilterV2",
        lambda x, g: tf.raw_ops.Conv3DBackpropFilterV2(
            input=x, filter_sizes=[3, 3, 3, 4, 8], out_backprop=g, strides=[1] * 5, padding="VALID"
        ),
        (_normal(4, 10, 10, 10, 4), _normal(4, 8, 8, 8, 8)),
    ),
    "DepthwiseConv2dNativeBackpropFilter": (
        "DepthwiseConv2dNativeBackpropFilter",
        lambda x, g: tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=x,
            filter_sizes=[3, 3, 8, 1],
            out_backprop=g,
            strides=[1, 1, 1, 1],
            padding="VALID",
        ),
        (_normal(8, 16, 16, 8), _normal(8, 14, 14, 8)),
    ),
    "MaxPoolGrad": (
        "MaxPoolGrad",
        lambda g: tf.raw_ops.MaxPoolGrad(
            orig_input=_POOL_IN,
            orig_output=_POOL_OUT,
            grad=g,
            ksize=[1, 3, 3, 1],
            strides=[1, 1, 1, 1],
            padding="SAME",
        ),
        (_normal(4, 16, 16, 8),),
    ),
    "ResizeBilinearGrad": (
        "ResizeBilinearGrad",
        lambda g: tf.raw_ops.ResizeBilinearGrad(grads=g, original_image=_IMAGE[:, :8, :8]),
        (_normal(4, 32, 32, 8),),
    ),
    "ResizeNearestNeighborGrad": (
        "ResizeNearestNeighborGrad",
        lambda g: tf.raw_ops.ResizeNearestNeighborGrad(grads=g, size=[8, 8]),
        (_normal(4, 32, 32, 8),),
    ),
    "CropAndResizeGradImage": (
        "CropAndResizeGradImage",
        # One small box per image: the real CPU kernel races where boxes of different shards
        # overlap (see the knowledge base), so the plain reference must have none; 196 crop
        # pixels over a 3x3-pixel box still add dozens of terms into each image cell.
        lambda g: tf.raw_ops.CropAndResizeGradImage(
            grads=g,
            boxes=np.array([[0.4, 0.4, 0.5, 0.5]] * 4, np.float32),
            box_ind=np.arange(4, dtype=np.int32),
            image_size=[4, 32, 32, 8],
            T=tf.float32,
        ),
        (_normal(4, 14, 14, 8),),
    ),
    "UnsortedSegmentSum": (
        "UnsortedSegmentSum",
        lambda d, i: tf.math.unsorted_segment_sum(d, i, 100),
        (_normal(20000, 8), _ids(20000, 100)),
    ),
    "SegmentSum": (
        "SegmentSum",
        tf.math.segment_sum,
        (_normal(20000, 8), _ids(20000, 100, sort=True)),
    ),
    "UnsortedSegmentProd": (
        "UnsortedSegmentProd",
        lambda d, i: tf.math.unsorted_segment_prod(d, i, 20),
        (1 + 0.01 * _normal(4000, 8), _ids(4000, 20)),
    ),
    "ScatterNd": (
        "ScatterNd",
        lambda i, u: tf.scatter_nd(i, u, [100, 8]),
        (_ids(20000, 100).reshape(-1, 1), _normal(20000, 8)),
    ),
    "TensorScatterAdd": (
        "TensorScatterAdd",
        lambda t, i, u: tf.tensor_scatter_nd_add(t, i, u),
        (_normal(100, 8), _ids(20000, 100).reshape(-1, 1), _normal(20000, 8)),
    ),
    "SparseTensorDenseMatMul": (
        "SparseTensorDenseMatMul",
        lambda i, v, s, b: tf.sparse.sparse_dense_matmul(tf.SparseTensor(i, v, s), b),
        (*_SPARSE, _normal(512, 16)),
    ),
    "DenseBincount": (
        "DenseBincount",
        lambda a, w: tf.math.bincount(a, weights=w, minlength=100),
        (_ids(5000, 100), _normal(5000)),
    ),
    "FusedBatchNormGradV3": (
        "FusedBatchNormGradV3",
        lambda g: tf.raw_ops.FusedBatchNormGradV3(
            y_backprop=g,
            x=_BN_X,
            scale=np.ones(32, np.float32),
            reserve_space_1=_BN_X.mean((0, 1, 2)),
            reserve_space_2=_BN_X.var((0, 1, 2)),
            reserve_space_3=np.zeros(0, np.float32),
            is_training=False,
        )[:3],
        (_normal(16, 8, 8, 32),),
    ),
}


def _emulated_graph(fn: Callable[..., Any], op_type: str, args: tuple[Any, ...]) -> set[str]:
    """The op types of the emulated graph: proves the difference is emulation's doing."""
    graph = fn.get_concrete_function(*args).graph
    return {op.type for op in graph.get_operations() if "/emulate_gpu/" in op.name}


def _as_arrays(value: Any) -> list[np.ndarray]:
    return [np.asarray(v) for v in tf.nest.flatten(value)]


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want, strict=True):
        # Regrouping a float32 sum moves it by a few rounding errors of its terms.
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * (np.abs(w).max() + 1))


@pytest.mark.parametrize("name", sorted(CASES))
def test_emulated_op_is_correct_and_varies_per_execution(name: str) -> None:
    op_type, f, args = CASES[name]
    plain = _as_arrays(tf.function(f)(*args))
    with emulate.emulate_gpu():
        fn = tf.function(f)
        runs = [_as_arrays(fn(*args)) for _ in range(RUNS)]
        assert {"RandomUniform", op_type} <= _emulated_graph(fn, op_type, args)
    for run in runs:
        _close(run, plain)
    distinct = {b"".join(a.tobytes() for a in run) for run in runs}
    assert len(distinct) >= 2, f"{name}: all {RUNS} executions were bitwise identical"


def test_resource_scatter_add_regroups_the_variable_update() -> None:
    indices, updates = _ids(20000, 100), _normal(20000, 8)
    start = _normal(100, 8)
    var = tf.Variable(start)

    def step() -> Any:
        var.assign(start)
        var.scatter_add(tf.IndexedSlices(updates, indices))
        return var.read_value()

    plain = tf.function(step)().numpy()
    with emulate.emulate_gpu():
        fn = tf.function(step)
        runs = [fn().numpy() for _ in range(RUNS)]
        assert "ResourceScatterAdd" in _emulated_graph(fn, "ResourceScatterAdd", ())
    _close(runs, [plain] * RUNS)
    assert len({r.tobytes() for r in runs}) >= 2


@pytest.mark.parametrize("name", ["UnsortedSegmentSum", "SparseTensorDenseMatMul", "ScatterNd"])
def test_gradients_flow_through_emulated_forward_ops(name: str) -> None:
    _, f, args = CASES[name]
    args = tuple(tf.constant(a) for a in args)
    weight = tf.constant(_normal(*tf.function(f)(*args).shape))

    def grads(*xs: Any) -> Any:
        with tf.GradientTape() as tape:
            tape.watch([x for x in xs if x.dtype.is_floating])
            loss = tf.reduce_sum(f(*xs) * weight)
        return [g for g in tape.gradient(loss, list(xs)) if g is not None]

    plain = _as_arrays(tf.function(grads)(*args))
    with emulate.emulate_gpu():
        got = _as_arrays(tf.function(grads)(*args))
    assert len(got) == len(plain) >= 1
    _close(got, plain)


def test_outside_the_block_nothing_is_emulated() -> None:
    _, f, args = CASES["BiasAddGrad"]
    before = tf.function(f)
    plain = _as_arrays(before(*args))
    with emulate.emulate_gpu():
        traced_inside = tf.function(f)
        traced_inside(*args)
    assert not emulate.is_active()
    after = tf.function(f)
    for fn in (before, traced_inside, after):  # a graph traced inside is gated off outside
        for _ in range(3):
            assert _as_arrays(fn(*args))[0].tobytes() == plain[0].tobytes()
    assert not _emulated_graph(after, "BiasAddGrad", args)


def test_integer_ops_and_host_placed_ops_are_left_alone() -> None:
    with emulate.emulate_gpu():
        ints = tf.function(lambda d, i: tf.math.unsorted_segment_sum(d, i, 10))
        d, i = np.arange(100, dtype=np.int32), _ids(100, 10)
        assert not _emulated_graph(ints, "UnsortedSegmentSum", (d, i))

        def on_cpu(g: Any) -> Any:
            with tf.device("/CPU:0"):
                return tf.raw_ops.BiasAddGrad(out_backprop=g)

        assert not _emulated_graph(tf.function(on_cpu), "BiasAddGrad", CASES["BiasAddGrad"][2])


def test_eager_ops_are_not_emulated_and_warn() -> None:
    g = CASES["BiasAddGrad"][2][0]
    with emulate.emulate_gpu(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        emulate._warned.discard("BiasAddGrad")
        first = tf.raw_ops.BiasAddGrad(out_backprop=g).numpy()
        second = tf.raw_ops.BiasAddGrad(out_backprop=g).numpy()
    assert first.tobytes() == second.tobytes()
    messages = [str(w.message) for w in caught]
    assert sum("BiasAddGrad ran eagerly" in m for m in messages) == 1, messages


def test_emulated_op_types_follows_the_knowledge_base() -> None:
    table = emulate.emulated_op_types().set_index("op_type")
    gpu_ops = {op for c in knowledge.culprits() if c.device == "GPU" for op in c.op_types}
    assert set(table.index) == gpu_ops
    required = {
        "BiasAddGrad",
        "Conv2DBackpropFilter",
        "Conv2DBackpropInput",
        "MaxPoolGrad",
        "UnsortedSegmentSum",
        "SegmentSum",
        "ScatterNd",
        "TensorScatterAdd",
        "ResourceScatterAdd",
        "SparseTensorDenseMatMul",
        "ResizeBilinearGrad",
        "CropAndResizeGradImage",
        "DenseBincount",
    }
    assert table.loc[sorted(required), "emulated"].all()
    assert table.loc["Conv2D", "recipe"].startswith("not emulated: cuDNN algorithm choice")
    assert table.loc["ResizeNearestNeighborGrad", "with_determinism"].startswith("raises")
    assert table.loc["BiasAddGrad", "with_determinism"].startswith("runs the real op")
    from tensorflow.python.framework import op_def_registry

    assert emulate._check_recipe_table(op_def_registry.get) == []


def test_callbacks_are_removed_and_is_active_nests() -> None:
    from tensorflow.python.eager import context

    before = list(context.context().op_callbacks)
    with emulate.emulate_gpu():
        assert emulate.is_active()
        with emulate.emulate_gpu():
            assert emulate.is_active()
        assert emulate.is_active()
    assert not emulate.is_active()
    assert context.context().op_callbacks == before


# ---------------------------------------------------------------------- the CNN step

# enable_op_determinism() is process-wide and cannot be undone: these checks run in a fresh
# process.
EOD_SCRIPT = """
import json, numpy as np, tensorflow as tf, keras
import nddebug
from nddebug import emulate, knowledge
from nddebug.examples import mnist_cnn
from tests.test_emulate_gpu import CASES

tf.config.experimental.enable_op_determinism()
out = {"bitwise": {}}
for name in ("BiasAddGrad", "Conv2DBackpropFilter", "UnsortedSegmentSum", "ScatterNd",
             "MaxPoolGrad", "ResizeBilinearGrad"):
    _, f, args = CASES[name]
    plain = tf.function(f)(*args).numpy().tobytes()
    with emulate.emulate_gpu():
        fn = tf.function(f)
        runs = {fn(*args).numpy().tobytes() for _ in range(5)}
    out["bitwise"][name] = runs == {plain}

_, f, args = CASES["SparseTensorDenseMatMul"]
try:
    with emulate.emulate_gpu():
        tf.function(f)(*args)
    out["sparse"] = ["no error", ""]
except Exception as exc:
    out["sparse"] = [type(exc).__name__, str(exc)]

def upsampling_model(layer):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 2)), keras.layers.Conv2D(4, 3, padding="same"), layer,
        keras.layers.Conv2D(1, 3, padding="same")])
    model.compile(loss="mse", optimizer="sgd")
    return model

x, y = np.ones((4, 8, 8, 2), np.float32), np.ones((4, 16, 16, 1), np.float32)
# Keras 3 runs UpSampling2D(interpolation="nearest") as a repeat (Tile); nearest-neighbour
# resizing, whose gradient TF only guards on GPU, is Resizing(..., interpolation="nearest").
model = upsampling_model(keras.layers.Resizing(16, 16, interpolation="nearest"))
try:
    with emulate.emulate_gpu():
        model.train_on_batch(x, y)
    out["resize_nearest"] = ["no error", ""]
except Exception as exc:
    out["resize_nearest"] = [type(exc).__name__, str(exc)]
model.train_on_batch(x, y)  # without emulation the CPU kernel runs: no error
# The advice's replacement, bilinear upsampling, is fixed under op determinism: it trains.
with emulate.emulate_gpu():
    upsampling_model(keras.layers.UpSampling2D(interpolation="bilinear")).train_on_batch(x, y)

model = mnist_cnn.make_model(0)
x, y = mnist_cnn.make_data(32)
with emulate.emulate_gpu():
    report = nddebug.check(model.train_on_batch, x, y, repeats=3, state=model)
out["cnn_ok"] = bool(report.ok)
out["cnn_ops"] = int(report.summary["ops_traced"])
print(json.dumps(out))
"""


_CNN_STATES: dict[str, list[bytes]] = {}


def _variables(model: Any) -> list[Any]:
    """Every variable a step changes: weights, the optimizer's, and the dropout layers' seed
    generator states (not among ``model.weights``)."""
    return [*model.variables, *model.optimizer.variables]


def _weights(model: Any) -> list[bytes]:
    return [v.numpy().tobytes() for v in _variables(model)]


@pytest.fixture(scope="module")
def cnn_report() -> nddebug.Report:
    x, y = mnist_cnn.make_data(32)
    model = mnist_cnn.make_model(0)
    # The optimizer's slots made before, so that its state can be put back; no step yet: the
    # step's graph is first traced by check(), inside the block.
    model.optimizer.build(model.trainable_variables)
    before = [v.numpy() for v in _variables(model)]
    with emulate.emulate_gpu():
        report = nddebug.check(model.train_on_batch, x, y, repeats=3, state=model, quantify=False)
        _CNN_STATES["after check"] = _weights(model)
    for v, value in zip(_variables(model), before, strict=True):
        v.assign(value)
    model.train_on_batch(x, y)  # the program's own step, outside any emulation
    _CNN_STATES["after a plain step"] = _weights(model)
    return report


@pytest.mark.slow
def test_check_inside_an_emulate_gpu_block_carries_training_on_with_a_plain_step(
    cnn_report: nddebug.Report,
) -> None:
    """check()'s final ordinary step (advance=True) is the program's own step, un-emulated,
    inside ``with emulate_gpu():`` too, as with ``check(..., emulate_gpu=True)``: it ran
    emulated there, and a residual CNN's weights after the check differed from a plain
    step's in 53 of 94 tensors (probe round 40). The emulated runs do differ (the test
    above), so this compares something that could differ."""
    assert not cnn_report.ok
    after, plain = _CNN_STATES["after check"], _CNN_STATES["after a plain step"]
    differing = sum(a != b for a, b in zip(after, plain, strict=True))
    assert differing == 0, f"{differing} of {len(plain)} tensors differ from a plain step"


@pytest.mark.slow
def test_cnn_step_under_emulation_names_the_gpu_culprits(cnn_report: nddebug.Report) -> None:
    assert not cnn_report.ok
    sources = cnn_report.sources
    assert {"BiasAddGrad", "Conv2DBackpropFilter"} <= set(sources["op_type"]), str(cnn_report)
    assert set(sources["kind"]) == {"numerical"}
    # Only emulated op types start a divergence; everything else carried it.
    assert set(sources["op_type"]) <= set(emulate.RECIPES), str(cnn_report)
    assert not any(cnn_report.recordings[0].warnings), cnn_report.recordings[0].warnings
    # The emulated values are the ones training used: the divergence reached the weights.
    propagated = cnn_report.culprits[cnn_report.culprits["role"] == "propagated"]
    assert {"ReluGrad", "VariableState"} <= set(propagated["op_type"]), str(cnn_report)
    # Same op keys as without emulation (nothing tells the analysis what was emulated); a
    # "#n" tells apart the layers whose names differ only by their numbers.
    for _, row in sources.iterrows():
        assert re.sub(r"#\d+$", "", row["key"]).endswith("/" + row["op_type"]), row["key"]


@pytest.mark.slow
def test_cnn_sources_carry_the_gpu_fix(cnn_report: nddebug.Report) -> None:
    assert cnn_report.recordings[0].environment["emulated_device"] == "GPU"
    assert any("emulate_gpu" in w for w in cnn_report.warnings)
    for _, row in cnn_report.sources.iterrows():
        entry = knowledge.lookup(row["op_type"], "GPU")
        assert row["fix"] == entry.fix, row["op_type"]
        assert "enable_op_determinism" in row["fix"]
        # What the H100 measured for the entry comes with it: a finding, not only a citation.
        assert entry.measured_gpu is not None, row["op_type"]
        assert f"measured on {str(entry.measured_gpu).rstrip('. ')}" in row["evidence"]
    text = str(cnn_report)
    assert "evidence: measured on NVIDIA H100" in text


@pytest.mark.slow
def test_under_op_determinism_fixed_ops_are_real_and_guarded_ops_raise() -> None:
    result = run_python(EOD_SCRIPT)
    assert result["bitwise"] == dict.fromkeys(result["bitwise"], True), result["bitwise"]
    for case, op_type, tf_message in (
        ("sparse", "SparseTensorDenseMatMul", emulate.TF_MESSAGES["SparseTensorDenseMatMul"]),
        (
            "resize_nearest",
            "ResizeNearestNeighborGrad",
            emulate.TF_MESSAGES["ResizeNearestNeighborGrad"],
        ),
    ):
        kind, message = result[case]
        assert kind == "UnimplementedError", result[case]
        assert tf_message in message and "nddebug advice" in message, message
        assert knowledge.lookup(op_type, "GPU").fix in message
    assert result["cnn_ok"] and result["cnn_ops"] > 100


def test_an_op_listed_for_cpu_and_gpu_gets_the_gpu_advice_under_emulation() -> None:
    """ResourceScatterAdd has a CPU entry and a GPU entry: a run that rehearses a GPU must be
    advised as on a GPU, and check(emulate_gpu=True) must not leave the emulation on."""
    rng = np.random.default_rng(3)
    table = tf.Variable(tf.zeros([64, 16]))
    ids = tf.constant(rng.integers(0, 64, size=4096), tf.int32)
    rows = tf.constant(rng.standard_normal((4096, 16)).astype(np.float32))

    @tf.function
    def step() -> None:
        table.scatter_add(tf.IndexedSlices(rows, ids))

    report = nddebug.check(step, repeats=3, state=[table], emulate_gpu=True, quantify=False)
    assert not emulate.is_active()
    row = report.sources[report.sources["op_type"] == "ResourceScatterAdd"].iloc[0]
    assert row["kind"] == "numerical", str(report)
    assert row["fix"] == knowledge.lookup("ResourceScatterAdd", "GPU").fix
    assert row["fix"] != knowledge.lookup("ResourceScatterAdd", "CPU").fix


def test_every_op_the_gpu_showed_non_deterministic_is_emulated_or_says_why_not() -> None:
    """Held against the H100 census (benchmarks/results/census_gpu.csv): an op that varied on a
    real GPU must be emulated, or be in NOT_EMULATED with a reason."""
    import csv
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "census_gpu.csv"
    with path.open(encoding="utf-8", newline="") as f:
        varied = {
            r["op_type"]
            for r in csv.DictReader(f)
            if r["ran_on"] == "GPU"
            and r["determinism"] == "off"
            and r["deterministic"] == "False"
            and r["kind"] == "numerical"
        }
    assert {"BiasAddGrad", "SegmentMean", "ResourceScatterNdAdd"} <= varied
    table = emulate.emulated_op_types().set_index("op_type")
    missing = sorted(varied - set(table.index))
    assert missing == []
    unexplained = sorted(
        op for op in varied if not table.loc[op, "emulated"] and op not in emulate.NOT_EMULATED
    )
    assert unexplained == []
    # Emulated findings are presented as possibilities, with what a real GPU showed.
    emulated = table[table["emulated"]]
    assert emulated["finding"].eq(emulate.FINDING).all()
    assert "could diverge on a GPU when the non-deterministic kernel is chosen" in emulate.FINDING
    assert "cuDNN 9.19" in table.loc["Conv2DBackpropInput", "measured_gpu"]


def test_new_gpu_culprits_are_emulated() -> None:
    data, ids = _normal(20000, 8), _ids(20000, 100, sort=True)
    fn = tf.function(tf.math.segment_mean)
    want = tf.math.segment_mean(data, ids).numpy()
    with nddebug.emulate_gpu():
        outs = [fn(data, ids).numpy() for _ in range(RUNS)]
    for out in outs:
        _close([out], [want])
    assert len({o.tobytes() for o in outs}) >= 2

    var = tf.Variable(tf.zeros([100, 8]))
    indices, updates = _ids(20000, 100).reshape(-1, 1), _normal(20000, 8)

    @tf.function
    def step() -> Any:
        var.assign(tf.zeros([100, 8]))
        var.scatter_nd_add(indices, updates)
        return var.read_value()

    want = tf.tensor_scatter_nd_add(tf.zeros([100, 8]), indices, updates).numpy()
    with nddebug.emulate_gpu():
        outs = [step().numpy() for _ in range(RUNS)]
    for out in outs:
        _close([out], [want])
    assert len({o.tobytes() for o in outs}) >= 2


def test_the_emulations_own_masks_are_no_random_op_of_the_loop() -> None:
    """An emulated op inside a while loop's body: its random mask (nddebug's) was listed as a
    RandomUniform in the loop, a risk of parallel iterations in a program with no random op."""
    seg = tf.constant([0, 1, 2, 3])

    @tf.function
    def step(x):
        def body(i, h):
            return i + 1, h + 0.1 * tf.math.unsorted_segment_sum(h, seg, 4)

        return tf.while_loop(lambda i, h: i < 5, body, [0, x])[1]

    report = nddebug.check(step, tf.ones((4, 3)), repeats=3, emulate_gpu=True)
    assert report.summary["risks"] == ["UnsortedSegmentSum"], str(report)


def test_a_pretraced_function_the_step_calls_is_said_not_emulated() -> None:
    """emulate_gpu() rewrites graphs as they are traced: a tf.function traced before the check
    and called by a Python step runs as one call it cannot look into, its culprits as on the
    CPU. The verdict named no source and nothing said the rehearsal missed them (probe round
    31, F5); a warning now names them and what to do."""
    # 64 segments: two runs' random splits give all 4 sums of 1,024 terms the same float32
    # bits once in ~150 pairs (the test failed twice in the suite), all 64 never.
    ids = tf.constant(np.arange(4096) % 64, tf.int32)

    @tf.function
    def segsum(x):
        return tf.math.unsorted_segment_sum(x * 1e3, ids, 64)

    x = tf.random.stateless_uniform([4096], seed=[1, 2])
    segsum(x)  # traced before the check
    report = nddebug.check(lambda x: segsum(x), x, repeats=2, emulate_gpu=True)
    said = [w for w in report.warnings if w.startswith("emulate_gpu() did not reach")]
    assert len(said) == 1 and "UnsortedSegmentSum in segsum" in said[0], report.warnings
    # Passed itself, it is traced in the check and emulated: no such warning, a source.
    report = nddebug.check(segsum, x, repeats=2, emulate_gpu=True)
    assert not any(w.startswith("emulate_gpu() did not reach") for w in report.warnings)
    assert "UnsortedSegmentSum" in set(report.sources["op_type"]), str(report)


def test_check_with_seed_says_the_emulated_order_was_not_compared() -> None:
    """check(emulate_gpu=True, seed=S) resets TensorFlow's random kernels before every run
    (tf.random.set_seed), the emulation's masks among them: every run replayed one emulated
    order, and the report said "No traced op differed" where the same check without seed=
    named UnsortedSegmentSum (probe round 36, finding 5). It says what it could not compare."""
    rng = np.random.default_rng(0)
    emb = tf.Variable(rng.normal(size=(50, 8)).astype("float32"))
    seg = tf.constant(np.sort(rng.integers(0, 10, size=200)), tf.int32)
    ids = tf.constant(rng.integers(0, 50, size=200), tf.int32)

    @tf.function
    def step():
        s = tf.math.unsorted_segment_sum(tf.gather(emb, ids) * 1.1, seg, 10)
        emb.assign_sub(tf.reduce_sum(s) * 1e-3 * tf.ones_like(emb))

    report = nddebug.check(step, state=emb, repeats=3, emulate_gpu=True, seed=3)
    assert not report.ok
    assert any("emulated GPU accumulation order" in x for x in report.not_compared), report


def test_an_emulated_op_that_pfor_vectorized_is_named_not_its_mask() -> None:
    """tape.jacobian (pfor) through a while loop under emulate_gpu(): pfor vectorizes the
    emulation's ops too, without op callbacks, and the emulation's random mask was named the
    source, as the user's unseeded RandomUniform with the advice to seed it (probe round 38).
    It is recorded as the op it emulates."""
    jacobian, w = jacobian_through_a_loop()

    report = nddebug.check(jacobian, state=w, repeats=3, emulate_gpu=True)
    sources = report.sources
    assert len(sources) >= 1 and "RandomUniform" not in set(sources["op_type"]), str(report)
    assert set(sources["kind"]) != {"random"}, str(report)


def test_the_gradients_of_the_emulations_masks_are_no_rows_of_the_report() -> None:
    """The gradient of an emulated op's input flows through the emulation's masks, and
    TensorFlow's gradient ops of those masks (".../UnsortedSegmentSum/emulate_gpu/
    SelectV2_grad/SelectV2") were listed as propagated ops of the user's step (probe round
    38). They are nddebug's: the emulated op is the source and the user's ops carry it."""
    rng = np.random.RandomState(0)
    x = tf.constant(rng.randn(64, 4).astype("float32"))
    ids = tf.constant(rng.randint(0, 4, 64))
    w = tf.Variable(rng.randn(4, 4).astype("float32"))

    @tf.function
    def step(i):
        with tf.GradientTape() as tape:
            h = x @ w
            # In a branch: its gradient is a function of its own, and records the masks'.
            seg = tf.cond(
                i > 0,
                lambda: tf.math.unsorted_segment_sum(h * 1e3, ids, 4),
                lambda: tf.zeros([4, 4]),
            )
            loss = tf.reduce_sum(seg**2)
        w.assign_sub(1e-6 * tape.gradient(loss, w))
        return loss

    report = nddebug.check(step, tf.constant(1), state=w, repeats=4, emulate_gpu=True)
    rows = report.culprits
    assert list(report.sources["op_type"]) == ["UnsortedSegmentSum"], str(report)
    assert (rows["role"] == "propagated").any(), str(report)  # the gradient carries it
    assert not rows["op_name"].str.contains("/emulate_gpu/").any(), str(report)
