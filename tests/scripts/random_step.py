"""A script whose traced step draws from an unseeded random op: differs between processes."""

import tensorflow as tf

import nddebug

with nddebug.trace():
    noise = tf.random.uniform([256])
    tf.reduce_sum(noise * 2.0)
