"""How graph digests reach the host.

Native path (CPU, :mod:`nddebug.native` built): each op execution appends one row (op id,
output digests, input digests) to a process-global C++ buffer; the recorder drains it once per
top-level eager call and at the end of the block. No Python runs per graph op execution.

Pure-TF path (a GPU, ``NDDEBUG_NATIVE=0``, no compiler), and whenever tensor values must reach
the host (rerun mode, capture runs): one small host callback per op execution, handing the
active recorder the op id, its digests and the values it must keep.

Outside a ``trace()`` block neither path does anything: the buffer is off, and the callback
returns at once. The counters below say how often the host was reached (tests hold the
native path to a few transfers per step).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from nddebug import digest as dg
from nddebug import native

# Host transfers since the process started: per-op host callbacks that reached an active
# recorder, and drains of the native buffer that returned rows.
COUNTS = {"callbacks": 0, "drains": 0}


def _receive(op_id: np.ndarray, outs: np.ndarray, ins: np.ndarray, *values: np.ndarray) -> None:
    from nddebug.tracer.recorder import Recorder

    rec = Recorder.active
    if rec is not None and not rec.discarding:
        COUNTS["callbacks"] += 1
        rec.on_graph_event(int(op_id), outs, ins, values)


def native_ops() -> native.Native | None:
    """The native library when graph digests and rows should use it, else None."""
    return native.load()


def send(op_id: int, out_digests: list[Any], in_digests: list[Any], values: list[Any]) -> Any:
    """Emit, in the graph being built, the op that delivers one op execution; return it."""
    import tensorflow as tf

    lib = native_ops()
    with tf.name_scope("nddebug") as scope:
        if lib is not None and not values:
            return lib.record(op_id, out_digests, in_digests)
        outs, ins = _stacked(out_digests), _stacked(in_digests)
        args = [tf.constant(op_id, tf.int64), outs, ins, *values]
        tf.numpy_function(_receive, args, Tout=[], stateful=True)
        return tf.compat.v1.get_default_graph().get_operation_by_name(f"{scope}PyFunc")


def _stacked(digests: list[Any]) -> Any:
    """Digest tensors as int64 [n, 2]: pure-TF digests are [2], native ones [1, 2]."""
    import tensorflow as tf

    if not digests:
        return tf.zeros([0, 2], tf.int64)
    if any(d.shape.rank == 2 for d in digests):
        return tf.concat([tf.reshape(d, [-1, 2]) for d in digests], 0)
    return tf.stack(digests)


def set_active(on: bool) -> None:
    """Switch the native buffer on (a block starts) or off (it ends)."""
    lib = native_ops() if on else native._state.get("lib")
    if lib is not None:
        lib.set_active(on)


def drain_flat() -> list[int]:
    """Every row appended to the native buffer since the last drain, flat (see
    :func:`rows`)."""
    lib = native._state.get("lib")
    if lib is None:
        return []
    flat = lib.drain()
    if flat:
        COUNTS["drains"] += 1
    return flat


def drain_columns() -> tuple[list[int], list[list[dg.Digest]], list[list[dg.Digest]]]:
    """Every row appended to the native buffer since the last drain, as three columns in
    arrival order: op ids, output digests, input digests (see :func:`columns`)."""
    lib = native._state.get("lib")
    if lib is None:
        return [], [], []
    heads, words = lib.drain_split()
    if not heads:
        return [], [], []
    COUNTS["drains"] += 1
    return columns(heads, words)


def columns(
    heads: list[int], words: list[int]
) -> tuple[list[int], list[list[dg.Digest]], list[list[dg.Digest]]]:
    """Rows split by the native drain (three ints a row: op id, n_out, n_in; and all rows'
    digest values in order) as columns: op ids, output digests, input digests.

    Each digest pair is made once, from one list of all of them, and a row takes two
    slices of it: a traced step drains a row per op execution, and this is most of the
    Python work a record costs (``benchmarks/bench_record_cost.py``), objects the garbage
    collector then counts included."""
    pairs = list(zip(words[0::2], words[1::2], strict=True))
    outs: list[list[dg.Digest]] = []
    ins: list[list[dg.Digest]] = []
    add_out, add_in = outs.append, ins.append
    k = 0
    for n_out, n_in in zip(heads[1::3], heads[2::3], strict=True):
        mid = k + n_out
        add_out(pairs[k:mid])
        k = mid + n_in
        add_in(pairs[mid:k])
    return heads[0::3], outs, ins


def rows(flat: list[int]) -> Iterator[tuple[int, list[dg.Digest], list[dg.Digest]]]:
    """The rows of a drained buffer, in arrival order: (op id, output digests, input
    digests), each digest an (int, int) pair. A row is op_id, n_out, n_in, then the pairs."""
    i, n = 0, len(flat)
    while i < n:
        op_id, n_out, n_in = flat[i], flat[i + 1], flat[i + 2]
        i += 3
        end = i + 2 * (n_out + n_in)
        words = iter(flat[i:end])
        pairs = list(zip(words, words, strict=True))  # consecutive words, two at a time
        yield op_id, pairs[:n_out], pairs[n_out:]
        i = end


def drain() -> list[tuple[int, list[list[int]], list[list[int]]]]:
    """The op executions appended to the native buffer since the last drain, in arrival
    order, as (op id, output digest rows, input digest rows)."""
    return [
        (op_id, [list(d) for d in outs], [list(d) for d in ins])
        for op_id, outs, ins in rows(drain_flat())
    ]


def unpack(values: list[list[int]], mask: list[bool]) -> list[dg.Digest | None]:
    """Digest rows back into per-output slots (None where the output is unreadable)."""
    it = iter(values)
    return [tuple(next(it)) if readable else None for readable in mask]
