"""Observe without disturbing: valid TensorFlow code runs under nddebug, and computes exactly
the bits it computes without it — inside trace(), in check(), and for an instrumented function
called after the block.

Each workload is built twice from the same seed: once plain, once traced. Their results
(outputs and the variables after the step) must be bitwise equal, then the traced function
is called again outside trace() and must still give the plain bits. The workloads cover ops
that may forward a buffer in place (AddN, Add, Relu, BiasAdd, variable updates), shapes not
known when the graph is built, control flow and its gradients (while loops, nested conds,
scan, map_fn), recompute_grad and custom gradients, Keras RNNs, and building blocks of
keras.applications models (hard-swish, swish, squeeze-and-excite).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug.recording import ARGUMENT_BY_CALLER
from tests.helpers import ROOT, on_cpu, subprocess_env

Workload = tuple[Callable[..., Any], tuple[Any, ...], list[tf.Variable]]


def _addn_unknown_shape() -> Workload:
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def step(x):
        a = tf.sin(x) * 3.1
        b = tf.cos(x) * 1.7
        c = tf.exp(-x * x) * 11.3
        return tf.nn.relu(tf.add_n([a, b, c]) * 0.5)

    x = tf.constant(np.random.RandomState(0).randn(1 << 18).astype("float32") * 100)
    return step, (x,), []


def _bias_add_update() -> Workload:
    w = tf.Variable(tf.random.stateless_normal([64, 32], seed=[1, 2]))
    b = tf.Variable(tf.zeros([32]))

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
    def step(x):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w), b))
            loss = tf.reduce_sum(tf.add_n([h, h * 2.0, tf.square(h)]))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(1e-4 * gw)
        b.assign_add(-1e-4 * gb)
        return loss

    x = tf.random.stateless_normal([256, 64], seed=[3, 4])
    return step, (x,), [w, b]


def _while_loop_gradient() -> Workload:
    v = tf.Variable(tf.linspace(0.5, 1.5, 16))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:

            def body(i, acc):
                acc = tf.cond(i % 2 == 0, lambda: acc * v, lambda: acc + v)
                _, acc = tf.while_loop(
                    lambda j, a: j < 2, lambda j, a: (j + 1, a * 0.5 + v), (0, acc)
                )
                return i + 1, acc

            _, out = tf.while_loop(lambda i, a: i < 3, body, (0, x))
            loss = tf.reduce_sum(out)
        v.assign_sub(1e-3 * tape.gradient(loss, v))
        return loss

    return step, (tf.ones([16]),), [v]


def _scan_map_fn() -> Workload:
    v = tf.Variable(tf.linspace(0.1, 0.9, 8))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            s = tf.scan(lambda a, e: a * v + e, x)
            m = tf.map_fn(lambda r: tf.reduce_sum(r * v), s)
            loss = tf.reduce_sum(m)
        v.assign_sub(1e-3 * tape.gradient(loss, v))
        return loss

    return step, (tf.ones([5, 8]),), [v]


def _second_order_through(loop: str) -> Callable[[], Workload]:
    """A gradient of a gradient through a loop (a gradient penalty, a Hessian-vector
    product). The first gradient's loop adds each iteration's terms to the carried gradient
    one sum at a time; grappler merges those sums into one AddN where none of them has a
    control input, so nddebug's records must order them otherwise (1 to 8 ULPs in 11 to 13
    of 64 elements, probe round 38)."""

    def make() -> Workload:
        rng = np.random.RandomState(0)
        w = tf.Variable(rng.randn(8, 8).astype("float32") * 0.3)

        def forward(x):
            if loop == "while":
                return tf.while_loop(
                    lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(h @ w)), (0, x)
                )[1]
            if loop == "range":
                h = x
                for _ in tf.range(3):
                    h = tf.nn.softplus(h @ w)
                return h
            return tf.scan(
                lambda a, e: tf.tanh(a @ w) + e, tf.stack([x, x * 0.5, x * 0.2]), initializer=x
            )

        @tf.function
        def step(x):
            with tf.GradientTape() as outer:
                with tf.GradientTape() as inner:
                    loss = tf.reduce_sum(forward(x) ** 2)
                penalty = tf.reduce_sum(inner.gradient(loss, w) ** 2)
            w.assign_sub(1e-3 * outer.gradient(penalty, w))
            return penalty

        return step, (tf.constant(rng.randn(16, 8).astype("float32")),), [w]

    return make


def _recompute_and_custom_gradient() -> Workload:
    v = tf.Variable(tf.linspace(-1.0, 1.0, 8))

    @tf.custom_gradient
    def clip(x):
        return tf.identity(x), lambda dy: tf.clip_by_value(dy, -0.5, 0.5)

    block = tf.recompute_grad(lambda x: tf.nn.relu(x * v) + x)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(clip(block(x)) ** 2)
        v.assign_sub(1e-2 * tape.gradient(loss, v))
        return loss

    return step, (tf.linspace(-2.0, 2.0, 8),), [v]


def _keras_rnn(layer: Callable[[], Any]) -> Callable[[], Workload]:
    def make() -> Workload:
        import keras

        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.layers.Embedding(50, 8), layer(), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        rng = np.random.RandomState(0)
        x = rng.randint(0, 50, (8, 6))
        y = rng.randn(8, 1).astype("float32")
        model.build((None, 6))
        return model.train_on_batch, (x, y), model

    return make


def _bilstm() -> Any:
    import keras

    return keras.layers.Bidirectional(keras.layers.LSTM(4))


def _gru() -> Any:
    import keras

    return keras.layers.GRU(4)


def _keras_optimizer(optimizer: str) -> Callable[[], Workload]:
    """A small conv net (Conv2D+bias+ReLU, BatchNorm, GELU, LayerNorm, softmax) trained by one
    Keras optimizer: each update has its own arithmetic (x / sqrt(y), sums of products) that
    grappler rewrites in the plain program (Adadelta's x / sqrt(y) -> x * rsqrt(y))."""

    def make() -> Workload:
        import keras

        keras.utils.set_random_seed(11)
        layers = keras.layers
        model = keras.Sequential(
            [
                keras.Input((8, 8, 3)),
                layers.Conv2D(8, 3, activation="relu"),
                layers.BatchNormalization(),
                layers.Flatten(),
                layers.Dense(16, activation="gelu"),
                layers.LayerNormalization(),
                layers.Dense(4, activation="softmax"),
            ]
        )
        model.compile(optimizer=optimizer, loss="categorical_crossentropy")
        rng = np.random.RandomState(1)
        x = rng.randn(32, 8, 8, 3).astype("float32")
        y = np.eye(4, dtype="float32")[rng.randint(0, 4, 32)]
        return model.train_on_batch, (x, y), model

    return make


def _gated_classifier(inp: Any, x: Any, gate: Any, data_seed: int) -> Workload:
    """A squeeze-and-excite block's end (``x`` times its ``gate``) under a 4-class head,
    trained one step by Adam on 8 random 8x8x3 images."""
    import keras

    layers = keras.layers
    x = layers.Multiply()([x, gate])
    model = keras.Model(inp, layers.Dense(4)(layers.GlobalAveragePooling2D()(x)))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.RandomState(data_seed)
    x_in = rng.rand(8, 8, 8, 3).astype("float32")
    return model.train_on_batch, (x_in, rng.randint(0, 4, 8)), model


def _squeeze_excite_hard_swish() -> Workload:
    """MobileNetV3's building blocks: hard-swish (x * relu6(x + 3) / 6: the gradient with
    respect to the constant 6 is computed only if something records it, and its ops are more
    consumers of the activations) and a squeeze-and-excite block, whose 1x1 convolution's
    filter gradient has as many elements as its output gradient (16 x 8 = 8 x 16)."""
    import keras

    keras.utils.set_random_seed(5)
    layers = keras.layers
    inp = keras.Input((8, 8, 3))
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(inp)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("hard_swish")(x)
    s = layers.GlobalAveragePooling2D(keepdims=True)(x)
    s = layers.ReLU()(layers.Conv2D(8, 1)(s))
    s = layers.ReLU(6.0)(layers.Conv2D(16, 1)(s) + 3.0) * (1.0 / 6.0)
    return _gated_classifier(inp, x, s, data_seed=2)


def _swish_depthwise_block() -> Workload:
    """EfficientNet's building block: convolutions, BatchNorm and swish (x * sigmoid(x)),
    with a sigmoid-gated squeeze-and-excite. With oneDNN on, grappler fuses each
    Mul(x, Sigmoid(x)) into one _MklSwish kernel, which rounds otherwise; a control input
    into the Sigmoid keeps it from doing so."""
    import keras

    keras.utils.set_random_seed(9)
    layers = keras.layers
    inp = keras.Input((8, 8, 3))
    x = layers.Conv2D(8, 3, padding="same", use_bias=False)(inp)
    x = layers.Activation("swish")(layers.BatchNormalization()(x))
    x = layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
    x = layers.Activation("swish")(layers.BatchNormalization()(x))
    s = layers.GlobalAveragePooling2D(keepdims=True)(x)
    s = layers.Conv2D(4, 1, activation="swish")(s)
    s = layers.Conv2D(8, 1, activation="sigmoid")(s)
    return _gated_classifier(inp, x, s, data_seed=3)


def _add_bias_tanh_sigmoid() -> Workload:
    """Hand-written layers that add their bias with `+` (AddV2) before tanh and sigmoid: with
    oneDNN on, grappler fuses MatMul + that Add + the activation into one kernel, which
    rounds otherwise; a digest of the sum kept the fusion from happening (234 of 512 tanh
    outputs differed)."""
    w1 = tf.Variable(tf.random.stateless_normal([16, 16], seed=[5, 6]) * 0.3)
    b1 = tf.Variable(tf.random.stateless_normal([16], seed=[7, 8]) * 0.1)
    w2 = tf.Variable(tf.random.stateless_normal([16, 4], seed=[9, 10]) * 0.3)
    b2 = tf.Variable(tf.zeros([4]))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = tf.tanh(x @ w1 + b1)
            loss = tf.reduce_sum(tf.sigmoid(h @ w2 + b2) ** 2)
        variables = [w1, b1, w2, b2]
        for v, g in zip(variables, tape.gradient(loss, variables), strict=True):
            v.assign_sub(0.1 * g)
        return loss

    return step, (tf.random.stateless_normal([32, 16], seed=[1, 1]),), [w1, b1, w2, b2]


def _product_over_a_constant() -> Workload:
    """(x * tanh(x)) / 6: the gradient with respect to the constant 6 reads the product and
    is pruned, and grappler then folds the 6 into the product (x * (tanh(x) / 6)) as the
    product has one reader left. The product's record, made for that pruned reader, was the
    second reader that kept the plain program's fold from happening."""
    w = tf.Variable(tf.random.stateless_normal([32, 16], seed=[2, 3]))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((w * tf.tanh(w) / 6.0) ** 2)
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    return step, (), [w]


def _vectorized_map_and_jacobian() -> Workload:
    """tf.vectorized_map and a Jacobian (pfor): the loop body is built once as a template and
    vectorized ops are made from it without op callbacks. Recorded, the template's records
    were vectorized into while loops of their own."""
    w = tf.Variable(tf.random.stateless_normal([6, 6], seed=[4, 4]) * 0.5)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            rows = tf.vectorized_map(lambda r: tf.tanh(tf.linalg.matvec(w, r)) * 2.0, x)
            loss = tf.reduce_sum(rows**2)
        with tf.GradientTape() as outer:
            outer.watch(x)
            y = tf.sin(x @ w)
        jac = outer.batch_jacobian(y, x)
        w.assign_sub(0.01 * tape.gradient(loss, w) + 1e-3 * tf.reduce_mean(jac, axis=0))
        return loss

    return step, (tf.random.stateless_normal([5, 6], seed=[8, 9]),), [w]


def _gradients_only() -> Workload:
    """A step that returns only gradients (accumulated elsewhere), its loss value used by
    nothing: grappler prunes the forward square, turns pow(y, 2 - 1) into y, and folds the
    constants of y = (x * tanh(x)) / 6 into the gradient's product. The records of y and of
    the pow, made for the pruned square, kept those rewrites from happening."""
    w = tf.Variable(tf.random.stateless_normal([32, 16], seed=[6, 7]))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            y = w * tf.tanh(w) / 6.0
            loss = tf.reduce_sum(y**2) + tf.reduce_sum(tf.square(tf.exp(w) / 3.0))
        return tape.gradient(loss, w)

    return step, (), [w]


def _silu_then_cond() -> Workload:
    """silu followed by a tf.cond, two gradients from one persistent tape. Records made the
    cond a stateful If (StatelessIf in the plain program): automatic control dependencies
    chained it, and grappler no longer merged the forward sigmoid with the gradient's, so
    the forward became one _MklSwish kernel: the first gradient was 2 ULP away."""
    w = tf.Variable(tf.random.stateless_normal([4, 4], seed=[8, 9]) * 0.3)
    x = tf.random.stateless_normal([2, 4], seed=[10, 11])

    @tf.function
    def step(x, k):
        with tf.GradientTape(persistent=True) as tape:
            h = tf.nn.silu(x @ w)
            h = tf.cond(
                k % 2 == 0,
                lambda: tf.tanh(h),
                lambda: tf.nn.relu(h) - tf.stop_gradient(h) * 0.1,
            )
            l1 = tf.reduce_sum(h**2)
            l2 = tf.reduce_sum(tf.abs(h))
        return tape.gradient(l1, w), tape.gradient(l2, w)

    return step, (x, tf.constant(3)), [w]


def _nested_function_silu() -> Workload:
    """A nested tf.function under a persistent tape: its call was chained by automatic
    control dependencies (a stateful call, for its records), inlined behind a control
    node, and silu's `beta * x` (beta 1) removal left a control edge on the sigmoid that
    kept it from the plain program's _MklSwish: 1 ULP in the first gradient."""
    w = tf.Variable(tf.random.stateless_normal([4, 4], seed=[12, 13]) * 0.3)
    x = tf.random.stateless_normal([2, 4], seed=[14, 15])

    @tf.function
    def inner(h):
        return tf.nn.silu(h)

    @tf.function
    def step():
        with tf.GradientTape(persistent=True) as tape:
            h = inner(x @ w)
            l1 = tf.reduce_sum(h**2)
            l2 = tf.reduce_sum(tf.abs(h))
        return tape.gradient(l1, w), tape.gradient(l2, w)

    return step, (), [w]


def _nested_function_optimizer_step() -> Workload:
    """A nested function (silu times a constant, plus sin) and an optimizer update. The
    gradient hands the backward function silu's output, which it does not read (its gradient
    recomputes from the input); grappler prunes that argument once it inlines the call and
    pushes the constant down the product. A digest of that argument in the caller (for the
    backward call's record) was a reader the plain program does not have: the loss of the
    second call was 1 ULP away, and the weights after it."""
    import keras

    w = tf.Variable(tf.reshape(tf.range(16, dtype=tf.float32), [4, 4]) * 0.03)
    x = tf.reshape(tf.range(8, dtype=tf.float32), [2, 4]) * 0.1
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build([w])

    @tf.function
    def inner(h):
        return tf.nn.silu(h) * 1.3 + tf.sin(h)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            a = inner(x @ w)
            loss = tf.reduce_sum(a * a) + tf.reduce_mean(a - a)
        optimizer.apply_gradients([(tape.gradient(loss, w), w)])
        return loss

    return step, (), [w]


def _nested_result_rewritten_by_the_caller() -> Workload:
    """A nested function returning silu(h), squared by the loss, one gradient: the plain
    program's grappler moves the gradient's constant into the product across the inlined
    call, and then does not fuse x * sigmoid(x). A record of the result inside the function
    (or by the call) was one more reader: the gradient was 1 ULP away. The caller now records
    it, where it is read."""
    w = tf.Variable(tf.random.stateless_normal([16, 32], seed=[16, 17]) * 0.3)
    x = tf.random.stateless_normal([32, 16], seed=[18, 19])
    return _nested_and_squared(tf.nn.silu, x, w)


def _nested_and_squared(activation: Callable[[Any], Any], x: Any, w: Any) -> Workload:
    """``activation`` as a nested tf.function of ``x @ w``, squared by the loss: the gradient
    with respect to ``w``."""

    @tf.function
    def inner(h):
        return activation(h)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(inner(x @ w) ** 2)
        return tape.gradient(loss, w)

    return step, (), [w]


def _nested_product_in_its_gradient() -> Workload:
    """A nested function returning tanh(h) * 1.1, squared by the loss, one gradient. Once
    grappler inlines the backward function's call, it pushes the loss gradient's constant
    into the backward function's product by 1.1. A digest of the backward function's
    argument (the loss gradient), made inside it or by the call, was the second reader that
    stops that: the gradient was 1 ULP away. The call's record now holds what the argument
    is made of, and the function digests nothing in its place."""
    w = tf.Variable(tf.constant(np.random.RandomState(1).randn(16, 32).astype("float32") * 0.3))
    x = tf.constant(np.random.RandomState(0).randn(32, 16).astype("float32"))
    return _nested_and_squared(lambda h: tf.tanh(h) * 1.1, x, w)


def _nested_function_uses_what_it_returns() -> Workload:
    """A nested function returning ``a = silu(h) * 1.3`` and ``a @ w2``, both squared by the
    loss, one gradient. Once grappler inlines the backward function's call, it merges the
    function's sum of its two gradient terms with the caller's ``a + a`` into one AddN. The
    function's AddN waited for the digest of its other term (it may take over that buffer),
    and a control input stops the merge: 94 of 256 gradient elements were 1 ULP away."""
    rng = np.random.RandomState(2)
    x = tf.constant(rng.randn(64, 16).astype("float32"))
    w1 = tf.Variable(tf.constant(rng.randn(16, 16).astype("float32") * 0.2))
    w2 = tf.Variable(tf.constant(rng.randn(16, 8).astype("float32") * 0.2))

    @tf.function
    def inner(h):
        a = tf.nn.silu(h) * 1.3
        return a @ w2, a

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            out, a = inner(x @ w1)
            loss = tf.reduce_sum(out * out) + tf.reduce_sum(a * a)
        return tape.gradient(loss, w1)

    return step, (), [w1, w2]


def _nested_result_returned_twice() -> Workload:
    """A nested function returning one product twice (a dict with two keys), both read by
    the loss: the gradients with respect to the weights and the bias were 1 ULP away."""
    w = tf.Variable(tf.reshape(tf.sin(tf.range(256, dtype=tf.float32)), [16, 16]))
    bias = tf.Variable(tf.cos(tf.range(16, dtype=tf.float32)) * 0.1)
    x = tf.reshape(tf.sin(tf.range(128, dtype=tf.float32) * 0.7), [8, 16])

    @tf.function
    def inner(h):
        p = h * 1.3
        return {"p": p, "q": p}

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            d = inner(tf.matmul(x, w) + bias)
            loss = tf.reduce_sum(d["p"] * d["q"]) + tf.reduce_sum(d["p"] * 3.0)
        return tape.gradient(loss, [w, bias])

    return step, (), [w, bias]


def _functions_nested_two_deep(callers: str) -> Callable[[], Workload]:
    """``mid(h) = inner(h * 0.9) * 2``, ``inner(h) = tanh(h * 1.1)``, the loss squared, one
    gradient: the plain program folds the gradient's constants of all three functions into
    one product. A backward function's result was recorded inside it (only a tf.function's
    body left its results to the caller), and a backward function handed on to the one
    nested in it a forward value that one does not read, which the caller then digested:
    the loss and 23 of 64 gradient elements were 1 ULP away. ``callers="two"`` also calls
    ``inner`` directly (26 of 64)."""

    def make() -> Workload:
        x = tf.reshape(tf.sin(tf.range(64, dtype=tf.float32)), [8, 8])
        w = tf.Variable(tf.reshape(tf.cos(tf.range(64, dtype=tf.float32)), [8, 8]) * 0.3)

        @tf.function
        def inner(h):
            return tf.tanh(h * 1.1)

        @tf.function
        def mid(h):
            return inner(h * 0.9) * 2.0

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                h = x @ w
                y = mid(h * 0.5) if callers == "one" else inner(h * 0.5) + mid(h * 0.5)
                loss = tf.reduce_mean(y**2)
            return loss, tape.gradient(loss, w)

        return step, (), [w]

    return make


def _nested_forward_and_loss() -> Workload:
    """The model's forward pass and the loss each a nested tf.function (silu times 1.3, then
    softmax cross-entropy). The gradient rewrites the forward call to return the values its
    backward function needs; the call's record digested those too, and once grappler
    inlined both calls the digest of silu's IdentityN kept it, and silu * 1.3 was not
    rewritten as in the plain program: 32 of 640 weight-gradient elements up to 32 ULP
    away. A forward call's record now holds the function's own outputs; the backward call's
    record holds the ones it reads."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((64, 20)), tf.float32)
    y = tf.constant(rng.integers(0, 5, 64), tf.int32)
    w1 = tf.Variable(rng.standard_normal((20, 32)).astype(np.float32) * 0.3)
    w2 = tf.Variable(rng.standard_normal((32, 5)).astype(np.float32) * 0.3)

    @tf.function
    def forward(x):
        return tf.nn.silu(x @ w1) * 1.3 @ w2

    @tf.function
    def loss_of(logits, y):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_of(forward(x), y)
        return tape.gradient(loss, [w1, w2])

    return step, (), [w1, w2]


def _conv_batch_norm_inference(train: bool) -> Callable[[], Workload]:
    """Conv2D into FusedBatchNorm in inference (tf.compat.v1 / tf_keras BatchNormalization
    with fused=True, frozen or at inference). Grappler fuses the two while FusedBatchNorm's
    side outputs are unread; nddebug digested them, and the traced step was 4.77e-07 off.
    ``train``: fine-tuning through the frozen layer (its gradient reads the side outputs)."""

    def make() -> Workload:
        rng = np.random.RandomState(0)
        x = tf.constant(rng.randn(8, 16, 16, 8).astype("float32"))
        k = tf.Variable(rng.randn(3, 3, 8, 16).astype("float32") * 0.1)
        mean = tf.constant(rng.randn(16).astype("float32"))
        var = tf.constant(rng.rand(16).astype("float32") + 0.5)
        gamma = tf.Variable(tf.ones([16]))

        def forward():
            y = tf.nn.conv2d(x, k, 1, "SAME")
            out = tf.compat.v1.nn.fused_batch_norm(
                y, gamma, tf.zeros([16]), mean, var, is_training=False
            )
            return tf.nn.relu(out[0])

        @tf.function
        def step():
            if not train:
                return forward()
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(forward()))
            gk, gg = tape.gradient(loss, [k, gamma])
            k.assign_sub(1e-3 * gk)
            gamma.assign_sub(1e-3 * gg)
            return loss

        return step, (), [k, gamma]

    return make


def _conv_batch_norm_elu_inference() -> Workload:
    """Conv2D, FusedBatchNorm in inference, Elu: on the CPU the remapper makes the three one
    _FusedConv2D only where the batch norm's output has one reader. Digested, the Elu ran on
    its own, and 532 of 4,608 elements were off plain (oneDNN on)."""
    rng = np.random.RandomState(2)
    x = tf.constant(rng.randn(4, 12, 12, 8).astype("float32"))
    k = tf.Variable(rng.randn(3, 3, 8, 8).astype("float32") * 0.2)
    mean = tf.constant(rng.randn(8).astype("float32"))
    var = tf.constant(rng.rand(8).astype("float32") + 0.5)
    gamma = tf.Variable(tf.ones([8]))

    @tf.function
    def step():
        y = tf.nn.conv2d(x, k, 1, "SAME")
        out = tf.compat.v1.nn.fused_batch_norm(
            y, gamma, tf.zeros([8]), mean, var, is_training=False
        )
        return tf.nn.elu(out[0])

    return step, (), [k, gamma]


def _batch_norm_residual_inference() -> Workload:
    """A residual block at inference: Conv2D, FusedBatchNorm, the shortcut added, Relu. On the
    GPU the remapper makes FusedBatchNorm + Add + Relu one kernel (_FusedBatchNormEx) only
    where the batch norm's output and the sum have no other reader; a digest of either kept
    it from happening, and the unfused kernels round otherwise (H100, 2026-11-27)."""
    rng = np.random.RandomState(1)
    x = tf.constant(rng.randn(8, 16, 16, 16).astype("float32"))
    k = tf.Variable(rng.randn(3, 3, 16, 16).astype("float32") * 0.1)
    mean = tf.constant(rng.randn(16).astype("float32"))
    var = tf.constant(rng.rand(16).astype("float32") + 0.5)
    gamma = tf.Variable(rng.rand(16).astype("float32") + 0.5)

    @tf.function
    def step():
        y = tf.nn.conv2d(x, k, 1, "SAME")
        out = tf.compat.v1.nn.fused_batch_norm(
            y, gamma, tf.zeros([16]), mean, var, is_training=False
        )
        return tf.nn.relu(out[0] + x)

    return step, (), [k, gamma]


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "batch_norm_residual_inference": _batch_norm_residual_inference,
    "conv_batch_norm_elu_inference": _conv_batch_norm_elu_inference,
    "silu_then_cond": _silu_then_cond,
    "conv_batch_norm_inference": _conv_batch_norm_inference(train=False),
    "frozen_batch_norm_fine_tuning": _conv_batch_norm_inference(train=True),
    "nested_function_silu": _nested_function_silu,
    "nested_function_optimizer_step": _nested_function_optimizer_step,
    "nested_result_rewritten_by_the_caller": _nested_result_rewritten_by_the_caller,
    "nested_product_in_its_gradient": _nested_product_in_its_gradient,
    "nested_result_returned_twice": _nested_result_returned_twice,
    "nested_function_uses_what_it_returns": _nested_function_uses_what_it_returns,
    "functions_nested_two_deep": _functions_nested_two_deep("one"),
    "nested_forward_and_loss": _nested_forward_and_loss,
    "functions_nested_two_deep_two_callers": _functions_nested_two_deep("two"),
    "gradients_only": _gradients_only,
    "vectorized_map_and_jacobian": _vectorized_map_and_jacobian,
    "add_bias_tanh_sigmoid": _add_bias_tanh_sigmoid,
    "product_over_a_constant": _product_over_a_constant,
    "squeeze_excite_hard_swish": _squeeze_excite_hard_swish,
    "swish_depthwise_block": _swish_depthwise_block,
    "addn_unknown_shape": _addn_unknown_shape,
    "bias_add_update": _bias_add_update,
    "while_loop_gradient": _while_loop_gradient,
    **{f"second_order_through_{k}": _second_order_through(k) for k in ("while", "range", "scan")},
    "scan_map_fn": _scan_map_fn,
    "recompute_and_custom_gradient": _recompute_and_custom_gradient,
    "embedding_bilstm": _keras_rnn(_bilstm),
    "gru": _keras_rnn(_gru),
    **{
        f"keras_{opt}": _keras_optimizer(opt)
        for opt in ("adadelta", "adagrad", "ftrl", "rmsprop", "nadam", "lion")
    },
}


def _variables(state: Any) -> list[tf.Variable]:
    return list(state.variables) if hasattr(state, "variables") else list(state)


def _bits(result: Any, state: Any) -> list[bytes]:
    values = [np.asarray(r) for r in tf.nest.flatten(result)]
    values += [v.numpy() for v in _variables(state)]
    return [v.tobytes() for v in values]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_traced_step_computes_the_plain_bits(name: str) -> None:
    # On the CPU: on a GPU, several of these steps (bias_add and embedding gradients) differ
    # from run to run by themselves, and Keras compiles their optimizers with XLA.
    with on_cpu():
        plain_step, args, plain_state = WORKLOADS[name]()
        plain = [_bits(plain_step(*args), plain_state) for _ in range(2)]

        step, args, state = WORKLOADS[name]()
        with nddebug.trace() as rec:
            traced = [_bits(step(*args), state) for _ in range(2)]
        assert rec.events and not rec.warnings, rec.warnings
        assert traced == plain, f"{name}: tracing changed what the step computes"
        after = _bits(step(*args), state)
        assert after == _bits(plain_step(*args), plain_state), f"{name}: changed after trace()"


@pytest.mark.parametrize("name", ["while_loop_gradient", "embedding_bilstm"])
def test_check_runs_control_flow_gradients_and_leaves_one_step(name: str) -> None:
    with on_cpu():  # an embedding's gradient is non-deterministic on a GPU
        plain_step, args, plain_state = WORKLOADS[name]()
        expected = _bits(plain_step(*args), plain_state)
        step, args, state = WORKLOADS[name]()
        report = nddebug.check(step, *args, state=state, repeats=3)
        assert report.ok, str(report)
        after = [v.numpy().tobytes() for v in _variables(state)]
    assert after == expected[-len(after) :], "check() did not leave the state of one plain step"


def test_grappler_add_chain_rewrite_is_kept() -> None:
    """Grappler's arithmetic optimizer merges an Add/AddN chain into one AddN (another
    summation order) only where each intermediate sum has a single consumer: nddebug must not
    add a second one (a digest, or a control edge into the sum)."""

    def make() -> Any:
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def step(x):
            a = tf.sin(x) * 3.1
            return tf.add_n([a, tf.cos(x) * 1.7, tf.exp(-x * x) * 11.3]) + a

        return step

    rng = np.random.RandomState(0)
    x = tf.constant(rng.randn(1 << 18).astype("float32") * 100)
    plain = make()(x).numpy().tobytes()
    step = make()
    with nddebug.trace():
        traced = step(x).numpy().tobytes()
    assert traced == plain
    assert step(x).numpy().tobytes() == plain  # and after the block
    # Three captured tensors summed in two steps: (a + b) + c.
    a, b, c = (tf.constant(rng.randn(4096).astype("float32")) for _ in range(3))
    plain = tf.function(lambda: (a + b) + c)().numpy().tobytes()
    summed = tf.function(lambda: (a + b) + c)
    with nddebug.trace():
        assert summed().numpy().tobytes() == plain


def _chain_step(terms: Callable[[Any], Any]) -> tuple[Callable[[], Any], tf.Variable]:
    rng = np.random.RandomState(0)
    x = tf.constant(rng.randn(64, 32).astype("float32"))
    w = tf.Variable(rng.randn(32, 32).astype("float32") * 0.2)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            y = terms(tf.matmul(x, w))
            loss = tf.reduce_mean(tf.square(y)) + tf.reduce_mean(y)
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    return step, w


@pytest.mark.parametrize(
    ("name", "terms"),
    [
        ("h + h * 0.5 + tanh(h)", lambda h: h + h * 0.5 + tf.tanh(h)),
        ("h * 0.5 + tanh(h) + sin(h)", lambda h: h * 0.5 + tf.tanh(h) + tf.sin(h)),
        ("h + tanh(h) + sin(h)", lambda h: h + tf.tanh(h) + tf.sin(h)),
    ],
)
def test_a_merged_sum_adds_its_terms_in_the_plain_order(name, terms) -> None:
    """Grappler merges a chain of adds into one AddN only where no add has a control edge.
    AddN adds the others to the first term nothing else holds (order matters from three
    terms): with a record still reading the first, it took over the scaled term, and the
    traced gradient of ``h + h * 0.5 + tanh(h)`` was a few ULPs off the plain one in 15 runs
    of 15. The adds read their terms through Identities that wait for the records, which
    grappler removes after the merge, handing their waits to the merged AddN."""
    with on_cpu():
        step, w = _chain_step(terms)
        step()
        plain = w.numpy().tobytes()
        for _ in range(3):
            step, w = _chain_step(terms)
            with nddebug.trace() as rec:
                step()
            assert not rec.warnings, rec.warnings
            assert w.numpy().tobytes() == plain, f"{name}: tracing changed what the step computes"


def test_a_sum_whose_terms_a_record_may_still_hold_is_named() -> None:
    """The check behind the warning, on optimized graphs as TensorFlow exports them: a merged
    AddN whose first two terms a record may still read when it runs takes over the third
    term's buffer, which it does not in the plain program; where the records are among the
    sum's ancestors, or hold only the first term (a + b is b + a), nothing is named."""
    from tensorflow.core.protobuf import config_pb2

    from nddebug.tracer import optimized_sums

    def metadata(recorded: list[str], ordered: bool) -> Any:
        md = config_pb2.RunMetadata()
        graph = md.function_graphs.add().partition_graphs.add()
        terms = ["a", "b", "c"]
        for t in terms:
            graph.node.add(name=t, op="Tanh", input=["x"])
        records = [f"{t}/nddebug/NddebugDigestRecord" for t in recorded]
        for t, r in zip(recorded, records, strict=True):
            graph.node.add(name=r, op="NddebugDigestRecord", input=[t])
        waits = [f"^{r}" for r in records] if ordered else []
        graph.node.add(name="sum", op="AddN", input=terms + waits)
        return md

    assert optimized_sums.reordered_sums(metadata(["a", "b"], ordered=False)) == ("sum",)
    assert optimized_sums.reordered_sums(metadata(["a", "b"], ordered=True)) == ()
    assert optimized_sums.reordered_sums(metadata(["a"], ordered=False)) == ()
    assert optimized_sums.reordered_sums(metadata([], ordered=False)) == ()


