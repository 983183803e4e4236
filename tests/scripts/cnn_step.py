"""The seed-000 CNN: one custom training step, traced; deterministic on CPU."""

import tensorflow as tf

import nddebug
from nddebug.examples import mnist_cnn

model = mnist_cnn.make_model(0)
step = mnist_cnn.make_custom_step(model)
x, y = (tf.constant(a) for a in mnist_cnn.make_data(64))
with nddebug.trace():
    step(x, y)
