"""How graph digests reach the host: one small host callback per op execution, handing the
active recorder the op id, its output and input digests, and any values it must keep.

Outside a ``trace()`` block no recorder is active and the callback returns at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nddebug import digest as dg


def _receive(op_id: np.ndarray, outs: np.ndarray, ins: np.ndarray, *values: np.ndarray) -> None:
    from nddebug.tracer.recorder import Recorder

    rec = Recorder.active
    if rec is not None:
        rec.on_graph_event(int(op_id), outs, ins, values)


def send(op_id: int, out_digests: list[Any], in_digests: list[Any], values: list[Any]) -> None:
    """Emit, in the graph being built, the host callback that delivers one op execution."""
    import tensorflow as tf

    with tf.name_scope("nddebug"):
        outs = tf.stack(out_digests) if out_digests else tf.zeros([0, 2], tf.int64)
        ins = tf.stack(in_digests) if in_digests else tf.zeros([0, 2], tf.int64)
        args = [tf.constant(op_id, tf.int64), outs, ins, *values]
        tf.numpy_function(_receive, args, Tout=[], stateful=True)


def unpack(values: list[list[int]], mask: list[bool]) -> list[dg.Digest | None]:
    """Digest rows back into per-output slots (None where the output is unreadable)."""
    it = iter(values)
    return [tuple(next(it)) if readable else None for readable in mask]
