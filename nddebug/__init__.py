"""nddebug: find the TensorFlow op that makes training non-reproducible.

``with nddebug.trace():`` records a bitwise digest of every op's output; ``nddebug.check``
repeats a step with identical inputs and state and reports which op is the source of any
divergence, which ops only propagated it, how large it is, and how to fix it.

Loading, comparing and rendering recordings does not need TensorFlow; tracing does.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from nddebug.check import assert_deterministic, check, compare, load
from nddebug.errors import (
    EmptyTraceError,
    NddebugError,
    NotComparableError,
    RecordingFileError,
    TraceError,
)
from nddebug.knowledge import known_ops
from nddebug.recording import Recording
from nddebug.report import Report


def trace(label: str = "", path: str | None = None, rerun: int = 0) -> Any:
    """Record every TensorFlow op run in the block: ``with nddebug.trace() as rec: step()``.

    With ``rerun=k`` every stateless op also runs k more times on its own inputs. See
    :func:`nddebug.tracer.trace`.
    """
    from nddebug.tracer import trace as _trace

    return _trace(label=label, path=path, rerun=rerun)


__all__ = [
    "EmptyTraceError",
    "NddebugError",
    "NotComparableError",
    "Recording",
    "RecordingFileError",
    "Report",
    "TraceError",
    "assert_deterministic",
    "check",
    "compare",
    "known_ops",
    "load",
    "trace",
]
