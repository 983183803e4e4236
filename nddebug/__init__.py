"""nddebug: find the TensorFlow op that makes training non-reproducible.

``with nddebug.trace():`` records a bitwise digest of every op's output; ``nddebug.check``
repeats a step with identical inputs and state and reports which op is the source of any
divergence, which ops only propagated it, how large it is, and how to fix it.

Loading, comparing and rendering recordings does not need TensorFlow; tracing does.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from nddebug.census import census
from nddebug.check import assert_deterministic, check, compare, load
from nddebug.emulate import emulate_gpu, emulated_op_types
from nddebug.errors import (
    CensusError,
    EmptyTraceError,
    NddebugError,
    NotComparableError,
    RecordingFileError,
    TraceError,
)
from nddebug.knowledge import known_ops
from nddebug.longruns import compare_file
from nddebug.recording import Recording
from nddebug.replicas import ReplicaConsistency, replica_consistency, worker_consistency
from nddebug.report import Report


def trace(
    label: str = "",
    path: str | None = None,
    rerun: int = 0,
    emulate_gpu: bool = False,
    detail: str | None = None,
) -> Any:
    """Record every TensorFlow op run in the block: ``with nddebug.trace() as rec: step()``.

    With ``rerun=k`` every stateless op also runs k more times on its own inputs; with
    ``emulate_gpu`` the block rehearses a GPU (:func:`nddebug.emulate_gpu`); with
    ``detail="steps"`` one digest per step is kept instead of every op execution (long runs).
    See :func:`nddebug.tracer.trace`.
    """
    from nddebug.tracer import trace as _trace

    return _trace(label=label, path=path, rerun=rerun, emulate_gpu=emulate_gpu, detail=detail)


__all__ = [
    "CensusError",
    "EmptyTraceError",
    "NddebugError",
    "NotComparableError",
    "Recording",
    "RecordingFileError",
    "ReplicaConsistency",
    "Report",
    "TraceError",
    "assert_deterministic",
    "census",
    "check",
    "compare",
    "compare_file",
    "emulate_gpu",
    "emulated_op_types",
    "known_ops",
    "load",
    "replica_consistency",
    "trace",
    "worker_consistency",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext nddebug``: register the ``%%nddebug`` cell magic (see :mod:`nddebug.magic`).

    Defined here so that the extension's name is simply ``nddebug``; IPython itself is
    imported only when the extension is loaded.
    """
    from nddebug.magic import load_ipython_extension as load

    load(ipython)
