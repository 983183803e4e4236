"""The Keras callback and assert_deterministic, in real training."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug.keras import DeterminismCheck, NonDeterminismError
from nddebug.state import collect_variables
from tests.helpers import variables_bytes

pytestmark = pytest.mark.usefixtures("cpu_facts")  # a CNN with biases is reproducible on CPU


def _small_cnn(steps_per_execution: int = 1) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((12, 12, 1)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        loss="categorical_crossentropy",
        optimizer=keras.optimizers.Adadelta(1.0),
        steps_per_execution=steps_per_execution,
    )
    return model


def test_callback_leaves_training_bitwise_identical_on_a_deterministic_model() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((96, 12, 12, 1), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 96)]
    with_cb, without = _small_cnn(), _small_cnn()
    callback = DeterminismCheck(every_n_steps=2, repeats=2, on_failure="raise")
    with_cb.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    without.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    assert len(callback.reports) == 2 and all(r.ok for r in callback.reports)
    assert callback.reports[0].summary["ops_traced"] > 50  # the real train step was traced
    # Every repeat gets the same batch: the report does not claim to see fit's pipeline
    # (probe round 33, finding 2: it said it "sees input-pipeline order").
    text = " ".join(str(callback.reports[0]).split())
    assert "not the pipeline that made its inputs (fit's, under DeterminismCheck" in text
    assert variables_bytes(collect_variables(with_cb)) == variables_bytes(
        collect_variables(without)
    )


def test_a_check_due_on_the_empty_last_call_of_data_of_unknown_length_changes_nothing() -> None:
    """A filtered dataset has no known length: fit's last call of each epoch finds no data,
    and Keras still counts an optimizer step there. A check due on that call took none:
    Adam's bias correction changed every later weight (probe round 45, F1)."""

    def fit(callbacks: list[Any]) -> tuple[int, bytes]:
        model = _small_cnn()
        model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.Adam(1e-2))
        rng = np.random.default_rng(1)
        x = rng.random((64, 12, 12, 1), dtype=np.float32)
        y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 64)]
        ds = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(16)
        model.fit(ds, epochs=2, verbose=0, callbacks=callbacks)
        return int(model.optimizer.iterations.numpy()), variables_bytes(collect_variables(model))

    callback = DeterminismCheck(every_n_steps=1, repeats=2, on_failure="raise")
    checked, plain = fit([callback]), fit([])
    assert checked[0] == plain[0]  # the data-less calls counted as in plain fit
    assert checked[1] == plain[1]
    assert len(callback.reports) == 8 and all(r.ok for r in callback.reports)


class _Noise(keras.layers.Layer):
    """Noise drawn from Keras's global SeedGenerator (no seed given), as a VAE's sampling
    layer or a GAN's latent draw does."""

    def call(self, x):
        return x + 0.1 * keras.random.normal(tf.shape(x))


def test_a_model_drawing_from_keras_global_seed_generator_trains_as_without_the_check() -> None:
    """The global SeedGenerator is state the step advances that the callback's state= (the
    model) does not hold: the check's runs advanced it, and training went on from another
    random stream (other weights); its verdicts depended on whether the generator existed
    before the first check."""

    def train(callbacks: list[Any]) -> bytes:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), _Noise(), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        x, y = np.ones((32, 4), np.float32), np.zeros((32, 1), np.float32)
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        return variables_bytes(collect_variables(model))

    callback = DeterminismCheck(every_n_steps=2, repeats=2)
    assert train([callback]) == train([])
    assert len(callback.reports) == 2 and all(r.ok for r in callback.reports), [
        str(r) for r in callback.reports
    ]


