"""Properties of the bitwise digest (nddebug.digest), on real TensorFlow, without mocks.

No digest value is hard-coded: the TF kernels are compared with the numpy reference
``digest_numpy`` bit for bit, and the reference is checked against properties (what must change
the digest, and what by definition must not).
"""

from __future__ import annotations

import os
import platform
import zlib

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug import digest as dg
from nddebug.digest import BLOCK, build_digest, digest_numpy, digestible, eager_digest_fn
from nddebug.tracer import digest_eager_tensor

DTYPES = [
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "complex64",
    "complex128",
]


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def random_array(name: str, n: int, seed: int | None = None) -> np.ndarray:
    """n elements of dtype ``name`` with random bits (floats include NaNs, infs, subnormals)."""
    dt = np_dtype(name)
    rng = np.random.default_rng(zlib.crc32(f"{name}:{n}".encode()) if seed is None else seed)
    if name == "bool":
        return rng.integers(0, 2, n).astype(bool)
    return rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt)


# Sizes around the block boundaries, as (label, target size in bytes, rounding to elements).
_FLOOR, _CEIL = "floor", "ceil"
_SIZES = [
    ("0B", 0, _FLOOR),
    ("1el", None, None),
    ("7B", 7, _FLOOR),
    ("8B", 8, _FLOOR),
    ("9B", 9, _CEIL),
    ("BLOCK*8-1B", BLOCK * 8 - 1, _FLOOR),
    ("BLOCK*8B", BLOCK * 8, _FLOOR),
    ("BLOCK*8+1B", BLOCK * 8 + 1, _CEIL),
    # The zero-padded last word completes the 2nd block (the static plan once failed here).
    ("2*BLOCK*8-7B", 2 * BLOCK * 8 - 7, _FLOOR),
    ("3blocks+tail", 3 * BLOCK * 8 + 13, _CEIL),
    ("3MiB+5B", (3 << 20) + 5, _CEIL),
]


def _elements(itemsize: int, target: int | None, rounding: str | None) -> int:
    if target is None:
        return 1
    return target // itemsize if rounding == _FLOOR else -(-target // itemsize)


# The block plan depends on the byte count only, the dtype on how bytes are read: every dtype
# is run at every size through the shape-agnostic paths (one trace per dtype), and through the
# static-shape plan (one trace per shape, ~0.1 s each) at every size for dtypes of width 1,
# 4 and 8 bytes, and at the sizes that exercise a partial word, a block boundary and a tail for
# the others (bool's cast, 16-byte complex, the other bitcasts).
STATIC_ALL_SIZES = {"uint8", "float32", "float64"}
STATIC_FEW_SIZES = {"1el", "BLOCK*8-1B", "3blocks+tail"}  # BLOCK*8-1B: see 2*BLOCK*8-7B
# Dtypes also digested inside a larger graph (a tensor produced by another graph op).
IN_GRAPH = {"uint8", "float32"}


def _cases(static: bool) -> list:
    params = []
    for name in DTYPES:
        itemsize = np_dtype(name).itemsize
        seen = set()
        for label, target, rounding in _SIZES:
            n = _elements(itemsize, target, rounding)
            if n in seen:
                continue
            if static and name not in STATIC_ALL_SIZES and label not in STATIC_FEW_SIZES:
                continue
            if static and label == "3MiB+5B" and name != "uint8":
                continue  # many blocks: same plan as 3blocks+tail; once is enough (~0.5 s)
            seen.add(n)
            nbytes = n * itemsize
            params.append(pytest.param(name, n, id=f"{name}-{label}-{n}el-{nbytes}B"))
    return params


def pair(t) -> tuple[int, int]:
    values = t.numpy()
    assert values.shape == (2,) and values.dtype == np.int64
    return int(values[0]), int(values[1])


def pairs(t) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in t.numpy().tolist()]


# ------------------------------------------------------------------ TF == numpy, bit for bit


