"""A MultiWorkerMirroredStrategy step for `nddebug run --workers N`: each worker trains on its
own shard, the gradient is all-reduced, and every worker applies the same update.

PLANT=worker scales the update by a factor that depends on the worker (workers drift apart);
PLANT=crash makes worker 1 of the second run (`nddebug run` labels it "process 1 worker 1")
exit with status 3; PLANT=hang makes worker 1 sleep for an hour."""

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import nddebug

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
plant = os.environ.get("PLANT", "")
if plant == "crash" and os.environ.get("NDDEBUG_LABEL") == "process 1 worker 1":
    sys.exit(3)
if plant == "hang" and task == 1:
    time.sleep(3600)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    w = tf.Variable(tf.ones([8, 1]), name="w")
shard = np.linspace(-1, 1, 64 * 8, dtype=np.float32).reshape(64, 8)[task * 32 : task * 32 + 32]
x = tf.constant(shard)
scale = 1.0 + 1e-3 * task if plant == "worker" else 1.0


@tf.function
def train_step():
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        grad = tape.gradient(loss, w)
        grad = tf.distribute.get_replica_context().all_reduce("sum", grad)
        w.assign_sub(0.1 * grad * scale)
        return loss

    return strategy.run(step, args=(x,))


with nddebug.trace():
    train_step()