def test_callback_on_an_xla_model_checks_it_as_compiled_and_trains_as_fit() -> None:
    """With compile(jit_compile=True), check()'s first pass runs the model's own train
    function, which was the callback's wrapper: the check called itself (TraceError: blocks
    cannot be nested) and fit crashed. A blind spot of the compiled pass (an XLA call's
    inner writes) also turned the XLA-off pass's clean result into "NOT reproducible"; then
    every check was "not everything compared", and on_failure="raise" stopped fit, though
    the model's variables, all that fit's XLA step writes inside its train function, are
    compared after every run (probe round 47, F3)."""
    rng = np.random.default_rng(1)
    x = rng.random((16, 6), dtype=np.float32)
    y = rng.random((16, 3), dtype=np.float32)

    def model() -> keras.Model:
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="tanh")])
        m.compile(loss="mse", optimizer=keras.optimizers.SGD(0.1), jit_compile=True)
        return m

    with_cb, without = model(), model()
    callback = DeterminismCheck(every_n_steps=2, repeats=2, on_failure="raise")
    with_cb.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    without.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert len(callback.reports) == 2
    for report in callback.reports:
        assert report.ok and report.program == "as compiled (XLA)", str(report)
        assert not report.comparison.findings
    assert variables_bytes(collect_variables(with_cb)) == variables_bytes(
        collect_variables(without)
    )


def test_a_check_covers_every_batch_of_a_call_with_steps_per_execution() -> None:
    """With steps_per_execution=4 a call of the train function trains on 4 batches; the
    callback checked one and trained on it alone, so training silently lost batches."""
    rng = np.random.default_rng(0)
    x = rng.random((96, 12, 12, 1), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 96)]
    with_cb, without = _small_cnn(steps_per_execution=4), _small_cnn(steps_per_execution=4)
    # 6 batches: calls of 4 and 2; steps 0 and 5 are due, one in each call.
    callback = DeterminismCheck(every_n_steps=5, repeats=2, on_failure="raise")
    with_cb.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    without.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert len(callback.reports) == 2 and all(r.ok for r in callback.reports)
    assert int(with_cb.optimizer.iterations.numpy()) == 6
    assert variables_bytes(collect_variables(with_cb)) == variables_bytes(
        collect_variables(without)
    )


def test_fit_history_is_unchanged_by_the_callback_on_a_two_output_model() -> None:
    """fit on arrays gives batches of a static size; the callback handed the train function
    batches of an unknown size, so the traced step counted each output's loss once per batch
    instead of per sample: the weights stayed equal, but fit's History per-output losses
    changed (a model fitted once before, as any second fit is)."""
    keras.utils.set_random_seed(0)
    a, b = keras.Input((5,)), keras.Input((3,))
    h = keras.layers.Concatenate()([keras.layers.Dense(8, activation="relu")(a), b])
    model = keras.Model([a, b], [keras.layers.Dense(1)(h), keras.layers.Dense(3)(h)])
    model.compile(
        keras.optimizers.Adam(0.01),
        loss=["mse", keras.losses.SparseCategoricalCrossentropy(from_logits=True)],
        loss_weights=[0.3, 1.0],
        jit_compile=False,
    )
    rng = np.random.RandomState(0)
    x = [rng.randn(64, 5).astype("float32"), rng.randn(64, 3).astype("float32")]
    y = [rng.randn(64, 1).astype("float32"), rng.randint(0, 3, 64)]
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    variables = list(model.variables) + list(model.optimizer.variables)
    start = [v.numpy() for v in variables]

    def fit(callbacks: list) -> tuple[dict, list[bytes]]:
        for v, value in zip(variables, start, strict=True):
            v.assign(value)
        history = model.fit(
            x, y, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=callbacks
        )
        return history.history, [v.numpy().tobytes() for v in variables]

    plain = fit([])
    callback = DeterminismCheck(every_n_steps=2, repeats=2, on_failure="raise")
    checked = fit([callback])
    assert len(callback.reports) == 2 and all(r.ok for r in callback.reports)
    assert checked[1] == plain[1]
    assert checked[0] == plain[0], (checked[0], plain[0])


class NoisyLayer(keras.layers.Layer):
    def call(self, x):
        return x + 0.01 * tf.random.uniform(tf.shape(x))  # unseeded, stateful


def test_callback_catches_a_culprit_during_fit() -> None:
    keras.utils.set_random_seed(0)  # the weights
    tf.random.set_seed(None)  # and no global seed, or NoisyLayer's op takes one from it
    model = keras.Sequential([keras.Input((8,)), NoisyLayer(), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).random((64, 8), dtype=np.float32)
    y = np.random.default_rng(1).random((64, 2), dtype=np.float32)
    callback = DeterminismCheck(every_n_steps=1, repeats=2, on_failure="warn")
    with pytest.warns(UserWarning, match="RandomUniform"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[callback])
    assert callback.reports and not callback.reports[0].ok
    with pytest.raises(NonDeterminismError, match="RandomUniform"):
        model.fit(
            x,
            y,
            batch_size=32,
            epochs=1,
            verbose=0,
            callbacks=[DeterminismCheck(every_n_steps=1, on_failure="raise")],
        )
    # The fit it stopped had no batch end: the model's own train function is back, and a
    # later fit without the callback checks nothing (it raised again, with no callback).
    assert "DeterminismCheck" not in repr(model.train_function)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)