def _residual_affine() -> Any:
    """A BatchNorm-like affine output added to a residual (MobileNetV2's and ResNet's block
    add), trained with a batch dimension unknown when the graph is built, as Keras's train
    function on a tf.data dataset has it: the gradient of each add reads its inputs' shapes."""
    w = tf.Variable(tf.random.stateless_normal([64, 64], seed=[5, 6]) * 0.1)
    s = tf.Variable(tf.random.stateless_normal([64], seed=[7, 8]))
    b = tf.Variable(tf.random.stateless_normal([64], seed=[9, 10]))

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
    def step(x):
        with tf.GradientTape() as tape:
            y = tf.matmul(x, w) * s + b  # the affine: its sum feeds only the residual add
            out = tf.reshape(x + y, [-1, 8, 8])  # a pass-through of the sum chain's end
            loss = tf.reduce_sum(tf.square(out))
        for v, g in zip((w, s, b), tape.gradient(loss, [w, s, b]), strict=True):
            v.assign_sub(1e-4 * g)
        return out

    return step, [w, s, b]


def test_shape_reads_keep_the_sum_rewrite() -> None:
    """With an unknown batch dimension, the gradient of an add reads its inputs' shapes
    (Shape ops). A Shape reads no values, so it must not make nddebug digest the sum it reads:
    that digest was a second consumer, grappler then left (x + (x*s + b)) unmerged, and the
    traced step computed other bits than the plain one (MobileNetV2 fit on a dataset)."""
    x = tf.random.stateless_normal([512, 64], seed=[1, 2]) * 10

    def run(traced: bool, **options: bool) -> list[bytes]:
        step, state = _residual_affine()
        before = tf.config.optimizer.get_experimental_options()
        tf.config.optimizer.set_experimental_options(options)
        try:
            if traced:
                with nddebug.trace() as rec:
                    out = [step(x) for _ in range(2)]
                assert rec.events
            else:
                out = [step(x) for _ in range(2)]
        finally:
            tf.config.optimizer.set_experimental_options(
                {k: before.get(k, True) for k in options} or before
            )
        return [o.numpy().tobytes() for o in out] + [v.numpy().tobytes() for v in state]

    plain = run(False)
    # The rewrite matters here: without it the plain step computes other bits.
    assert run(False, arithmetic_optimization=False) != plain
    assert run(True) == plain


