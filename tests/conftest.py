"""Shared test setup: keep TensorFlow's C++ logging quiet (must be set before TF is imported),
and the ``cpu_facts`` fixture for tests that assert what the CPU does."""

import os
import tempfile
from collections.abc import Iterator

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # The suite runs in two processes (README): on a GPU machine each would map nearly all of
    # the GPU's memory at its first op, leaving the other none. They (and the processes they
    # start) take what they use instead.
    os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")


@pytest.fixture(scope="session", autouse=True)
def _private_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Temporary files of the tests and of the processes they start (``nddebug run`` keeps an
    interrupted run's recordings in a new temporary folder, autograph writes its copies there)
    go under pytest's own base directory, which pytest prunes, not into the machine's /tmp."""
    base = str(tmp_path_factory.mktemp("tmp"))
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = base
    tempfile.tempdir = None  # recomputed from TMPDIR
    yield
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None


@pytest.fixture(scope="module")
def cpu_facts() -> Iterator[None]:
    """Run a module's steps on the CPU on every machine, for modules whose tests assert CPU
    facts (``pytestmark = pytest.mark.usefixtures("cpu_facts")``). See tests/helpers.on_cpu:
    a tf.function called in the scope runs its unpinned ops on the CPU, and variables created
    in it live there. Child processes hide the GPU instead (helpers.CPU_ONLY)."""
    from tests.helpers import on_cpu

    with on_cpu():
        yield


@pytest.fixture(autouse=True)
def _no_global_seed() -> None:
    """Each test starts as a fresh process does, with no TensorFlow global seed: one that an
    earlier test set (``keras.utils.set_random_seed``) made a later test's unseeded
    ``tf.random.uniform`` a seeded one, which repeats of a freshly traced step draw alike."""
    from tensorflow.python.eager import context

    if context.global_seed() is not None:
        import tensorflow as tf

        tf.random.set_seed(None)
