"""A TF1 step whose learning rate reads a counter that the same Session.run increments, with
nothing ordering the two (Keras 2's RMSprop with decay). Which runs first is left to the
executor; here a matrix product in front of one side decides it, as load or thread timing
would: TF1_DELAY=write reads first, TF1_DELAY=read increments first (16 of 16 pairs measured
in opposite orders). Saves the recording."""

import os
import sys

import numpy as np
import tensorflow as tf

import nddebug

tf.compat.v1.disable_eager_execution()
delay = os.environ["TF1_DELAY"]
x = tf.compat.v1.placeholder(tf.float32, [8, 4])
w = tf.compat.v1.get_variable("w", initializer=tf.ones([4, 1]))
iterations = tf.compat.v1.get_variable("iterations", initializer=tf.constant(0.0))
big = tf.compat.v1.get_variable("big", initializer=tf.ones([768, 768]))  # not constant-folded
slow = tf.reduce_sum(tf.matmul(tf.matmul(big, big), big))  # ~0.1 s of work on one thread
loss = tf.reduce_sum(tf.matmul(x, w) ** 2)
grad = tf.gradients(loss, w)[0]
with tf.control_dependencies([slow] if delay == "read" else []):
    count = iterations.read_value()
lr = 0.1 / (1.0 + 0.5 * count)
with tf.control_dependencies([slow] if delay == "write" else []):
    increment = iterations.assign_add(1.0)
train = tf.group(w.assign_sub(lr * grad), increment)
# Two inter-op threads: the side without the product runs at once, the other waits for it.
# (With one thread the executor's queue, not time, decides: measured, both variants agreed in
# 3 of 8 pairs.)
config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)
session = tf.compat.v1.Session(config=config)
session.run(tf.compat.v1.global_variables_initializer())
with nddebug.trace() as rec:
    session.run([loss, train], {x: np.ones([8, 4], np.float32)})
rec.save(sys.argv[1])
