"""check() and tf.random.Generators that state= does not hold: put back like the global one.

A seeded generator the step captures moved on in every run of check(): the runs compared other
noise ("NOT reproducible", source RngReadAndSkip) and the training after the check drew
further along than without it (probe round 33, finding 1). Ground truth here is the same
program run plainly in the same process, from twins of the same variables and generator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import nddebug


def _twins(kind: str) -> tuple[Callable[[], Any], tf.Variable, tf.random.Generator]:
    """A step that adds noise from a seeded generator to a weight update, as ``kind``: a
    tf.function, eager code, or eager code calling a tf.function traced before the check."""
    w = tf.Variable(tf.ones([4]))
    gen = tf.random.Generator.from_seed(7)

    def update(noise: Any) -> None:
        w.assign_sub(0.1 * (w + noise))

    if kind == "function":

        @tf.function
        def step() -> None:
            update(gen.normal([4]))

    elif kind == "eager":

        def step() -> None:
            update(gen.normal([4]))

    else:

        @tf.function
        def noise() -> Any:
            return gen.normal([4])

        noise()  # traced (and drawn from) before the check: an uninstrumented call in it

        def step() -> None:
            update(noise())

    return step, w, gen


@pytest.mark.parametrize("kind", ["function", "eager", "traced before"])
def test_a_generator_outside_state_is_put_back_and_the_step_is_reproducible(kind: str) -> None:
    plain_step, plain_w, plain_gen = _twins(kind)
    step, w, gen = _twins(kind)
    plain_step()
    step()
    plain_step()  # the step check() stands for
    report = nddebug.check(step, state=w, repeats=3)
    assert report.ok, report
    assert not any("does not hold" in x for x in report.warnings), report.warnings
    for _ in range(3):  # training goes on from where one plain step leaves it
        plain_step()
        step()
    assert np.array_equal(w.numpy(), plain_w.numpy())
    assert np.array_equal(gen.state.numpy(), plain_gen.state.numpy())


def test_a_generator_put_back_does_not_hide_an_unseeded_draw() -> None:
    """The generator's draws are put back; an op with no seed at all still differs."""
    w = tf.Variable(tf.ones([256]))
    gen = tf.random.Generator.from_seed(3)

    @tf.function
    def step() -> None:
        w.assign_sub(0.1 * (gen.normal([256]) + tf.random.uniform([256])))

    report = nddebug.check(step, state=w, repeats=3)
    assert not report.ok
    assert set(report.sources["op_type"]) == {"RandomUniform"}, report.sources


def test_an_int64_counter_the_call_also_takes_is_not_taken_for_a_generator() -> None:
    """Only the inputs that reach a generator op's state are read before a call: a counter
    the same function reads (and the step updates before calling it) is the step's own state,
    left to state= and named in the warning, not put back to a value from inside the step
    (review of the first version, which read every int64 variable input)."""
    w = tf.Variable(tf.ones([4]))
    counter = tf.Variable(0, dtype=tf.int64)
    gen = tf.random.Generator.from_seed(5)

    @tf.function
    def draw() -> Any:
        return gen.normal([4]) * tf.cast(counter, tf.float32)

    def step() -> None:
        counter.assign_add(1)
        w.assign_sub(0.1 * draw())

    report = nddebug.check(step, state=w, repeats=2)
    missed = [x for x in report.warnings if "state= does not hold" in x]
    assert len(missed) == 1 and "AssignAddVariableOp" in missed[0], report.warnings
    assert "ReadVariableOp" not in missed[0]


def test_a_generator_the_step_makes_in_every_run_is_each_run_s_own() -> None:
    """An eager step that makes its generator (or any variable) anew: each later run's is its
    own, and an earlier run's, put back to its first value and left alone, is not compared
    with it (it was "NOT reproducible", source the generator's StateVar after the step)."""
    w = tf.Variable(tf.ones([4]))
    plain_w = tf.Variable(tf.ones([4]))

    def step(v: tf.Variable = w) -> None:
        g = tf.random.Generator.from_seed(1)
        v.assign_sub(0.1 * g.normal([4]))

    report = nddebug.check(step, state=w, repeats=3)
    assert report.ok, report
    step(plain_w)
    assert np.array_equal(w.numpy(), plain_w.numpy())


def test_a_generator_an_eager_binomial_moved_first_is_not_put_back_to_a_later_state() -> None:
    """An eager gen.binomial (StatefulRandomBinomial) moves the generator without saying
    where it was; the RngReadAndSkip after it then read the moved state, which was put back
    as "before" with no warning, one draw ahead of the plain program (probe round 34). Such a
    generator is left to the unrestored-update warning instead."""
    w = tf.Variable(tf.ones([4]))
    gen = tf.random.Generator.from_seed(3)

    def step() -> None:
        counts = gen.binomial([4], counts=4.0, probs=0.5)
        w.assign_sub(0.1 * (tf.cast(counts, tf.float32) + gen.normal([4])))

    report = nddebug.check(step, state=w, repeats=2)
    missed = [x for x in report.warnings if "state= does not hold" in x]
    assert len(missed) == 1 and "StatefulRandomBinomial" in missed[0], report.warnings