def test_an_identity_of_a_product_keeps_the_chain_rewrite() -> None:
    """Keras's optimizers take an Identity (a cast to the same dtype) of a gradient before
    the update multiplies it by the learning rate. Grappler reorders that product chain
    (the shapes differ: a vector, a vector, a scalar); a digest of the intermediate product,
    made where the Identity read it, was the second consumer that stopped it (MobileNetV2's
    SGD momentum update). A product only an Identity returns is still recorded."""

    def make() -> Any:
        s = tf.Variable(tf.random.stateless_normal([4096], seed=[1, 2]))
        lr = tf.Variable(0.37)

        @tf.function
        def step(x):
            g = tf.identity(tf.sin(x) * tf.math.rsqrt(s * s + 1.0))
            return g * lr, tf.identity(x * 2.0)

        return step

    x = tf.random.stateless_normal([4096], seed=[3, 4]) * 10

    def bits(step: Any) -> list[bytes]:
        return [t.numpy().tobytes() for t in step(x)]

    plain = bits(make())
    before = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    try:
        assert bits(make()) != plain  # the rewrite matters here
    finally:
        tf.config.optimizer.set_experimental_options(
            {"arithmetic_optimization": before.get("arithmetic_optimization", True)}
        )
    step = make()
    with nddebug.trace() as rec:
        assert bits(step) == plain
    assert bits(step) == plain
    muls = [rec.ops[e.op_id].op_name for e in rec.events if rec.ops[e.op_id].op_type == "Mul"]
    # g * lr records the product's inputs in its place; x * 2.0 (mul_3), returned through an
    # Identity and read by nothing else, is recorded when the graph is complete.
    assert sorted(muls) == ["mul_2", "mul_3"]


