"""The GPU tier: what nddebug finds on a real GPU, as measured on an H100 (see docs/concepts.md).

Skipped where TensorFlow sees no GPU (CI, the CPU machines). On a GPU machine these run with
the rest of the suite; ``pytest -m gpu`` runs them alone. The other tests that assert CPU facts
pin the CPU (tests/helpers.py: on_cpu, CPU_ONLY), so the whole suite passes on both.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import nddebug
from nddebug.digest import digest_numpy, eager_digest_fn
from nddebug.tracer import digest_eager_tensor
from tests.gpu_steps import cnn_report, scatter_report, segment_report
from tests.helpers import run_python
from tests.test_digest import DTYPES, random_array

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not tf.config.list_physical_devices("GPU"),
        reason="no GPU visible to TensorFlow: the GPU tier asserts what a real GPU does",
    ),
]


def _sources(report: nddebug.Report) -> set[str]:
    return set(report.sources["op_type"])


def _on_gpu(report: nddebug.Report) -> None:
    devices = set(report.sources["device"])
    assert all("GPU" in d.upper() for d in devices), devices


def test_the_seed000_cnn_diverges_in_bias_add_grad_and_names_quiet_conv_gradients() -> None:
    report = cnn_report()
    assert not report.ok
    sources = _sources(report)
    # BiasAddGrad's atomics diverge on every GPU measured. Whether the convolution gradients
    # do depends on the algorithm cuDNN picks on that machine: one H100 (2026-11-22) gave
    # Conv2DBackpropFilter 5,568 ULP apart, another (2026-11-27, same driver) picked a
    # deterministic one (a plain step's kernel gradients: 1 distinct in 20 calls, its bias
    # gradients 20 in 20). Where a convolution gradient was no source, the report must say
    # that it ran without diverging, next to the verdict.
    assert "BiasAddGrad" in sources, str(report)
    assert sources <= {"BiasAddGrad", "Conv2DBackpropFilter", "Conv2DBackpropInput"}, str(report)
    if "Conv2DBackpropFilter" not in sources:
        quiet = [n for n in report.verdict_notes if n.startswith("no difference seen")]
        assert quiet and "Conv2DBackpropFilter" in quiet[0], str(report)
    _on_gpu(report)
    # Atomic-add reordering: rounding-sized against the gradients' own scale.
    rel = report.sources["rel_diff"].dropna()
    assert len(rel) and (rel > 0).all() and (rel < 1e-2).all(), str(report)


def test_unsorted_segment_sum_is_the_one_source() -> None:
    report = segment_report()
    assert _sources(report) == {"UnsortedSegmentSum"}, str(report)
    _on_gpu(report)


def test_gather_backward_and_tensor_scatter_add_are_the_sources() -> None:
    report = scatter_report()
    assert _sources(report) == {"UnsortedSegmentSum", "TensorScatterAdd"}, str(report)
    _on_gpu(report)


def test_op_determinism_makes_every_step_ok() -> None:
    # enable_op_determinism() is process-wide with no "off": a fresh process with the GPU.
    result = run_python(
        """
import json
import tensorflow as tf
from tests.gpu_steps import cnn_report, scatter_report, segment_report
tf.config.experimental.enable_op_determinism()
reports = {"cnn": cnn_report(), "segment": segment_report(), "scatter": scatter_report()}
print(json.dumps({
    "gpu": bool(tf.config.list_logical_devices("GPU")),
    "determinism": [r.summary["op_determinism"] for r in reports.values()],
    "culprits": {name: list(r.culprits["op_type"]) for name, r in reports.items()},
}))
"""
    )
    assert result["gpu"] and result["determinism"] == [True, True, True], result
    assert result["culprits"] == {"cnn": [], "segment": [], "scatter": []}, result


# Sizes in elements: one, a partial word, a block boundary, and more than a million.
_SIZES = [1, 3, 4097, 1_000_003]


@pytest.mark.parametrize("name", DTYPES)
def test_device_digests_equal_the_host_reference(name: str) -> None:
    for n in _SIZES:
        a = random_array(name, n)
        expected = digest_numpy(a)
        with tf.device("/GPU:0"):
            t = tf.identity(tf.constant(a))
        assert "GPU" in t.device.upper(), t.device
        for shape in (tuple(a.shape), None):  # the static and the shape-agnostic plans
            got = eager_digest_fn(t.dtype, shape, False)(t).numpy()
            assert (int(got[0]), int(got[1])) == expected, (name, n, shape)
        assert digest_eager_tensor(t) == expected, (name, n)  # the tracer's path
        matrix = a[: n - n % 2].reshape(2, -1) if n > 1 else a.reshape(1, 1)
        with tf.device("/GPU:0"):
            m = tf.identity(tf.constant(matrix))
        assert digest_eager_tensor(m) == digest_numpy(matrix), (name, n, "rank 2")


def test_tracing_leaves_gpu_steps_bitwise_unchanged_under_op_determinism() -> None:
    """Observe without disturbing, on the GPU: with op determinism on (so that a step gives
    the same bits twice by itself), each transparency workload gives, traced, the bits it
    gives plain. A workload the plain program cannot run here is reported, not judged."""
    result = run_python(
        """
import json
import tensorflow as tf
tf.config.experimental.enable_op_determinism()
import nddebug
from tests.test_transparency import WORKLOADS, _bits
found = {}
for name, make in sorted(WORKLOADS.items()):
    try:
        plain_step, args, plain_state = make()
        plain = [_bits(plain_step(*args), plain_state) for _ in range(2)]
    except Exception as exc:
        found[name] = "plain program fails: " + type(exc).__name__
        continue
    step, args, state = make()
    with nddebug.trace() as rec:
        traced = [_bits(step(*args), state) for _ in range(2)]
    after = _bits(step(*args), state) == _bits(plain_step(*args), plain_state)
    found[name] = "equal" if traced == plain and after and rec.events else "differ"
print(json.dumps({"gpu": bool(tf.config.list_logical_devices("GPU")), "found": found}))
"""
    )
    assert result["gpu"], result
    judged = {n: v for n, v in result["found"].items() if not v.startswith("plain program")}
    assert len(judged) >= 8 and set(judged.values()) == {"equal"}, result["found"]
