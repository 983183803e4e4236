"""The bitwise digest of a tensor, defined once and computed on the tensor's own device.

Definition (``ALGORITHM``): take the tensor's bytes in row-major order (bool as one byte 0/1;
a string tensor: each element's length in bytes as a little-endian int64, in row-major order,
then the elements' bytes one after the other, :func:`string_bytes`), pad with zero bytes to a
multiple of 8 and read them as little-endian int64 words ``u_j``.
With odd weights ``c_j = W[j mod B] * V(j div B)`` and ``c'_j`` (independent tables), the
digest is the pair

    lo = nbytes * L + sum_j u_j * c_j   (mod 2**64, L = LENGTH_WEIGHT)
    hi = sum_j (u_j >> 32) * c'_j (mod 2**64, arithmetic shift)

Why this shape:
- integer sums wrap around and are associative, so the value does not depend on reduction
  order: it is deterministic on a GPU that reduces with atomics, and identical on every device;
- weights depend on the position, so permuting elements changes it; odd weights make every
  single-element change visible;
- every bit of the input sits at bit position <= 31 in ``lo`` or in ``hi``, so no difference
  pattern (e.g. -0.0 vs 0.0 in an even number of places) is systematically invisible; a random
  pattern escapes with probability about 2**-64;
- on CPU it is one matrix-vector product per half (int64 MatMul reads memory once); on GPU,
  where int64 MatMul has no kernel, the same sums are a multiply and a reduction.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

#: v2: as v1, with a definition for strings (v1 digested none).
ALGORITHM = "nddebug-wsum64x2-v2"
# lo also counts the byte length, so trailing zeros (which padding hides) still change it.
LENGTH_WEIGHT = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
BLOCK = 4096
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


@functools.cache
def _block_weights(stream: int) -> np.ndarray:
    """Odd int64 weights for positions inside a block; ``stream`` picks an independent table."""
    base = (stream + 1) << 32
    return np.array([_signed(_splitmix64(base + k) | 1) for k in range(BLOCK)], dtype=np.int64)


# Row weights V(r): a cheap integer hash made only of ops every TF device has for int64
# (multiply, xor, arithmetic right shift, or), so it can be computed on the fly.
_ROW_MUL = (_signed(0x9E3779B97F4A7C15), _signed(0xD6E8FEB86659FD93))
_ROW_MUL2 = (_signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB))


def _row_weights_np(rows: np.ndarray, stream: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = (rows.astype(np.int64) + np.int64(1)) * np.int64(_ROW_MUL[stream])
        h = h ^ (h >> np.int64(31))
        h = h * np.int64(_ROW_MUL2[stream])
        h = h ^ (h >> np.int64(29))
    return h | np.int64(1)


def host_array(value: Any) -> np.ndarray:
    """A host value as an array to digest. A scalar string tensor's ``numpy()`` is a bytes
    object: it becomes an object array, since a NumPy bytes array ("S") drops trailing NULs."""
    if isinstance(value, (bytes, str)):
        array = np.empty((), dtype=object)
        array[()] = value
        return array
    return np.asarray(value)


def is_strings(x: Any) -> bool:
    """Whether a host array (or a NumPy dtype) holds strings: a TF string tensor's ``numpy()``
    is an object array of bytes."""
    return np.dtype(getattr(x, "dtype", x)).kind in "OSU"


def string_bytes(array: Any) -> np.ndarray:
    """The bytes a string tensor's digest reads, as uint8: every element's length in bytes
    (little-endian int64, row-major order), then the elements' bytes in the same order. The
    lengths come first so that no way of cutting the same bytes into elements looks like
    another."""
    items = []
    for x in np.asarray(array, dtype=object).reshape(-1):
        if not isinstance(x, (bytes, str)):
            raise TypeError(f"a string tensor's element is bytes or str, not {type(x).__name__}")
        items.append(x if isinstance(x, bytes) else x.encode("utf-8"))
    head = np.array([len(x) for x in items], dtype="<i8").tobytes()
    return np.frombuffer(head + b"".join(items), dtype=np.uint8)


def read_as(value: Any) -> np.ndarray:
    """The contiguous array whose bytes a host value's digest reads: its own, or for strings
    :func:`string_bytes` (a TypeError for an object array that holds anything else)."""
    a = host_array(value)
    return string_bytes(a) if is_strings(a) else np.ascontiguousarray(a)


def words_of(array: np.ndarray) -> np.ndarray:
    """The int64 words the digest is defined over (zero-copy when the bytes allow it)."""
    a = read_as(array)
    if a.dtype == np.bool_:
        a = a.view(np.uint8)
    flat = a.reshape(-1).view(np.uint8)
    if flat.size % 8:
        flat = np.concatenate([flat, np.zeros(-flat.size % 8, np.uint8)])
    return flat.view("<i8")


#: Rows of BLOCK words digested at a time on the host: 256 rows = 8 MiB of data, so a digest
#: needs a few such slices of extra memory whatever the tensor's size.
_CHUNK_ROWS = 256


def _word_reader(a: np.ndarray) -> tuple[int, Any]:
    """The number of int64 words of ``a`` (see :func:`words_of`) and a function giving the
    words [start, stop) without copying the array: only the last, zero-padded word is new."""
    flat = a.reshape(-1)
    if flat.dtype == np.bool_:
        flat = flat.view(np.uint8)
    raw = flat.view(np.uint8)
    whole, extra = divmod(raw.size, 8)
    main = raw[: whole * 8].view("<i8")
    if not extra:
        return whole, lambda start, stop: main[start:stop]
    tail = np.zeros(8, np.uint8)
    tail[:extra] = raw[whole * 8 :]
    last = tail.view("<i8")

    def words(start: int, stop: int) -> np.ndarray:
        if stop <= whole:
            return main[start:stop]
        return np.concatenate([main[start:whole], last])

    return whole + 1, words


def digest_numpy(array: Any) -> tuple[int, int]:
    """Digest of a host array: the reference the TF kernels must match bit for bit, and the
    path for eager tensors that already live in host memory. Reads the array in slices, so a
    512 MiB tensor needs a few MiB more, not copies of itself."""
    a = read_as(array)
    n, words = _word_reader(a)
    rows, rest = divmod(n, BLOCK)
    out = []
    with np.errstate(over="ignore"):
        for stream in (0, 1):
            w = _block_weights(stream)
            total = np.int64(0)
            for r0 in range(0, rows, _CHUNK_ROWS):
                r1 = min(rows, r0 + _CHUNK_ROWS)
                vals = words(r0 * BLOCK, r1 * BLOCK).reshape(r1 - r0, BLOCK)
                if stream:
                    vals = vals >> np.int64(32)
                row_sums = (vals * w).sum(axis=1)
                total += (row_sums * _row_weights_np(np.arange(r0, r1), stream)).sum()
            if rest:
                vals = words(rows * BLOCK, n)
                if stream:
                    vals = vals >> np.int64(32)
                last = (vals * w[:rest]).sum(dtype=np.int64)
                total += last * _row_weights_np(np.array([rows]), stream)[0]
            out.append(int(total))
        length = int(np.int64(a.size * a.dtype.itemsize) * np.int64(LENGTH_WEIGHT))
    out[0] = _signed((out[0] + length) & _MASK64)
    return out[0], out[1]


# --------------------------------------------------------------------------- TensorFlow side


#: Dtypes tf.bitcast cannot read (float8, int4, int2): digested through an exact widening cast
#: on the pure-TF path (every value maps to a distinct wider value), from their one-byte
#: storage on the native path and in NumPy (ml_dtypes).
NARROW = {
    "float8_e4m3fn": "float32",
    "float8_e5m2": "float32",
    "float8_e4m3fnuz": "float32",
    "float8_e4m3b11fnuz": "float32",
    "float8_e5m2fnuz": "float32",
    "int4": "int8",
    "uint4": "uint8",
    "int2": "int8",
    "uint2": "uint8",
}


def digestible(dtype: Any) -> bool:
    """Whether tensors of this TF dtype have bits we can read (not resource/variant)."""
    import tensorflow as tf

    dtype = tf.as_dtype(dtype)
    if dtype == tf.string:
        return True  # its elements' lengths and bytes (string_bytes)
    if dtype in (tf.resource, tf.variant):
        return False
    return dtype == tf.bool or dtype.name in NARROW or _bitcast_ok(dtype)


@functools.cache
def _bitcast_ok(dtype: Any) -> bool:
    """Whether ``tf.bitcast`` reads this dtype's bits: the Bitcast op's own list of types.
    Read from the op's definition, not by running one: asked while a function is built, a
    probe op was left in the user's graph, and run eagerly it was TensorFlow work on a
    replica's thread (MirroredStrategy traces its replicas' steps in threads)."""
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get("Bitcast")
    allowed = next(a for a in op_def.attr if a.name == "T").allowed_values.list.type
    return dtype.base_dtype.as_datatype_enum in allowed


def build_digest(tensor: Any, use_matmul: bool, active: Any = None) -> Any:
    """Emit the ops that digest ``tensor``; returns an int64 tensor ``[lo, hi]``.

    Works in graphs and eagerly. With a static shape the block layout is planned here in Python
    (fewest ops: about 20 for a small tensor); otherwise it is computed in the graph. All views
    of the data are zero-copy except the last partial block (< 32 KiB).

    ``active`` (an int32 0/1 tensor, or None for always) multiplies the number of full blocks:
    at 0 the heavy part reads an empty slice, so an instrumented graph costs little when no
    trace is recording, without any control flow.
    """
    flat = byte_view(tensor)
    nbytes = flat.shape[0]
    if nbytes is None:
        return _digest_dynamic(flat, use_matmul, active)
    return _digest_static(flat, nbytes, use_matmul, active)


def byte_view(tensor: Any) -> Any:
    """The tensor's bytes as a flat uint8 vector: a zero-copy view except for bool."""
    import tensorflow as tf

    if tensor.dtype == tf.string:
        # string_bytes: the lengths as little-endian int64, then the bytes (on the host:
        # strings have no device kernels).
        flat = tf.reshape(tensor, [-1])
        lengths = tf.cast(tf.strings.length(flat, unit="BYTE"), tf.int64)
        head = tf.reshape(tf.bitcast(lengths, tf.uint8), [-1])
        body = tf.io.decode_raw(tf.strings.reduce_join(flat), tf.uint8)
        return tf.concat([head, tf.reshape(body, [-1])], 0)
    if tensor.dtype == tf.bool:
        raw = tf.cast(tensor, tf.uint8)
    elif tensor.dtype.name in NARROW:
        wide = tf.cast(tensor, NARROW[tensor.dtype.name])
        raw = wide if wide.dtype == tf.uint8 else tf.bitcast(wide, tf.uint8)
    elif tensor.dtype == tf.uint8:
        raw = tensor
    else:
        raw = tf.bitcast(tensor, tf.uint8)
    return tf.reshape(raw, [-1])


