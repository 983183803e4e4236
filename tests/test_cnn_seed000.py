"""The seed-000 Keras CNN (with dropout) is deterministic on CPU: no false culprit, and
check() leaves the model exactly as one plain training step would.

A CPU fact, so the model is built and trained on the CPU on every machine: on a GPU,
BiasAddGrad and Conv2DBackpropFilter diverge without op determinism (tests/gpu has that)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug.examples import mnist_cnn
from nddebug.state import collect_variables
from tests.helpers import assert_ran_on_cpu, on_cpu, variables_bytes


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    return mnist_cnn.make_data(128)


def test_keras_train_on_batch_is_reproducible_and_state_is_one_step(data) -> None:
    x, y = data
    with on_cpu():
        checked, plain = mnist_cnn.make_model(0), mnist_cnn.make_model(0)
        before = variables_bytes(collect_variables(checked))
        assert before == variables_bytes(collect_variables(plain))
        report = nddebug.check(checked.train_on_batch, x, y, repeats=5, state=checked)
        plain.train_on_batch(x, y)
    assert_ran_on_cpu(report)
    assert report.ok, str(report)
    assert report.summary["runs"] == 5 and report.summary["ops_traced"] > 100
    traced = {op.op_type for op in report.recordings[0].ops.values()}
    # Dropout, the backward pass and the optimizer update were all traced and compared.
    assert {"StatelessRandomUniformV2", "Conv2DBackpropFilter", "BiasAddGrad"} <= traced
    assert any("ApplyAdadelta" in t or "AssignVariableOp" in t or "AssignSub" in t for t in traced)

    assert variables_bytes(collect_variables(checked)) == variables_bytes(collect_variables(plain))


def test_custom_gradient_tape_step_is_reproducible(data) -> None:
    with on_cpu():
        x, y = (tf.constant(a) for a in data)
        model = mnist_cnn.make_model(1)
        step = mnist_cnn.make_custom_step(model)
        report = nddebug.check(step, x, y, repeats=5, state=model)
    assert_ran_on_cpu(report)
    assert report.ok, str(report)
    assert report.culprits.empty