def test_products_returned_from_loop_bodies_and_branches_are_recorded() -> None:
    """A product that only the Identity returning it reads is recorded once its graph (a
    while-loop body, a cond branch) is complete, and runs there in every iteration."""

    @tf.function
    def step(x):
        y = tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.identity(v * 2.0)), (0, x))[1]
        return tf.cond(tf.reduce_sum(y) > 0, lambda: tf.identity(y * 3.0), lambda: y)

    x = tf.ones([8])
    with nddebug.trace() as rec:
        out = step(x)
    assert out.numpy().tolist() == [24.0] * 8
    muls = [e for e in rec.events if rec.ops[e.op_id].op_type == "Mul"]
    assert len(muls) == 4  # three loop iterations and the branch taken


def test_a_shape_read_is_never_a_source() -> None:
    """Shape ops record no inputs (they read none of their values): when a shape differs, the
    op that made it is the source, not the Shape that read it."""

    @tf.function
    def step(x):
        # Seeded, so that the two calls' draws (the kernel's next numbers) are fixed: their
        # sizes differ every time (unseeded, they were equal in about 1 run in 80).
        kept = tf.boolean_mask(x, tf.random.uniform([4096], seed=1) > 0.5)
        return tf.cast(tf.shape(kept)[0], tf.float32) + tf.reduce_sum(kept)

    x = tf.range(4096, dtype=tf.float32)
    report = nddebug.compare([_traced(step, x) for _ in range(2)])
    assert not report.ok
    assert set(report.sources["op_type"]) == {"RandomUniform"}, report.sources
    shapes = report.culprits[report.culprits["op_type"] == "Shape"]
    assert len(shapes) and set(shapes["role"]) == {"propagated"}