def _as_words(byte_vector: Any) -> Any:
    import tensorflow as tf

    return tf.bitcast(tf.reshape(byte_vector, [-1, 8]), tf.int64)


def _weighted_sum(words: Any, weights: np.ndarray, stream: int, use_matmul: bool) -> Any:
    """sum(words * weights) for 1-D words, or per-row sums for 2-D blocks."""
    import tensorflow as tf

    if stream == 1:
        words = tf.bitwise.right_shift(words, 32)
    w = tf.constant(weights)
    if words.shape.rank == 2 and use_matmul:
        return tf.reshape(tf.matmul(words, tf.reshape(w, [-1, 1])), [-1])
    return tf.reduce_sum(words * w, axis=-1)


def _digest_static(flat: Any, nbytes: int, use_matmul: bool, active: Any = None) -> Any:
    import tensorflow as tf

    whole_words, tail_bytes = divmod(nbytes, 8)
    rows, rest_words = divmod(whole_words, BLOCK)
    # The last (partial) block: the remaining whole words, then the zero-padded tail word.
    last_len = rest_words + (1 if tail_bytes else 0)
    full_bytes = rows * BLOCK * 8
    parts: list[list[Any]] = [[], []]
    if rows:
        block = tf.reshape(_as_words(flat[:full_bytes]), [rows, BLOCK])
        live = rows if active is None else rows * active
        block = block[:live]
        for stream in (0, 1):
            row_sums = _weighted_sum(block, _block_weights(stream), stream, use_matmul)
            row_w = tf.constant(_row_weights_np(np.arange(rows), stream))[:live]
            parts[stream].append(tf.reduce_sum(row_sums * row_w))
    if last_len:
        rest = flat[full_bytes:] if rows else flat
        pad = last_len * 8 - (nbytes - full_bytes)
        if pad:
            rest = tf.pad(rest, [[0, pad]])
        last = _as_words(rest)
        for stream in (0, 1):
            weights = _block_weights(stream)[:last_len] * _row_weights_np(np.array([rows]), stream)
            parts[stream].append(_weighted_sum(last, weights, stream, use_matmul))
    length = _signed((nbytes * (LENGTH_WEIGHT & _MASK64)) & _MASK64)
    parts[0].append(tf.constant(length, tf.int64))
    if not parts[1]:
        parts[1].append(tf.constant(0, tf.int64))
    return tf.stack([tf.add_n(p) if len(p) > 1 else p[0] for p in parts])


