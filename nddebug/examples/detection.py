"""A detection-style training step whose loss crops many overlapping boxes from a feature map.

On CPU, TensorFlow's ``CropAndResizeGradImage`` kernel splits the boxes across threads that
add into the same image-gradient cells, so with enough overlapping boxes its result varies
from run to run (58 distinct results in 60 runs at 1024 boxes on a quiet 2-core machine;
the default 4096 boxes keep it visible when the machine is loaded and the threads rarely
overlap).
``enable_op_determinism()`` makes it single-threaded and deterministic.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def make_step(
    boxes: int = 4096, crop: int = 14, seed: int = 0
) -> tuple[Any, tuple[Any, ...], list[Any]]:
    """Return ``(step, args, variables)``: a tf.function training step, its inputs, its state."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    images = tf.constant(rng.random((2, 32, 32, 3), dtype=np.float32))
    # Boxes that overlap heavily: centres near the middle, sizes 30-60% of the image.
    centre = rng.uniform(0.35, 0.65, size=(boxes, 2))
    half = rng.uniform(0.15, 0.3, size=(boxes, 2))
    box_coords = tf.constant(
        np.concatenate([centre - half, centre + half], axis=1)[:, [0, 1, 2, 3]], tf.float32
    )
    box_index = tf.constant(rng.integers(0, 2, size=boxes), tf.int32)
    targets = tf.constant(rng.random((boxes, 4), dtype=np.float32))
    init = tf.keras.initializers.GlorotUniform(seed=seed)
    conv_w = tf.Variable(init((3, 3, 3, 8)), name="backbone/kernel")
    head_w = tf.Variable(init((crop * crop * 8, 4)), name="head/kernel")
    opt = tf.keras.optimizers.SGD(learning_rate=0.01)

    @tf.function
    def train_step(images: Any, box_coords: Any, box_index: Any, targets: Any) -> Any:
        with tf.GradientTape() as tape:
            features = tf.nn.relu(tf.nn.conv2d(images, conv_w, strides=1, padding="SAME"))
            crops = tf.image.crop_and_resize(
                features, box_coords, box_index, crop_size=(crop, crop)
            )
            pred = tf.matmul(tf.reshape(crops, [boxes, -1]), head_w)
            loss = tf.reduce_mean(tf.square(pred - targets))
        grads = tape.gradient(loss, [conv_w, head_w])
        opt.apply_gradients(zip(grads, [conv_w, head_w], strict=False))
        return loss

    return train_step, (images, box_coords, box_index, targets), [conv_w, head_w, opt]