def _traced(step: Callable[..., Any], *args: Any) -> Any:
    with nddebug.trace() as rec:
        step(*args)
    return rec


def test_oneDNN_addn_is_not_disturbed() -> None:
    """oneDNN's AddN (on by default on some CPUs, forced here) computes other bits when it
    cannot reuse an input's buffer: a digest still reading that buffer made the choice
    timing-dependent (2 distinct results in 30 traced calls, against 1 plain)."""
    code = textwrap.dedent(
        """
        import hashlib, json
        import numpy as np, tensorflow as tf, nddebug

        def make():
            @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
            def f(x):
                a = tf.sin(x) * 3.1; b = tf.cos(x) * 1.7; c = tf.exp(-x * x) * 11.3
                return tf.add_n([a, b, c])
            return f

        x = tf.constant(np.random.RandomState(0).randn(1 << 20).astype("float32") * 100)
        h = lambda t: hashlib.sha1(t.numpy().tobytes()).hexdigest()
        f = make()
        plain = sorted({h(f(x)) for _ in range(20)})
        g = make()
        with nddebug.trace():
            traced = sorted({h(g(x)) for _ in range(20)})
        after = sorted({h(g(x)) for _ in range(20)})
        print(json.dumps({"plain": plain, "traced": traced, "after": after}))
        """
    )
    env = subprocess_env({"TF_ENABLE_ONEDNN_OPTS": "1"})
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["plain"]) == 1
    assert out["traced"] == out["plain"] and out["after"] == out["plain"], out


