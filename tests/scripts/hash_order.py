"""A script whose only non-determinism is Python's hash randomisation (set iteration order)."""

import tensorflow as tf

import nddebug

WORDS = {f"feature_{i}" for i in range(20)}

with nddebug.trace():
    values = tf.constant([float(sum(map(ord, w))) for w in WORDS])  # order depends on hashing
    weights = tf.range(20, dtype=tf.float32)
    tf.reduce_sum(values * weights)