@pytest.mark.parametrize(("name", "n"), _cases(static=True))
def test_static_shape_paths_match_numpy(name, n):
    a = random_array(name, n)
    ref = digest_numpy(a)
    t = tf.constant(a)
    assert t.dtype == tf.as_dtype(np_dtype(name))
    for use_matmul in (True, False):
        # A tf.function with the full static shape, called eagerly (one tensor at a time;
        # the tracer digests an op's device tensors together, test_device_digests_...).
        fn = eager_digest_fn(t.dtype, tuple(a.shape), use_matmul)
        assert fn.input_signature[0].shape == a.shape
        assert pair(fn(t)) == ref
        # build_digest itself, run op by op eagerly.
        assert pair(build_digest(t, use_matmul)) == ref
    if name in IN_GRAPH:
        # Inside a larger graph, on a tensor another graph op produced (as graph
        # instrumentation does), both kernels in one graph.
        @tf.function(input_signature=[tf.TensorSpec(a.shape, t.dtype)], autograph=False)
        def graph_digests(x):
            y = tf.identity(x)
            return tf.stack([build_digest(y, use_matmul=True), build_digest(y, use_matmul=False)])

        assert pairs(graph_digests(t)) == [ref, ref]


@pytest.mark.parametrize("native_op", [True, False], ids=["native op", "TF ops"])
def test_device_digests_of_several_tensors_in_one_call_match_numpy(native_op, monkeypatch):
    # What the tracer runs for an op's tensors on a GPU (tracer.eager.device_digests): one
    # call digesting them all, one [n, 2] result: the native NddebugDigest op where the
    # library runs on the device, else TF ops. Here both, on the CPU.
    from nddebug import native
    from nddebug.tracer.eager import device_digests

    if native_op:
        _native()  # skips where the native ops are off or a GPU decides the path

        def no_tf_ops(*args):
            raise AssertionError("the TF-op digests ran where the native op has a kernel")

        monkeypatch.setattr(dg, "eager_digests_fn", no_tf_ops)
    else:
        monkeypatch.setenv(native.ENV, "0")
    arrays = [random_array(*p.values) for p in _cases(static=True)[:40]]
    tensors = [tf.constant(a) for a in arrays]
    got = device_digests("/CPU:0", tensors)
    assert got == [digest_numpy(a) for a in arrays]
    assert len({(t.dtype, tuple(t.shape)) for t in tensors}) > 10  # many dtypes and shapes


_UNKNOWN_SIZE_FNS: dict = {}


def _unknown_size_fn(dtype):
    """A graph that knows the rank (1) but not the size of its input, both kernels."""
    if dtype not in _UNKNOWN_SIZE_FNS:

        @tf.function(input_signature=[tf.TensorSpec([None], dtype)], autograph=False)
        def unknown_size(x):
            return tf.stack([build_digest(x, True), build_digest(x, False)])

        _UNKNOWN_SIZE_FNS[dtype] = unknown_size
    return _UNKNOWN_SIZE_FNS[dtype]


