"""The seed-004 job rebuilt for TensorFlow 2.21: a Keras 2 / TF 1.13 ``Session`` training script
whose second loss took one of two values over 10 processes (keras-team/keras#12724).

Keras 2 does not run on TF 2.21, so its pieces are written out with ``tf.compat.v1``, as Keras
2.2.4 built them: the Keras cifar10 CNN (conv-conv-pool-dropout twice, dense 512, dropout 0.5,
dense 10, softmax), categorical cross-entropy, categorical accuracy twice as metrics, and
``RMSprop(lr=1e-4, decay=1e-6)``, whose learning rate reads ``iterations`` while the same
``Session.run`` increments it (Keras 2's ``get_updates``). Seeds set, one thread, CPU only,
64 images of ones, two steps of 32. Differences from the original: resource variables (TF 2's
default) instead of reference variables, and glorot-uniform initialisers seeded by the graph seed.

Run it: ``python -m nddebug.examples.keras2_session`` prints the two losses; under
``nddebug run --all -n 10`` every Session.run is traced. What nddebug finds (docs/tf1-sessions.md):
the learning rate's read of ``iterations`` races its increment; traced, 3 of 10 processes read it
after the increment, and that read is the one source.
"""

from __future__ import annotations

import random

import numpy as np


def build(seed: int = 999) -> tuple:
    """Return ``(session, train_outputs, feeds)``: the Keras 2-style graph in a new session."""
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    random.seed(seed)
    np.random.seed(seed)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        x = tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3], name="input")
        y = tf.compat.v1.placeholder(tf.float32, [None, 10], name="target")
        training = tf.compat.v1.placeholder_with_default(False, [], name="learning_phase")
        params: list = []

        def var(name: str, shape: list[int]) -> tf.Variable:
            init = tf.compat.v1.glorot_uniform_initializer() if len(shape) > 1 else tf.zeros
            v = tf.compat.v1.get_variable(name, shape, initializer=init)
            params.append(v)
            return v

        def conv(h: tf.Tensor, name: str, filters: int, padding: str) -> tf.Tensor:
            w = var(f"{name}/kernel", [3, 3, int(h.shape[-1]), filters])
            b = var(f"{name}/bias", [filters])
            return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(h, w, 1, padding), b))

        def dropout(h: tf.Tensor, rate: float) -> tf.Tensor:
            # Keras 2's K.in_train_phase(K.dropout(x), x) with a graph-seeded dropout.
            return tf.cond(training, lambda: tf.compat.v1.nn.dropout(h, rate=rate), lambda: h)

        h = conv(x, "conv2d_1", 32, "SAME")
        h = conv(h, "conv2d_2", 32, "VALID")
        h = dropout(tf.nn.max_pool2d(h, 2, 2, "VALID"), 0.25)
        h = conv(h, "conv2d_3", 64, "SAME")
        h = conv(h, "conv2d_4", 64, "VALID")
        h = dropout(tf.nn.max_pool2d(h, 2, 2, "VALID"), 0.25)
        h = tf.reshape(h, [-1, int(np.prod(h.shape[1:]))])
        h = tf.nn.relu(tf.matmul(h, var("dense_1/kernel", [int(h.shape[-1]), 512]))
                       + var("dense_1/bias", [512]))  # fmt: skip
        h = dropout(h, 0.5)
        logits = tf.matmul(h, var("dense_2/kernel", [512, 10])) + var("dense_2/bias", [10])
        probs = tf.nn.softmax(logits)
        # Keras 2's categorical_crossentropy on probabilities: clip, log, sum.
        clipped = tf.clip_by_value(probs, 1e-7, 1 - 1e-7)
        loss = tf.reduce_mean(-tf.reduce_sum(y * tf.math.log(clipped), axis=-1))
        hits = tf.cast(tf.equal(tf.argmax(y, -1), tf.argmax(probs, -1)), tf.float32)
        metrics = [tf.reduce_mean(hits), tf.reduce_mean(hits)]  # the metric given twice

        # keras.optimizers.RMSprop(lr=1e-4, decay=1e-6).get_updates, Keras 2.2.4.
        iterations = tf.compat.v1.get_variable(
            "iterations", [], tf.int64, initializer=tf.zeros_initializer(), trainable=False
        )
        grads = tf.gradients(loss, params)
        accumulators = [
            tf.compat.v1.get_variable(f"acc_{i}", p.shape, initializer=tf.zeros_initializer())
            for i, p in enumerate(params)
        ]
        rho, epsilon, decay = 0.9, 1e-7, 1e-6
        lr = 1e-4 * (1.0 / (1.0 + decay * tf.cast(iterations.read_value(), tf.float32)))
        outputs = [loss, *metrics]
        # Keras 2's backend Function: the updates run after the outputs.
        with tf.control_dependencies(outputs):
            updates = [tf.compat.v1.assign_add(iterations, 1)]
            for p, g, a in zip(params, grads, accumulators, strict=True):
                new_a = rho * a + (1.0 - rho) * tf.square(g)
                updates.append(tf.compat.v1.assign(a, new_a))
                updates.append(tf.compat.v1.assign(p, p - lr * g / (tf.sqrt(new_a) + epsilon)))
            train_op = tf.group(*updates)
        config = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=1,
            inter_op_parallelism_threads=1,
            device_count={"GPU": 0},
        )
        session = tf.compat.v1.Session(graph=graph, config=config)
        session.run(tf.compat.v1.global_variables_initializer())
    return session, [outputs, train_op], (x, y, training)


def train(steps: int = 2) -> list[float]:
    """Train two batches of 32 from the job's phony data; return each step's loss."""
    session, fetches, (x, y, training) = build()
    xtrain = np.ones([64, 32, 32, 3], np.float32) / 255
    ytrain = np.array([[1] + [0] * 9 for _ in range(64)], np.float32)
    losses = []
    for step in range(steps):
        batch = slice(32 * step, 32 * step + 32)
        (loss, *_), _ = session.run(fetches, {x: xtrain[batch], y: ytrain[batch], training: True})
        losses.append(float(loss))
    return losses


if __name__ == "__main__":
    print(train())
