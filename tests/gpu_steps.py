"""The GPU tier's steps (tests/test_gpu_facts.py), importable by its fresh processes too."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import nddebug
from nddebug.examples import mnist_cnn


def cnn_report() -> nddebug.Report:
    """The seed-000 CNN, custom tf.function step, batch 128."""
    x, y = (tf.constant(a) for a in mnist_cnn.make_data(128))
    model = mnist_cnn.make_model(0)
    step = mnist_cnn.make_custom_step(model)
    return nddebug.check(step, x, y, repeats=5, state=model)


def segment_report() -> nddebug.Report:
    """200,000 rows of 8 summed into 16 segments: 12,500 atomic adds per output element."""
    rng = np.random.default_rng(0)
    data = tf.constant(rng.standard_normal((200_000, 8)).astype(np.float32))
    ids = tf.constant(rng.integers(0, 16, size=200_000), tf.int32)

    @tf.function
    def step(data, ids):
        return tf.math.unsorted_segment_sum(data, ids, 16)

    return nddebug.check(step, data, ids, repeats=5)


def scatter_report() -> nddebug.Report:
    """An embedding lookup's backward pass (the IndexedSlices made dense: UnsortedSegmentSum)
    and tensor_scatter_nd_add of 200,000 updates into 64 rows.

    The loss weighs every looked-up row differently, so the rows the backward pass sums into
    one table row differ: with ``sum(gather(table, ids) ** 2)`` each table row would receive
    ~3,000 copies of one value (2 * its own row), whose sum is the same in any order (the
    H100 gave bit-identical gradients in 5 of 5 runs that way)."""
    rng = np.random.default_rng(1)
    table = tf.constant(rng.standard_normal((64, 128)).astype(np.float32))
    ids = tf.constant(rng.integers(0, 64, size=200_000), tf.int32)
    updates = tf.constant(rng.standard_normal((200_000, 128)).astype(np.float32))

    @tf.function
    def step(table, ids, updates):
        with tf.GradientTape() as tape:
            tape.watch(table)
            loss = tf.reduce_sum(tf.gather(table, ids) * updates)
        grad = tf.convert_to_tensor(tape.gradient(loss, table))
        scattered = tf.tensor_scatter_nd_add(tf.zeros_like(table), ids[:, None], updates)
        return grad, scattered

    return nddebug.check(step, table, ids, updates, repeats=5)