def test_functions_nested_in_tf_data_functions_are_not_step_ops() -> None:
    """A tf.cond inside a Dataset.map function is part of the pipeline: prefetching runs it a
    varying number of times, so it must not be recorded as an op of the step."""
    images = np.arange(32 * 4 * 4 * 3, dtype="float32").reshape(32, 4, 4, 3)
    ds = tf.data.Dataset.from_tensor_slices(images).map(
        lambda x: tf.cond(
            tf.reduce_sum(x) > 500.0, lambda: tf.image.flip_left_right(x), lambda: x * 2.0
        ),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    ds = ds.batch(4).prefetch(2)
    v = tf.Variable(tf.zeros([3]))

    @tf.function
    def step(x):
        v.assign_add(tf.reduce_mean(x, [0, 1, 2]))
        return v.read_value()

    recs = []
    for _ in range(2):
        v.assign(tf.zeros([3]))
        with nddebug.trace() as rec:
            for batch in ds.take(4):
                step(batch)
        recs.append(rec)
    graphs = {recs[0].ops[ev.op_id].graph for ev in recs[0].events}
    assert not any("Dataset" in g or "cond" in g for g in graphs), graphs
    report = nddebug.compare(recs)
    assert report.ok, str(report)


def test_keras_ops_are_located_in_the_users_line_and_layer() -> None:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.ones((8, 3), "float32"), np.ones((8, 1), "float32")
    with nddebug.trace() as rec:
        model.train_on_batch(x, y)  # the line every op of the step is located at
    here = f"{os.path.basename(__file__)}:"
    matmuls = [op for op in rec.ops.values() if op.op_type == "MatMul"]
    assert matmuls
    for op in matmuls:
        assert here in op.location and " in " in op.location, op.location
        assert "dense" in op.location.split(" in ", 1)[1], op.location


def test_nddebug_run_on_a_while_loop_gradient(tmp_path: Any) -> None:
    script = tmp_path / "rnn_step.py"
    script.write_text(
        textwrap.dedent(
            """
            import tensorflow as tf, nddebug
            v = tf.Variable(tf.linspace(0.5, 1.5, 16))

            @tf.function
            def step(x):
                with tf.GradientTape() as tape:
                    _, out = tf.while_loop(
                        lambda i, a: i < 3, lambda i, a: (i + 1, a * v + x), (0, tf.zeros([16]))
                    )
                    loss = tf.reduce_sum(out)
                v.assign_sub(1e-3 * tape.gradient(loss, v))
                return loss

            with nddebug.trace():
                step(tf.ones([16]))
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "nddebug", "run", "-n", "2", str(script)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "reproducible" in proc.stdout and "NOT" not in proc.stdout
    assert not list(tmp_path.glob("*.nddebug"))


@pytest.mark.parametrize("emulate", [False, True])
def test_a_multi_output_op_hands_the_program_a_list_it_can_change(emulate: bool) -> None:
    """TensorFlow gives op callbacks an op's outputs as a tuple; the program gets a list, and
    code changes it in place: Keras's cuDNN GRU swaps the gates of ``tf.split``'s result,
    which raised TypeError under trace() on a GPU. The same swap, on any device."""

    @tf.function
    def swap(x):
        parts = tf.split(x, 3)
        parts[0], parts[1] = parts[1], parts[0]
        unpacked = tf.unstack(x)
        unpacked[2] = unpacked[2] * 2.0
        return tf.concat(parts, 0) + tf.stack(unpacked)

    x = tf.reshape(tf.range(12, dtype=tf.float32), [3, 4])
    plain = tf.function(swap.python_function)(x).numpy()
    with nddebug.trace(emulate_gpu=emulate) as rec:
        traced = swap(x).numpy()
    assert not rec.warnings, rec.warnings
    assert any(rec.ops[e.op_id].op_type == "Split" for e in rec.events)
    assert traced.tobytes() == plain.tobytes()


def test_values_the_program_does_not_need_are_neither_computed_nor_recorded() -> None:
    """A function runs what its outputs and stateful ops need; TensorFlow prunes the rest
    before grappler sees it. A record of an unneeded op would make it run, and be one more
    consumer of what it reads: the record is left out of what the function must run."""
    v = tf.Variable(tf.linspace(0.5, 1.5, 32))

    @tf.function
    def step(x):
        unused = tf.exp(x) * 3.0  # noqa: F841 - nothing reads it
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cos(x * v) / 7.0)  # d/d(7.0) is never needed
        v.assign_sub(0.1 * tape.gradient(loss, v))
        return loss

    x = tf.linspace(-1.0, 1.0, 32)
    with nddebug.trace() as rec:
        step(x)
        step(x)
    units = [rec.ops[e.op_id] for e in rec.events]
    ran = [t for op in units for t in [op.op_type, *op.fused.values()]]
    assert "Cos" in ran and "AssignSubVariableOp" in ran, ran
    assert "Exp" not in ran, ran
    report = nddebug.check(step, x, state=[v], repeats=2)
    assert report.ok, str(report)


def test_sums_grappler_accumulates_are_named_next_to_the_verdict() -> None:
    """Grappler's memory optimizer rewrites an AddN of more than two tensors into locked
    AssignAdds (added in arrival order) where its static peak-memory estimate nears the
    device's, and which sums it picks depends on the whole graph, which nddebug's ops change.
    nddebug cannot make the choice the same as in the untraced step, so it names a rewritten
    sum in the warnings; a step whose estimate stays low gets no such warning."""

    def make(n: int) -> Any:
        @tf.function
        def step(x):
            return tf.reduce_sum(tf.add_n([x * 1.5, x * 2.5, tf.sin(x)]))

        return step, tf.random.stateless_uniform([n], [1, 2])

    with on_cpu():
        # 4 x 64 MB live at once: over 80% of the 256 MiB TensorFlow reports for the CPU.
        big, x = make(1 << 24)
        with nddebug.trace() as rec:
            big(x)
        with nddebug.trace() as again:  # optimized once: said in every block that calls it
            big(x)
        small, y = make(1 << 10)
        with nddebug.trace() as quiet:
            small(y)
    said = [w for w in rec.warnings if "memory optimizer" in w]
    assert len(said) == 1 and "AddN" in said[0] and "step" in said[0], rec.warnings
    assert said == [w for w in again.warnings if "memory optimizer" in w]
    assert not quiet.warnings


def _arguments_left_to_the_call(random: bool) -> Any:
    """A step whose nested function multiplies its argument by a constant (a product grappler
    may merge with the caller's once it inlines the call, so the function leaves that
    argument to the call's record). The argument is the caller's product of a random draw
    (unseeded: another value each run) or of a constant."""
    x = tf.reshape(tf.sin(tf.range(64, dtype=tf.float32)), [8, 8])

    @tf.function
    def inner(h):
        return tf.reduce_sum(tf.tanh(h * 1.1), axis=0)

    @tf.function
    def step():
        noise = tf.random.uniform([8, 8]) if random else tf.ones([8, 8])
        return tf.reduce_sum(inner(x * noise * 0.5))

    return step


def test_ops_reading_an_argument_left_to_the_call_are_not_blamed() -> None:
    """The product inside the function records no digest of its argument, so its record's
    inputs stay equal when the argument differs. It must not be named a source for that: the
    source is the random op in the caller, and a deterministic step is reproducible."""
    with on_cpu():
        report = nddebug.check(_arguments_left_to_the_call(random=True), repeats=3)
        quiet = nddebug.check(_arguments_left_to_the_call(random=False), repeats=3)
    assert set(report.sources["op_type"]) == {"RandomUniform"}, str(report)
    left = [f for f in report.comparison.findings if f.op.note == ARGUMENT_BY_CALLER]
    assert left and all(f.role == "propagated" for f in left), str(report)
    assert quiet.ok, str(quiet)


def _stateful_inner() -> Any:
    """A nested function that reads a variable (so it is a StatefulPartitionedCall and its
    records run) and multiplies its argument: the argument is left to the call's record."""
    v = tf.Variable(tf.ones([8]) * 0.7)

    @tf.function
    def inner(h):
        return tf.reduce_sum(h * 1.1 * v, axis=0)

    return inner


def test_an_argument_that_differed_from_python_is_said_to_enter_from_outside() -> None:
    """A NumPy draw made into a tensor each run reaches a nested function's product through
    its argument. The product's record had equal inputs (the argument is in the call's
    record): it was named a source, "the kernel itself is non-deterministic", where the
    difference entered TensorFlow from Python."""
    inner = _stateful_inner()
    rng = np.random.default_rng(5)

    @tf.function
    def outer(a):
        return tf.reduce_sum(inner(a * 0.5))

    def step():
        return outer(tf.constant(rng.random((8, 8), dtype=np.float32)))

    with on_cpu():
        report = nddebug.check(step, repeats=3, quantify=False)
    sources = [f for f in report.comparison.findings if f.role == "source"]
    assert len(sources) == 1 and sources[0].entered, str(report)
    assert "non-deterministic" not in sources[0].explanation, str(report)


def test_an_argument_from_an_opaque_source_call_leaves_one_source() -> None:
    """The random numbers come from a tf.function traced before the check (an opaque call, a
    call-like source): the product inside the nested function that reads them was named a
    second source, as nothing demoted it."""
    inner = _stateful_inner()
    x = tf.reshape(tf.sin(tf.range(64, dtype=tf.float32)), [8, 8])

    @tf.function
    def draw():
        return tf.random.uniform([8, 8])

    draw()  # traced outside the check: its call is not instrumented

    @tf.function
    def step():
        return tf.reduce_sum(inner(draw() * x * 0.5))

    with on_cpu():
        report = nddebug.check(step, repeats=3, quantify=False)
    sources = [f for f in report.comparison.findings if f.role == "source"]
    assert [f.op.function for f in sources] == ["uninstrumented"], str(report)


def test_vectorized_map_with_a_byte_mover_in_a_branch_runs_traced() -> None:
    """pfor converts a tf.cond or switch_case branch inside tf.vectorized_map as a function
    of its own, nddebug's records with it: it fell back to a while loop for them and raised
    "Attempting to slice scalar input" (a ReverseV2's record reads a digest made from its
    input's), as tf.image.random_flip_left_right does. Their vectorized versions record
    nothing; the step computes the plain bits."""
    x = tf.reshape(tf.range(2 * 4 * 3, dtype=tf.float32), [2, 4, 3])

    def flip(im):
        return tf.cond(tf.reduce_sum(im) > 30.0, lambda: tf.reverse(im, [1]), lambda: im)

    def cases(im):
        pick = tf.cast(tf.reduce_sum(im) > 30.0, tf.int32)
        return tf.switch_case(pick, [lambda: im, lambda: tf.reverse(im, [1])])

    for fn in (flip, cases):
        plain = tf.function(lambda fn=fn: tf.vectorized_map(fn, x))().numpy()
        step = tf.function(lambda fn=fn: tf.vectorized_map(fn, x))
        with nddebug.trace():
            traced = step().numpy()
        assert traced.tobytes() == plain.tobytes()