def _digest_dynamic(flat: Any, use_matmul: bool, active: Any = None) -> Any:
    import tensorflow as tf

    nbytes = tf.size(flat, out_type=tf.int64)
    m0 = nbytes // 8
    rows = m0 // BLOCK
    full = rows * BLOCK
    main = _as_words(flat[: m0 * 8])
    live = rows if active is None else rows * tf.cast(active, tf.int64)
    block = tf.reshape(main[:full], [-1, BLOCK])[:live]
    # Last partial block: remaining whole words, then the zero-padded tail bytes as one word.
    tail = flat[m0 * 8 :]
    tail_word = _as_words(tf.pad(tail, [[0, 8 - tf.size(tail)]]))
    last = tf.concat([main[full:], tail_word], 0)
    last = tf.pad(last, [[0, BLOCK - tf.size(last)]])
    row_ids = tf.concat([tf.range(live, dtype=tf.int64), tf.reshape(rows, [1])], 0)
    out = []
    for stream in (0, 1):
        row_sums = _weighted_sum(block, _block_weights(stream), stream, use_matmul)
        last_sum = _weighted_sum(last, _block_weights(stream), stream, use_matmul)
        row_sums = tf.concat([row_sums, tf.reshape(last_sum, [1])], 0)
        out.append(tf.reduce_sum(row_sums * _row_weights_tf(row_ids, stream)))
    out[0] += nbytes * tf.constant(LENGTH_WEIGHT, tf.int64)
    return tf.stack(out)


