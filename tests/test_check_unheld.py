"""check() puts back every variable its step's function calls write, held by state= or not.

A variable the step writes that state= did not hold was moved on by every run of check(): the
runs started from other values (a false "NOT reproducible") and the training after the check
went on from further along than without it. Probe round 37 found it for a Keras SeedGenerator
made outside the model, round 38 for a Keras model's compiled metrics, which do not exist until
its first step, so that no state= can name them. Ground truth here is the same program run
plainly in the same process, from twins built alike.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug.keras import DeterminismCheck


def _dropout_twin() -> tuple[Any, tf.Variable, Any]:
    keras.utils.set_random_seed(1)
    seeds = keras.random.SeedGenerator(42)
    w = tf.Variable(tf.ones([64]))

    @tf.function
    def step() -> Any:
        w.assign(w * 0.9 + keras.random.dropout(tf.ones([64]), 0.5, seed=seeds))
        return tf.reduce_sum(w)

    return step, w, seeds


def test_a_seed_generator_made_outside_the_model_is_put_back() -> None:
    """keras.random.dropout(h, seed=sg) with a seeded SeedGenerator the step captures: fresh
    processes agree, so the step is reproducible; it was "NOT reproducible" with the advice to
    seed it, and the generator ended 7 draws on (round 37, finding 1)."""
    plain_step, plain_w, plain_seeds = _dropout_twin()
    step, w, seeds = _dropout_twin()
    for _ in range(2):
        plain_step()
    step()
    report = nddebug.check(step, state=w, repeats=3)
    assert report.ok, report
    assert not any("does not hold" in m for m in report.warnings), report.warnings
    for _ in range(3):
        plain_step()
        step()
    assert np.array_equal(seeds.state.numpy(), plain_seeds.state.numpy())
    assert np.array_equal(w.numpy(), plain_w.numpy())


def test_a_seed_generators_real_difference_is_still_found() -> None:
    """Put back, it cannot hide a draw that differs from one state: an unseeded op beside it."""
    step, w, _ = _dropout_twin()
    tf.random.set_seed(None)

    @tf.function
    def noisy() -> Any:
        step()
        w.assign_add(tf.random.uniform([64]))

    report = nddebug.check(noisy, state=w, repeats=3)
    assert "RandomUniform" in set(report.sources["op_type"]), str(report)


def _metric_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(keras.optimizers.SGD(0.1), "binary_crossentropy", metrics=[keras.metrics.AUC()])
    return model


def _data() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.RandomState(1).randn(96, 8).astype(np.float32)
    y = (np.random.RandomState(2).rand(96) > 0.5).astype(np.float32)
    return x, y


def test_compiled_metrics_built_in_the_first_step_are_put_back() -> None:
    """A DeterminismCheck on fit's first step: the AUC's totals are made in that step, so the
    model's state= did not hold them. Every run added its batch to them, and fit's History
    said another AUC (0.338 for 0.396), with the warning to pass to state= what the user cannot
    name (round 38, finding 2)."""
    x, y = _data()
    plain = _metric_model()
    h_plain = plain.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    checked = _metric_model()
    cb = DeterminismCheck(every_n_steps=100)
    h = checked.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    assert [r.summary["verdict"] for r in cb.reports] == ["reproducible"], cb.reports
    assert list(h.history.values()) == list(h_plain.history.values())  # auc_1 vs auc
    for a, b in zip(plain.weights, checked.weights, strict=True):
        assert np.array_equal(a.numpy(), b.numpy())


class _LazyModule(tf.Module):
    """The TF guide's pattern: a variable created on the first call of a tf.function."""

    def __init__(self) -> None:
        super().__init__()
        self.w: Any = None

    @tf.function
    def __call__(self, x: Any) -> Any:
        if self.w is None:
            self.w = tf.Variable(tf.ones([4, 2]))
        self.w.assign_add(tf.ones([4, 2]))
        return tf.reduce_sum(x @ self.w)


def _lazy_step() -> tuple[Any, dict[str, Any]]:
    holder: dict[str, Any] = {}

    @tf.function
    def step(x: Any) -> Any:
        if "w" not in holder:
            holder["w"] = tf.Variable(tf.ones([4, 2]))
        holder["w"].assign_add(tf.ones([4, 2]))
        return tf.reduce_sum(x @ holder["w"])

    return step, holder


