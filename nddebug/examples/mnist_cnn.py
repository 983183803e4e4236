"""The Keras MNIST CNN from the seed notebook (Conv2D x2, MaxPooling, Dropout x2, Dense x2,
Adadelta), on synthetic 28x28 data: no download, identical on every machine."""

from __future__ import annotations

from typing import Any

import numpy as np

NUM_CLASSES = 10


def make_model(seed: int = 0) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            keras.layers.Conv2D(64, (3, 3), activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(NUM_CLASSES, activation="softmax"),
        ]
    )
    model.compile(
        loss=keras.losses.categorical_crossentropy,
        optimizer=keras.optimizers.Adadelta(learning_rate=1.0),
        metrics=["accuracy"],
    )
    return model


def make_data(batch: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A batch of synthetic digits: noise images and one-hot labels."""
    rng = np.random.default_rng(seed)
    x = rng.random((batch, 28, 28, 1), dtype=np.float32)
    y = np.eye(NUM_CLASSES, dtype=np.float32)[rng.integers(0, NUM_CLASSES, batch)]
    return x, y


def make_custom_step(model: Any) -> Any:
    """A custom GradientTape training step (tf.function) for the same model."""
    import tensorflow as tf

    loss_fn = model.loss
    optimizer = model.optimizer

    @tf.function
    def train_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            loss = tf.reduce_mean(loss_fn(y, pred))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=False))
        return loss

    return train_step