def _row_weights_tf(rows: Any, stream: int) -> Any:
    import tensorflow as tf

    h = (rows + 1) * tf.constant(_ROW_MUL[stream], tf.int64)
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 31))
    h = h * tf.constant(_ROW_MUL2[stream], tf.int64)
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 29))
    return tf.bitwise.bitwise_or(h, tf.constant(1, tf.int64))


@functools.lru_cache(maxsize=512)
def eager_digest_fn(dtype: Any, shape: tuple[int, ...] | None, use_matmul: bool) -> Any:
    """A tf.function digesting one dtype and shape (``None``: any shape) in one eager call."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec(shape, dtype)], autograph=False)
    def _digest(t: Any) -> Any:
        return build_digest(t, use_matmul)

    return _digest


@functools.lru_cache(maxsize=512)
def eager_digests_fn(specs: tuple[tuple[Any, tuple[int, ...]], ...], use_matmul: bool) -> Any:
    """A tf.function digesting several tensors (one (dtype, shape) each) in one eager call,
    as an int64 ``[n, 2]``: on a device, one call and one copy to the host for all of an
    op's tensors instead of one each (each copy waits for the device's queued work)."""
    import tensorflow as tf

    signature = [tf.TensorSpec(shape, dtype) for dtype, shape in specs]

    @tf.function(input_signature=signature, autograph=False)
    def _digests(*tensors: Any) -> Any:
        return tf.stack([build_digest(t, use_matmul) for t in tensors])

    return _digests


_gpu_known: list[bool] = []


def gpu_present() -> bool:
    """Graph ops are placed after tracing, so the kernel path is chosen once per process (the
    devices are fixed once TensorFlow's runtime has started, so the answer is kept: it is
    asked per op). Before the runtime has started, the visible GPUs, not kept: listing the
    logical devices would start it, and a script inside ``nddebug run --all`` may still
    configure them at its top (probe round 43, F4)."""
    if _gpu_known:
        return _gpu_known[0]
    import tensorflow as tf

    from nddebug.environment import runtime_started

    if not runtime_started():
        return bool(tf.config.get_visible_devices("GPU"))
    _gpu_known.append(bool(tf.config.list_logical_devices("GPU")))
    return _gpu_known[0]


def use_matmul_for(device: str | None) -> bool:
    """int64 MatMul exists only on CPU; everywhere else the multiply-and-reduce path is used."""
    if device:
        return "CPU" in device.upper()
    return not gpu_present()