@pytest.mark.parametrize(("name", "n"), _cases(static=False))
def test_unknown_shape_paths_match_numpy(name, n):
    a = random_array(name, n)
    ref = digest_numpy(a)
    t = tf.constant(a)
    for use_matmul in (True, False):
        # tf.function with input_signature TensorSpec(None, dtype): unknown rank and size.
        fn = eager_digest_fn(t.dtype, None, use_matmul)
        assert fn.input_signature[0].shape.rank is None
        assert pair(fn(t)) == ref
        # Rank > 1 through the same graph: the digest is over the row-major bytes.
        if n % 2 == 0 and n:
            assert pair(fn(tf.reshape(t, [2, n // 2]))) == ref
    if name in IN_GRAPH:
        assert pairs(_unknown_size_fn(t.dtype)(t)) == [ref, ref]


@pytest.mark.parametrize(("name", "n"), _cases(static=False))
def test_digest_eager_tensor_matches_numpy(name, n):
    a = random_array(name, n)
    assert digest_eager_tensor(tf.constant(a)) == digest_numpy(a)


def test_traced_graph_op_at_block_boundary_is_recorded():
    # 8191 float32 = 4095.5 words: the zero-padded last word completes the first block. The
    # static plan used to raise here and the op was dropped with a "could not be recorded" warning.
    @tf.function
    def double(x):
        return x * 2.0

    x = tf.constant(random_array("float32", 2 * BLOCK - 1))
    with nddebug.trace() as rec:
        y = double(x)
    assert not [w for w in rec.warnings if "could not be recorded" in w], rec.warnings
    muls = [e for e in rec.events if rec.ops[e.op_id].op_type == "Mul"]
    assert len(muls) == 1
    assert muls[0].digests == [digest_numpy(y.numpy())]


# ------------------------------------------------------------------ helpers for the properties


def digest_all(a: np.ndarray) -> tuple[int, int]:
    """The digest by the numpy reference, checked equal to every TF path (shape-agnostic graphs
    with both kernels, and the tracer's eager entry point)."""
    ref = digest_numpy(a)
    t = tf.constant(a)
    got = [pair(eager_digest_fn(t.dtype, None, mm)(t)) for mm in (True, False)]
    got.append(digest_eager_tensor(t))
    assert got == [ref] * len(got), f"TF paths disagree with numpy for {a.dtype}{a.shape}"
    return ref


def naive_weighted_sum32(a: np.ndarray) -> int:
    """What a 32-bit position-weighted checksum with odd weights would compute."""
    u = np.frombuffer(np.ascontiguousarray(a).tobytes(), dtype="<u4").astype(np.uint64)
    w = (np.arange(u.size, dtype=np.uint64) * np.uint64(2654435761)) | np.uint64(1)
    return int((u * w).sum(dtype=np.uint64) & np.uint64(0xFFFFFFFF))


# ------------------------------------------------------------------ order sensitivity


def distinct_elements(rng: np.random.Generator, name: str, n: int) -> np.ndarray:
    """n elements of dtype ``name`` with pairwise different bytes, in random order."""
    dt = np_dtype(name)
    bits = 8 * dt.itemsize
    if bits <= 32:
        u = rng.choice(2**bits, n, replace=False).astype(f"<u{dt.itemsize}")
    else:
        u = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    assert np.unique(u).size == n
    return u.view(dt)


@pytest.mark.parametrize("name", ["float32", "uint8", "float16", "int64", "complex64"])
def test_permutations_of_distinct_elements_change_the_digest(name):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    checked = 0
    for case in range(60):
        n = int(rng.choice([2, 3, 7, 9, 2 * BLOCK - 1, 2 * BLOCK + 3, int(rng.integers(2, 3000))]))
        if name == "uint8":
            n = min(n, 256)
        a = distinct_elements(rng, name, n)
        # Every 10th case also through every TF path.
        digest = digest_numpy if case % 10 else digest_all
        base = digest(a)
        i, j = rng.choice(n, 2, replace=False)
        swapped = a.copy()
        swapped[[i, j]] = swapped[[j, i]]
        k = int(rng.integers(1, n))
        variants = {"swap": swapped, "reverse": a[::-1], f"roll {k}": np.roll(a, k)}
        for what, b in variants.items():
            assert digest(b) != base, f"{what} of {n} distinct {name} not detected"
            checked += 1
    assert checked == 180


@pytest.mark.parametrize(
    ("i", "j"),
    [
        (0, 1),
        (2 * BLOCK - 1, 2 * BLOCK),
        (0, 2 * BLOCK),
        (5, 2 * BLOCK + 5),
        (4 * BLOCK, 4 * BLOCK + 2),
    ],
    ids=["same-word", "across-block-boundary", "same-column-next-block", "blocks", "tail"],
)
def test_swap_at_structural_positions(i, j):
    a = np.arange(4 * BLOCK + 3, dtype=np.float32)  # 2 full blocks of words + a padded tail
    b = a.copy()
    b[[i, j]] = b[[j, i]]
    assert digest_all(b) != digest_all(a)


# ------------------------------------------------------------------ sign of zero


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("n", [2, 4, 2 * BLOCK, 8 * BLOCK + 6])
def test_negative_zero_is_visible(name, n):
    dt = np_dtype(name)
    zeros = np.zeros(n, dt)
    base = digest_all(zeros)
    rng = np.random.default_rng(n)
    one = zeros.copy()
    one[rng.integers(n)] = -0.0
    two = zeros.copy()
    two[rng.choice(n, 2, replace=False)] = -0.0
    every = np.full(n, -0.0, dt)
    assert np.signbit(every).all() and not np.signbit(zeros).any()
    for what, b in {"one": one, "two": two, "all": every}.items():
        assert digest_all(b) != base, f"-0.0 in {what} of {n} {name} elements not detected"
    assert digest_numpy(one) != digest_numpy(two)
    if n > 2:
        assert digest_numpy(two) != digest_numpy(every)


def test_negative_zero_everywhere_defeats_a_naive_32bit_sum_but_not_the_digest():
    # Sanity check of the test pattern itself: an even number of sign-bit flips cancels in
    # any 32-bit weighted sum with odd weights (2**31 * even == 0 mod 2**32).
    zeros = np.zeros(2 * BLOCK + 2, np.float32)
    negs = np.full(2 * BLOCK + 2, -0.0, np.float32)
    assert naive_weighted_sum32(zeros) == naive_weighted_sum32(negs)
    assert digest_all(zeros) != digest_all(negs)


# ------------------------------------------------------------------ NaN payloads


@pytest.mark.parametrize(
    ("bits_a", "bits_b"),
    [
        (0x7FC00001, 0x7FC00002),  # two quiet NaNs, different payloads
        (0x7FC00000, 0x7F800001),  # quiet vs signalling
        (0x7FC00000, 0xFFC00000),  # sign of a NaN
        (0x7FA00000, 0x7F800001),  # two signalling NaNs
    ],
    ids=["payload", "quiet-vs-signalling", "sign", "signalling-payload"],
)
@pytest.mark.parametrize(
    "where", [0, 2 * BLOCK + 1, 4 * BLOCK + 2], ids=["first", "block2", "tail"]
)
def test_nan_payloads_float32(bits_a, bits_b, where):
    base = np.arange(4 * BLOCK + 3, dtype=np.float32).view(np.uint32)
    a, b = base.copy(), base.copy()
    a[where], b[where] = bits_a, bits_b
    fa, fb = a.view(np.float32), b.view(np.float32)
    assert np.isnan(fa[where]) and np.isnan(fb[where])
    assert digest_all(fa) != digest_all(fb)


@pytest.mark.parametrize(
    ("name", "uint", "bits_a", "bits_b"),
    [
        ("float64", np.uint64, 0x7FF8000000000001, 0x7FF8000000000002),
        ("float64", np.uint64, 0x7FF8000000000000, 0x7FF0000000000001),
        ("float16", np.uint16, 0x7E01, 0x7E02),
        ("float16", np.uint16, 0x7E00, 0x7C01),
        ("bfloat16", np.uint16, 0x7FC1, 0x7FC2),
        ("bfloat16", np.uint16, 0x7FC0, 0x7F81),
    ],
)
def test_nan_payloads_other_floats(name, uint, bits_a, bits_b):
    a = np.array([1, 2, bits_a, 3], dtype=uint)
    b = np.array([1, 2, bits_b, 3], dtype=uint)
    fa, fb = a.view(np_dtype(name)), b.view(np_dtype(name))
    with np.errstate(invalid="ignore"):  # bfloat16 isnan on a signalling NaN warns
        assert np.isnan(fa[2]) and np.isnan(fb[2])
    assert digest_all(fa) != digest_all(fb)


# ------------------------------------------------------------------ last-bit changes


def _next_up(a: np.ndarray) -> np.ndarray:
    if a.dtype == np_dtype("bfloat16"):  # one ulp up for positive finite values
        return (a.view(np.uint16) + np.uint16(1)).view(a.dtype)
    return np.nextafter(a, np.array(np.inf, a.dtype))


@pytest.mark.parametrize("name", ["float32", "float64", "float16", "bfloat16"])
def test_one_ulp_changes_are_visible(name):
    n = 4 * BLOCK + 3
    rng = np.random.default_rng(7)
    a = rng.uniform(0.5, 2.0, n).astype(np_dtype(name))
    base = digest_all(a)
    up = _next_up(a)
    assert (up > a).all()
    assert digest_all(up) != base, "one ulp in every element not detected"
    for i in [0, 1, n // 2, 2 * BLOCK, n - 1, *rng.integers(0, n, 20)]:
        b = a.copy()
        b[i] = up[i]
        assert digest_numpy(b) != base, f"one ulp at {i} not detected"


# ------------------------------------------------------------------ single-element changes


def test_every_single_bit_flip_of_one_float32_is_visible():
    n = 4 * BLOCK + 3  # 2 full blocks of int64 words, then a 2-word tail (last word padded)
    rng = np.random.default_rng(11)
    a = rng.standard_normal(n).astype(np.float32)
    positions = [
        0,
        1,
        int(rng.integers(2, 2 * BLOCK - 1)),
        2 * BLOCK - 1,  # last element of block 0
        2 * BLOCK,  # first element of block 1
        int(rng.integers(2 * BLOCK + 1, 4 * BLOCK)),
        4 * BLOCK,  # tail
        n - 1,  # tail, in the zero-padded word
    ]
    seen = {digest_all(a)}
    bits = a.view(np.uint32)
    for i in positions:
        for bit in range(32):
            b = bits.copy()
            b[i] ^= np.uint32(1 << bit)
            flipped = b.view(np.float32)
            # The lowest, sign and exponent-top bits also through every TF path.
            d = digest_all(flipped) if bit in (0, 30, 31) else digest_numpy(flipped)
            assert d not in seen, f"flip of bit {bit} at {i} collides"
            seen.add(d)
    assert len(seen) == 1 + 32 * len(positions)


def test_any_single_word_change_is_visible():
    # Odd weights are invertible mod 2**64: changing one int64 word by any nonzero delta
    # changes ``lo``.
    rng = np.random.default_rng(5)
    n = 3 * BLOCK + 17
    a = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
    lo, _ = digest_numpy(a)
    for _ in range(300):
        b = a.copy()
        i = int(rng.integers(n))
        delta = int(rng.integers(1, 2**63)) << int(rng.integers(0, 63))
        b[i] = np.int64(((int(b[i]) + delta + 2**63) % 2**64) - 2**63)
        if b[i] == a[i]:
            continue
        assert digest_numpy(b)[0] != lo


# ------------------------------------------------------------------ what the digest ignores
# By definition the digest is a function of the bytes only: the shape and the dtype are recorded
# separately (OpInfo.dtypes / OpInfo.shapes, and Event.shapes for eager ops).


def test_same_bytes_different_shapes_same_digest():
    a = np.arange(24, dtype=np.float32) - 11.5
    t = tf.constant(a)
    ref = digest_all(a)
    for shape in [(4, 6), (2, 3, 4), (24, 1), (1, 1, 24)]:
        assert digest_all(a.reshape(shape)) == ref
        ts = tf.reshape(t, shape)
        for use_matmul in (True, False):
            assert pair(eager_digest_fn(tf.float32, shape, use_matmul)(ts)) == ref
    scalar = a[5].reshape(())
    assert digest_all(scalar) == digest_all(a[5:6]) == digest_all(a[5:6].reshape(1, 1))
    assert pair(eager_digest_fn(tf.float32, (), True)(tf.constant(scalar))) == digest_all(scalar)


def test_same_bytes_different_dtypes_same_digest():
    a = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    ref = digest_all(a)
    for target in [
        "int32",
        "uint32",
        "uint8",
        "int16",
        "float16",
        "bfloat16",
        "int64",
        "float64",
        "complex64",
        "complex128",
    ]:
        assert digest_all(a.view(np_dtype(target))) == ref, target
        ratio = np_dtype(target).itemsize // a.itemsize  # tf.bitcast to a wider type eats
        t = tf.constant(a) if ratio <= 1 else tf.reshape(a, [-1, ratio])  # the last axis
        bitcast = tf.bitcast(t, tf.as_dtype(np_dtype(target)))
        assert digest_eager_tensor(bitcast) == ref, target
    flags = np.array([1, 0, 0, 1, 1, 0, 1, 0, 1], np.uint8)
    assert digest_all(flags.astype(bool)) == digest_all(flags)


def test_layout_does_not_matter_only_row_major_bytes():
    a = np.arange(35, dtype=np.float64).reshape(5, 7)
    transposed = a.T  # a non-contiguous view
    assert digest_numpy(transposed) == digest_all(np.ascontiguousarray(transposed))
    assert digest_eager_tensor(tf.transpose(tf.constant(a))) == digest_numpy(transposed)
    assert digest_numpy(transposed) != digest_numpy(a)


def test_length_is_part_of_the_digest_even_where_padding_hides_trailing_zeros():
    # The last word is zero-padded, so without the length [7] and [7, 0, 0] would collide:
    # a dynamically shaped graph output that grew by zeros must still change the digest.
    assert digest_all(np.zeros(3, np.float32)) != digest_all(np.zeros(BLOCK + 5, np.float32))
    assert digest_all(np.array([7], np.uint8)) != digest_all(np.array([7, 0, 0], np.uint8))
    assert digest_all(np.array([7], np.uint8)) != digest_all(np.array([0, 7], np.uint8))
    assert digest_all(np.zeros(0, np.float32)) != digest_all(np.zeros(1, np.float32))


def test_algorithm_name_is_what_recordings_store():
    with nddebug.trace() as rec:
        tf.constant([1.0, 2.0]) * 3.0
    assert rec.digest_algorithm == dg.ALGORITHM
    (ev,) = [e for e in rec.events if rec.ops[e.op_id].op_type == "Mul"]
    assert ev.digests == [digest_numpy(np.array([3.0, 6.0], np.float32))]
    assert rec.ops[ev.op_id].dtypes == ["float32"] and ev.shapes == [[2]]


# ------------------------------------------------------------------ digestible()


@pytest.mark.parametrize("dtype", [tf.resource, tf.variant])
def test_not_digestible(dtype):
    assert digestible(dtype) is False


_STRINGS = [
    np.array([b"", b"a", b"hello world", "\u00e9t\u00e9".encode()], dtype=object),
    np.array([[b"ab", b"c"], [b"", b"defghijklmnop"]], dtype=object),
    np.array([], dtype=object),
    np.array(b"x" * 10_000, dtype=object),  # one element past a block of words
    b"a\x00",  # a scalar's numpy() is bytes; a NumPy "S" array would drop the NUL
]


@pytest.mark.parametrize("value", _STRINGS, ids=["words", "2x2", "empty", "long", "nul"])
def test_strings_digest_the_same_on_every_path(value):
    """Strings are digested as their elements' lengths then their bytes (string_bytes), by
    NumPy, by the pure-TF ops (both sums), by the native op eagerly and in a graph, and from
    the host array."""
    from nddebug import native
    from nddebug.tracer.eager import digest_host

    assert digestible(tf.string)
    want = digest_numpy(dg.host_array(value))
    t = tf.constant(value)
    got = {
        "tf matmul": tuple(int(x) for x in build_digest(t, True).numpy()),
        "tf portable": tuple(int(x) for x in build_digest(t, False).numpy()),
        "host": digest_host(t.numpy()),
        "eager tensor": digest_eager_tensor(t),
    }
    lib = native.load()
    if lib is not None:
        got["native"] = tuple(int(x) for x in lib.digest(tf.constant(1), [t]).numpy()[0])
        graph = tf.function(lambda x: lib.digest(tf.constant(1), [x]))
        got["native graph"] = tuple(int(x) for x in graph(t).numpy()[0])
    assert all(v == want for v in got.values()), (want, got)


def test_strings_cut_differently_digest_differently():
    """The lengths come first: the same bytes split into other elements differ."""
    a = digest_numpy(np.array([b"ab", b"c"], dtype=object))
    assert a != digest_numpy(np.array([b"a", b"bc"], dtype=object))
    assert a != digest_numpy(np.array([b"abc"], dtype=object))
    assert digest_numpy(np.array(["\u00e9"])) == digest_numpy(
        np.array(["\u00e9".encode()], dtype=object)
    )


@pytest.mark.parametrize("name", DTYPES)
def test_digestible(name):
    assert digestible(tf.as_dtype(np_dtype(name))) is True
    assert digestible(np_dtype(name)) is True


def test_unreadable_eager_tensors_have_no_digest():
    v = tf.Variable([1.0, 2.0])
    assert v.handle.dtype == tf.resource
    assert digest_eager_tensor(v.handle) is None
    assert digest_eager_tensor(v.read_value()) == digest_numpy(np.array([1.0, 2.0], np.float32))


@pytest.mark.parametrize("shape", [(3,), (BLOCK * 3 + 5,), (2, BLOCK * 2)])
def test_gated_digest_is_exact_when_active(shape):
    """Instrumented graphs pass the trace switch as ``active``: on, the digest is exact."""
    a = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    for static in (True, False):
        spec = tf.TensorSpec(shape if static else None, tf.float32)
        fn = tf.function(
            lambda t, on: dg.build_digest(t, True, on),
            input_signature=[spec, tf.TensorSpec([], tf.int32)],
        )
        assert tuple(int(v) for v in fn(tf.constant(a), tf.constant(1)).numpy()) == digest_numpy(a)
        if a.size > BLOCK * 2:  # off: the full blocks are skipped, so the value differs
            assert tuple(
                int(v) for v in fn(tf.constant(a), tf.constant(0)).numpy()
            ) != digest_numpy(a)


# ------------------------------------------------------------------ the native op (C++)


def _native():
    """The native library; it must build wherever it is wanted (CI has a compiler)."""
    from nddebug import native

    if not native.enabled() or dg.gpu_present():
        pytest.skip("native ops disabled (NDDEBUG_NATIVE=0) or a GPU present")
    lib = native.load()
    assert lib is not None, native.problem()
    return lib


_NATIVE_GRAPH_FNS: dict = {}


def _native_graph_fn(dtype):
    """A graph of unknown rank and size digesting a tensor another graph op produced, twice in
    one NddebugDigest op (variadic inputs)."""
    if dtype not in _NATIVE_GRAPH_FNS:
        lib = _native()

        @tf.function(input_signature=[tf.TensorSpec(None, dtype)], autograph=False)
        def fn(x):
            y = tf.identity(x)
            return lib.digest(tf.constant(1), [y, x])

        _NATIVE_GRAPH_FNS[dtype] = fn
    return _NATIVE_GRAPH_FNS[dtype]


@pytest.mark.parametrize(("name", "n"), _cases(static=False))
def test_native_digest_matches_numpy(name, n):
    lib = _native()
    a = random_array(name, n)
    ref = digest_numpy(a)
    t = tf.constant(a)
    assert pairs(lib.digest(tf.constant(1), [t])) == [ref]  # eager
    assert pairs(_native_graph_fn(t.dtype)(t)) == [ref, ref]  # in a graph
    if n % 2 == 0 and n:  # rank 2: the digest is over the row-major bytes
        assert pairs(_native_graph_fn(t.dtype)(tf.reshape(t, [2, n // 2]))) == [ref, ref]
    assert lib.digest_bytes(a.tobytes()) == ref


def test_native_digest_of_many_blocks_uses_threads_and_stays_exact():
    lib = _native()
    a = random_array("float32", 3 * (1 << 20) + 3)  # 384 blocks: sharded over the pool
    ref = digest_numpy(a)
    t = tf.constant(a)
    assert [pairs(lib.digest(tf.constant(1), [t])) for _ in range(5)] == [[ref]] * 5
    b = a.copy()
    b[len(b) // 2] = np.nextafter(b[len(b) // 2], np.float32(np.inf))
    assert pairs(lib.digest(tf.constant(1), [tf.constant(b)])) == [digest_numpy(b)] != [ref]


def test_native_digest_gate_off_reads_nothing():
    lib = _native()
    a = random_array("float64", 3 * BLOCK)
    out = lib.digest(tf.constant(0), [tf.constant(a), tf.constant(a[:5])])
    assert pairs(out) == [(0, 0), (0, 0)]
    assert pairs(lib.digest(tf.constant(1), [tf.constant(a)])) == [digest_numpy(a)]


def _extreme_words(n: int, seed: int) -> np.ndarray:
    """Words that stress the 32-bit halves of the SIMD multiply: random, all ones, the sign
    bit alone, the top half set, the bottom half set, and zeros, mixed."""
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    specials = np.array(
        [2**64 - 1, 2**63, 2**63 - 1, 0xFFFFFFFF00000000, 0x00000000FFFFFFFF, 0, 1, 2**32],
        dtype=np.uint64,
    )
    at = rng.integers(0, max(n, 1), size=n // 3)
    words[at] = specials[rng.integers(0, len(specials), size=len(at))]
    return words


@pytest.mark.parametrize(
    "nbytes", [0, 1, 7, 8, 31, 32, 33, 8 * BLOCK - 3, 8 * BLOCK, 8 * BLOCK + 24, 24 * BLOCK + 13]
)
def test_native_simd_and_portable_loops_give_the_reference_digest(nbytes):
    """Every digest loop this CPU runs (portable, AVX2, AVX-512, each chosen at run time where
    the CPU has it) gives digest_numpy's value on the same bytes, odd lengths and extreme
    words included; and a loop runs wherever the CPU reports its instructions."""
    lib = _native()
    data = _extreme_words(nbytes // 8 + 1, nbytes).tobytes()[:nbytes]
    ref = digest_numpy(np.frombuffer(data, np.uint8))
    ran = {}
    try:
        for loop in lib.LOOPS:
            ran[loop] = lib.set_loop(loop)
            if ran[loop]:
                assert lib.digest_bytes(data) == ref, loop
    finally:
        lib.set_simd(True)
    assert ran["portable"]
    assert lib.digest_bytes(data) == ref
    if os.path.exists("/proc/cpuinfo") and platform.machine() == "x86_64":
        flags = set(open("/proc/cpuinfo").read().split())
        assert ran["avx2"] == ("avx2" in flags)  # the SIMD loops really ran where they can
        assert ran["avx512"] == ({"avx512f", "avx512dq"} <= flags)
        # The default: AVX-512 only where it runs well (IFMA marks Ice Lake and Zen 4 on).
        widest = "avx2" if "avx2" in flags else "portable"
        if {"avx512f", "avx512dq", "avx512ifma"} <= flags:
            widest = "avx512"
        assert lib.loop() == widest


def test_asking_whether_a_dtype_is_digestible_leaves_no_op_in_the_graph_being_built():
    from nddebug import digest as dg

    dg._bitcast_ok.cache_clear()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant([1.0], tf.float16)
        before = len(graph.get_operations())
        assert digestible(x.dtype)
        assert len(graph.get_operations()) == before