def test_a_generator_drawn_from_inside_a_py_function_is_said_to_need_state() -> None:
    """tf.py_function's Python function runs where nddebug records nothing: a generator it
    draws from was moved on by every run, unrestored and unsaid, and training after the
    check went on from there (probe round 47, F5). Said; held in state=, it is put back."""
    w = tf.Variable(tf.ones([4]))
    g = tf.random.Generator.from_seed(3)

    @tf.function
    def step():
        y = tf.py_function(lambda a: a * g.uniform([4]), [w.read_value()], tf.float32)
        y.set_shape([4])
        w.assign_add(y * 0.1)
        return tf.reduce_sum(w)

    step()
    report = nddebug.check(step, state=[w], repeats=2, quantify=False)
    assert any("tf.py_function" in x and "state=" in x for x in report.warnings), report.warnings
    twin = tf.random.Generator.from_state(g.state.numpy(), g.algorithm)
    report = nddebug.check(step, state=[w, g], repeats=2, quantify=False)
    assert report.ok, report
    twin.uniform([4])  # one plain step's draw: where the check leaves the generator
    np.testing.assert_array_equal(g.state.numpy(), twin.state.numpy())


@pytest.mark.parametrize("kind", ["numpy_function", "eager"])
def test_numpy_and_python_generators_the_step_draws_from_are_put_back(kind: str) -> None:
    """A seeded np.random.default_rng (or random.Random) the step draws from, in a
    tf.numpy_function or in eager code, moved on in every run of check() and was never put
    back: the training after the check differed from a plain one's, unsaid (probe round 48,
    F2). Ground truth: the same step run plainly from the same weights and generators."""
    import random

    rng = np.random.default_rng(5)
    pyrng = random.Random(9)
    w = tf.Variable(tf.zeros([3]))

    def draw() -> np.ndarray:
        return (rng.random(3) + pyrng.random()).astype(np.float32)

    if kind == "numpy_function":

        @tf.function
        def step():
            w.assign_add(tf.reshape(tf.numpy_function(draw, [], tf.float32), [3]))
            return tf.reduce_sum(w)

    else:

        def step():
            w.assign_add(tf.constant(draw()))
            return tf.reduce_sum(w)

    step()  # a first plain step
    start = (w.numpy(), rng.bit_generator.state, pyrng.getstate())
    report = nddebug.check(step, state=[w], repeats=2, quantify=False)
    after_check = (w.numpy(), rng.random(), pyrng.random())
    # The runs drew on from run to run: they differ, as two calls in one process do.
    assert not report.ok, str(report)
    if kind == "numpy_function":
        note = [x for x in report.warnings if "tf.numpy_function" in x]
        assert note and "nddebug run" in note[0] and "puts it back" in note[0], report.warnings
        (source,) = [c for c in report.culprits.to_dict("records") if c["role"] == "source"]
        assert source["op_type"] == "PyFunc" and "nddebug run" in source["fix"], source
    w.assign(start[0])
    rng.bit_generator.state, _ = start[1], pyrng.setstate(start[2])
    step()  # the plain second step
    np.testing.assert_array_equal(after_check[0], w.numpy())
    assert (rng.random(), pyrng.random()) == after_check[1:]


@pytest.mark.parametrize("through", ["numpy_function", "py_function"])
def test_a_variable_a_python_function_writes_is_put_back_and_compared(through: str) -> None:
    """A tf.numpy_function's (or tf.py_function's) body runs where nddebug records nothing:
    a variable it assigned was moved on by every run of check() (5 steps' worth after one
    check), unrestored, and a random value written there was "reproducible" (probe round 48,
    F6). A variable the function names is now put back between runs and compared after
    each."""
    w = tf.Variable(tf.ones([4]))
    v = tf.Variable(0.0)
    noise = {"on": False}

    def body():
        v.assign_add(float(np.random.RandomState().rand()) if noise["on"] else 1.0)
        return np.float32(0) if through == "numpy_function" else tf.constant(0.0)

    call = tf.numpy_function if through == "numpy_function" else tf.py_function

    @tf.function
    def step():
        call(body, [], tf.float32)
        w.assign_add(tf.ones([4]))
        return w.read_value()

    report = nddebug.check(step, state=[w], repeats=3, quantify=False)
    assert report.ok, str(report)
    assert float(v.numpy()) == 1.0  # one plain step's write
    noise["on"] = True
    report = nddebug.check(step, state=[w], repeats=3, quantify=False)
    assert not report.ok, str(report)
    (source,) = [c for c in report.culprits.to_dict("records") if c["role"] == "source"]
    assert source["op_type"] == "VariableState" and "PyFunc" in source["explanation"], source
