"""A step whose only difference between processes is in a variable written by a tf.function
traced before the trace block: its output (a constant) hides the update. With
``--xla`` the function is compiled with XLA instead (whose random generator starts from the
same state in every process: then the processes agree)."""

import sys

import tensorflow as tf

import nddebug

acc = tf.Variable(tf.zeros([64]), name="accumulator")


def update(x):
    acc.assign_add(tf.random.uniform([64]) * x)  # unseeded: differs in every process
    return tf.constant(1.0)


update = tf.function(update, jit_compile="--xla" in sys.argv)
x = tf.ones([64])
update.get_concrete_function(x)  # traced, not run, before the block: nddebug cannot see inside
with nddebug.trace():
    update(x)
