"""A small ResNet-like Keras model for the benchmarks: a conv stem, three stages of two
residual blocks (conv, BatchNorm, ReLU, conv, BatchNorm, add; a 1x1 projection where the
width or stride changes), global pooling and a dense head, trained with Adam. A step runs
well over 1,000 op executions, yet stays small enough for a 2-core CPU (32x32 inputs)."""

from __future__ import annotations

from typing import Any

import numpy as np

NUM_CLASSES = 10
SIZE = 32


def make_model(seed: int = 0, widths: tuple[int, ...] = (16, 32, 64)) -> Any:
    import keras
    from keras import layers

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((SIZE, SIZE, 3))
    x = layers.Conv2D(widths[0], 3, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    for stage, width in enumerate(widths):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            y = layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False)(x)
            y = layers.ReLU()(layers.BatchNormalization()(y))
            y = layers.Conv2D(width, 3, padding="same", use_bias=False)(y)
            y = layers.BatchNormalization()(y)
            if stride != 1 or shortcut.shape[-1] != width:
                shortcut = layers.Conv2D(width, 1, strides=stride, use_bias=False)(shortcut)
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(NUM_CLASSES, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(loss=keras.losses.categorical_crossentropy, optimizer=keras.optimizers.Adam(1e-3))
    return model


def make_data(batch: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.random((batch, SIZE, SIZE, 3), dtype=np.float32)
    y = np.eye(NUM_CLASSES, dtype=np.float32)[rng.integers(0, NUM_CLASSES, batch)]
    return x, y
