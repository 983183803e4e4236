"""The native GPU digest kernels (nddebug/native/nddebug_digest.cu).

On every machine: the shipped PTX is what the kernel source compiles to (where NVRTC is
installed), and without a GPU the native library reports no GPU kernels, so the CPU and
pure-TF paths stay as they were. On a GPU machine: the digests that the fused op and the
digest op compute on the device equal the host reference for every dtype and for shapes that
cover each kernel path (one block; many blocks; a partial last word; an unaligned slice), in
eager mode and in a graph, and the rows of the fused op and the record op reach the buffer
with the input digests in place.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from nddebug import native
from nddebug.digest import digest_numpy
from nddebug.tracer import transport
from tests.test_digest import DTYPES, random_array

HAS_GPU = bool(tf.config.list_physical_devices("GPU"))
gpu_only = pytest.mark.skipif(not HAS_GPU, reason="no GPU visible to TensorFlow")


def test_shipped_ptx_is_what_the_cuda_source_compiles_to() -> None:
    nvrtc = native._find_nvrtc()
    if nvrtc is None:
        pytest.skip("NVRTC not installed (pip install nvidia-cuda-nvrtc-cu12)")
    shipped = native.PTX.read_text(encoding="utf-8")
    release = native.nvrtc_release(nvrtc)
    if f"release {release}," not in shipped:
        pytest.skip(f"NVRTC {release} here; the PTX was made by another release")
    assert native.compile_ptx(nvrtc) == shipped, (
        "nddebug_digest.ptx is stale: run `python -m nddebug.native ptx`"
    )


def test_the_ptx_defines_the_three_kernels() -> None:
    text = native.PTX.read_text(encoding="utf-8")
    for kernel in ("nddebug_init_weights", "nddebug_digest_parts", "nddebug_finish"):
        assert f".entry {kernel}(" in text


@pytest.mark.skipif(HAS_GPU, reason="asserts the fallback where there is no GPU")
def test_without_a_gpu_the_library_has_no_gpu_kernels_and_says_nothing() -> None:
    lib = native.load()
    if lib is None:
        pytest.skip(f"native library unavailable here: {native.problem()}")
    assert lib.gpu is False
    assert native.problem() == ""
    # The switch the GPU probe reads (it must not probe inside a recording block).
    assert lib.is_active() is False
    lib.set_active(True)
    try:
        assert lib.is_active() is True
    finally:
        lib.set_active(False)


# Sizes in elements, per dtype: empty, one element, a partial word, a block's worth, just past
# the one-block limit (2**15 words), several blocks, and a large odd size.
SIZES = [0, 1, 3, 4097, 2**15 * 8 // 4 + 1, 300_001, 2_000_003]


def _row_digests(op_id: int) -> list[tuple[list, list]]:
    return [(outs, ins) for i, outs, ins in transport.drain() if i == op_id]


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_kernel_digests_equal_the_host_reference(dtype: str) -> None:
    lib = native.load()
    assert lib is not None and lib.gpu, native.problem()
    transport.drain()
    transport.set_active(True)
    try:
        for i, n in enumerate(SIZES):
            host = random_array(dtype, n)
            want = digest_numpy(host)
            with tf.device("/GPU:0"):
                x = tf.constant(host)
                (d,) = lib.digest_record(1000 + i, [x], [])
            assert tuple(int(v) for v in d.numpy()[0]) == want, (dtype, n)
            ((outs, ins),) = _row_digests(1000 + i)
            assert [tuple(o) for o in outs] == [want] and ins == []
    finally:
        transport.set_active(False)


@gpu_only
def test_gpu_kernel_unaligned_slice_and_inputs_in_the_row() -> None:
    lib = native.load()
    assert lib is not None and lib.gpu
    host = np.random.default_rng(1).integers(0, 255, 1_000_003, dtype=np.uint8)
    transport.drain()
    transport.set_active(True)
    try:
        with tf.device("/GPU:0"):
            whole = tf.constant(host)
            part = whole[3:]  # may share the buffer at an odd offset
            (d0,) = lib.digest_record(7, [part], [])
            d1, _ = lib.digest_record(8, [whole, part], [d0], [(5, 6)], [0])
        rows = {i: (outs, ins) for i, outs, ins in transport.drain()}
    finally:
        transport.set_active(False)
    want_part, want_whole = digest_numpy(host[3:]), digest_numpy(host)
    assert tuple(rows[7][0][0]) == want_part
    assert [tuple(o) for o in rows[8][0]] == [want_whole, want_part]
    # The static pair at position 0, then the dynamic one (d0's value, read on the device).
    assert [tuple(i) for i in rows[8][1]] == [(5, 6), want_part]
    assert tuple(int(v) for v in d1.numpy()[0]) == want_whole


@gpu_only
def test_gpu_kernels_in_a_graph_outside_and_inside_a_block() -> None:
    import nddebug

    def body(x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.nn.relu(tf.matmul(x, x)) * 2.0)

    x = tf.random.stateless_uniform([256, 256], seed=[1, 2])
    plain = tf.function(body)(x).numpy()
    step = tf.function(body)  # traced first inside check(), so instrumented
    before = dict(transport.COUNTS)
    report = nddebug.check(lambda: step(x), repeats=3)
    assert report.ok, report
    assert step(x).numpy() == plain  # outside the block: the same value as uninstrumented
    # The rows came through drains of the buffer, not one host callback per op.
    assert transport.COUNTS["drains"] > before.get("drains", 0)
    assert transport.COUNTS["callbacks"] == before.get("callbacks", 0)


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_digest_op_equals_the_host_reference_and_reads_nothing_with_the_gate_off(
    dtype: str,
) -> None:
    # NddebugDigest digests what feeds a recorded op from outside it (a function's arguments):
    # on the GPU, where the tensors live. int32 and strings are in host memory there.
    lib = native.load()
    assert lib is not None and lib.gpu, native.problem()
    arrays = [random_array(dtype, n) for n in (0, 3, 2**15 * 8 // 4 + 1, 300_001)]
    with tf.device("/GPU:0"):
        xs = [tf.constant(a) for a in arrays]
        on = lib.digest(tf.constant(1), xs)
        off = lib.digest(tf.constant(0), xs)
    assert [tuple(r) for r in on.numpy().tolist()] == [digest_numpy(a) for a in arrays]
    assert off.numpy().tolist() == [[0, 0]] * len(arrays)


@gpu_only
def test_gpu_record_op_rows_hold_the_device_digests_and_nothing_outside_a_block() -> None:
    lib = native.load()
    assert lib is not None and lib.gpu
    rng = np.random.default_rng(3)
    a = rng.standard_normal(70_001).astype(np.float32)
    b = rng.integers(0, 9, 33, dtype=np.int64)
    transport.drain()
    transport.set_active(True)
    try:
        with tf.device("/GPU:0"):
            ta, tb = tf.constant(a), tf.constant(b)
            both = lib.digest(tf.constant(1), [ta, tb])  # [2, 2] on the device
            (da,) = lib.digest_record(21, [ta], [])  # [1, 2]
            lib.record(22, [da], [both])
        rows = {i: (outs, ins) for i, outs, ins in transport.drain()}
    finally:
        transport.set_active(False)
    want_a, want_b = digest_numpy(a), digest_numpy(b)
    assert [tuple(o) for o in rows[22][0]] == [want_a]
    assert [tuple(i) for i in rows[22][1]] == [want_a, want_b]
    with tf.device("/GPU:0"):
        lib.record(23, [da], [both])  # no block: no row
    assert [r for r in transport.drain() if r[0] == 23] == []