def test_assert_deterministic() -> None:
    v = tf.Variable(tf.ones([4]))

    @tf.function
    def good(x):
        v.assign_add(x)
        return tf.reduce_sum(v)

    assert nddebug.assert_deterministic(good, tf.ones([4]), state=v).ok

    @tf.function
    def bad(x):
        return x + tf.random.uniform([4])

    with pytest.raises(AssertionError, match="RandomUniform"):
        nddebug.assert_deterministic(bad, tf.ones([4]))


class _UniformNoise(keras.layers.Layer):
    """Noise from TensorFlow's stateful op with no seed of its own: under a global seed, each
    eager call takes the next op seed of TensorFlow's stream."""

    def call(self, x, training=None):
        return x + tf.random.uniform(tf.shape(x)) * 1e-3 if training else x


def test_callback_on_an_eager_model_with_global_seeded_noise_trains_as_fit() -> None:
    """run_eagerly=True: the check's runs drew op seeds from TensorFlow's stream and made the
    kernels of those seeds, which keep their generator's position; the steps after the check
    drew the same seeds again and got those kernels, advanced: other weights than plain fit."""

    def train(callbacks: list[Any]) -> bytes:
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16), _UniformNoise(), keras.layers.Dense(1)]
        )
        model.compile(keras.optimizers.Adam(1e-2), "mse", run_eagerly=True)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(32, 8)).astype("float32")
        y = rng.normal(size=(32, 1)).astype("float32")
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        return variables_bytes(collect_variables(model))

    callback = DeterminismCheck(every_n_steps=2, repeats=2)
    assert train([callback]) == train([])
    assert len(callback.reports) == 2


def test_summaries_written_in_the_train_step_are_said_even_when_the_check_passes(
    tmp_path: Any,
) -> None:
    """Each check's warm-up and repeats wrote the train step's summaries again (5 events
    became 11), and the warning stayed in cb.reports, which a passing check never shows
    (probe round 36, finding 7). The callback says it once."""
    writer = tf.summary.create_file_writer(str(tmp_path))

    class Logged(keras.Model):
        def train_step(self, data):
            logs = super().train_step(data)
            tf.summary.write("loss", logs["loss"], step=self.optimizer.iterations)
            return logs

    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    model = Logged(inputs, keras.layers.Dense(1)(inputs))
    model.compile("sgd", "mse")
    x = np.linspace(-1, 1, 64 * 4).reshape(64, 4).astype("float32")
    callback = DeterminismCheck(every_n_steps=2)
    with writer.as_default(), pytest.warns(UserWarning, match="writes summaries") as said:
        model.fit(x, x.sum(1, keepdims=True), batch_size=16, verbose=0, callbacks=[callback])
    assert all(r.ok for r in callback.reports) and len(callback.reports) == 2
    assert len([w for w in said if "writes summaries" in str(w.message)]) == 1


def test_what_an_xla_call_writes_outside_state_is_still_said_not_compared() -> None:
    """The other side: a compiled function called inside the step that writes a variable
    check() does not hold leaves that variable uncompared, and the report says so."""
    outside = tf.Variable(tf.zeros([4]))
    held = tf.Variable(tf.ones([4]))

    @tf.function(jit_compile=True)
    def bump(v: Any, w: Any) -> Any:
        v.assign_add(tf.ones([4]))
        return tf.reduce_sum(w)

    @tf.function
    def step() -> Any:
        held.assign_add(tf.ones([4]))
        return bump(outside, held)

    step()  # the XLA function is traced before the check
    report = nddebug.check(step, state=[held], repeats=2, quantify=False)
    assert not report.ok
    assert any("the variables written by bump" in w for w in report.warnings), report.warnings
    report = nddebug.check(step, state=[held, outside], repeats=2, quantify=False)
    assert report.ok, report