@pytest.mark.parametrize("mode", ["repeat", "rerun"])
@pytest.mark.parametrize("form", ["function", "module"])
def test_a_variable_the_first_call_creates_is_restored_as_initialized(form, mode) -> None:
    """check() as the first call of a tf.function that creates its variable on that call: the
    variable was read before TensorFlow's initializer ran, as an empty array, and put back so
    before every run: the step raised and the variable stayed empty (probe round 47, F1)."""
    x = tf.ones([3, 4])
    if form == "module":
        m = _LazyModule()
        step, variable = m, lambda: m.w
    else:
        step, holder = _lazy_step()
        variable = lambda: holder["w"]  # noqa: E731
    report = nddebug.check(step, x, repeats=2, mode=mode, quantify=False)
    assert report.ok, report
    # As after one plain first call (ones + 1), and the next plain step goes on from there.
    np.testing.assert_array_equal(variable().numpy(), np.full([4, 2], 2.0, np.float32))
    assert float(step(x)) == 72.0


def _adam_model() -> tuple[Any, Any, Any]:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
    )
    opt = keras.optimizers.Adam(1e-2)
    lossf = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = lossf(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return model, opt, step


@pytest.mark.parametrize("mode", ["repeat", "rerun"])
def test_check_after_a_checkpoint_restore_keeps_the_restored_optimizer_slots(tmp_path, mode):
    """Resuming: the model's weights are restored at once, Adam's moments when its first step
    makes them (a deferred restore). check() as that first step read each new slot from its
    initializer: every run, and the training after, started from zeros instead of the
    restored moments, and "reproducible" was said of that other program (probe round 47,
    F8)."""
    x = tf.constant(np.random.RandomState(0).rand(8, 5).astype("float32"))
    y = tf.constant(np.arange(8) % 2)
    model, opt, step = _adam_model()
    for _ in range(3):
        step(x, y)
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ck"))

    def resumed() -> tuple[Any, Any, Any]:
        model, opt, step = _adam_model()
        model(x)  # built: its weights are restored now, the optimizer's slots later
        tf.train.Checkpoint(model=model, optimizer=opt).restore(path).expect_partial()
        return model, opt, step

    def weights(model: Any, opt: Any) -> list[np.ndarray]:
        return [v.numpy() for v in [*model.weights, *opt.variables]]

    model, opt, step = resumed()
    step(x, y)
    step(x, y)
    plain = weights(model, opt)

    model, opt, step = resumed()
    report = nddebug.check(step, x, y, state=[model, opt], repeats=2, mode=mode, quantify=False)
    assert report.ok, report
    step(x, y)
    for a, b in zip(weights(model, opt), plain, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_random_initial_value_made_on_the_first_call_is_not_drawn_again() -> None:
    """A tf.Variable made on a tf.function's first call from a random initializer: check()
    called the initializer again to learn the initial value, drew other numbers, and every
    run and the training after it started from those (probe round 47, F10)."""
    x = tf.constant([1.0, 2.0, 3.0])

    def made() -> tuple[Any, dict[str, Any]]:
        tf.random.set_seed(0)  # the same op seeds for the initializer in both programs
        holder: dict[str, Any] = {}

        @tf.function
        def step(x: Any) -> Any:
            if "w" not in holder:
                holder["w"] = tf.Variable(lambda: tf.random.normal([3]))
            holder["w"].assign_add(x)
            return tf.reduce_sum(holder["w"])

        return step, holder

    step, holder = made()
    step(x)
    plain = holder["w"].numpy()
    step, holder = made()
    report = nddebug.check(step, x, repeats=2, quantify=False)
    assert not report.culprits.role.eq("source").any(), report
    np.testing.assert_array_equal(holder["w"].numpy(), plain)


def test_the_unheld_variables_of_an_eager_step_are_named() -> None:
    """An eager step whose Keras random layer is not in state=: the warning named the ops
    that updated its seed generator's state, not the variable nor what holds it (probe round
    47, F4)."""
    keras.utils.set_random_seed(0)
    flip = keras.layers.RandomFlip("horizontal")
    w = tf.Variable(tf.ones([4, 4, 1]))

    def step(x: Any) -> Any:
        w.assign_add(flip(x, training=True)[0] * 0.01)
        return tf.reduce_sum(w)

    report = nddebug.check(step, tf.ones([2, 4, 4, 1]), state=[w], repeats=2, quantify=False)
    (said,) = [m for m in report.warnings if "that state= does not hold" in m]
    assert "seed_generator_state" in said and "Keras layer" in said, said
