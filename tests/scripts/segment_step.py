"""A tf.function step summing many rows into few segments: deterministic on the CPU, but on a
GPU UnsortedSegmentSum adds with atomics (what `nddebug run --emulate-gpu` rehearses)."""

import numpy as np
import tensorflow as tf

import nddebug

rng = np.random.default_rng(0)
data = tf.constant(rng.standard_normal((20000, 8)).astype(np.float32))
ids = tf.constant(rng.integers(0, 16, size=20000), tf.int32)


@tf.function
def step(data: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.math.unsorted_segment_sum(data, ids, 16) ** 2)


with nddebug.trace():
    step(data, ids)
