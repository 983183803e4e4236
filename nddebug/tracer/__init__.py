"""The tracer: records a digest of every op's outputs (and inputs) through TensorFlow's op
callbacks. Recording only; analysis and rendering live elsewhere and need no TensorFlow.

The parts, by file:

- :mod:`~nddebug.tracer.block`: ``trace()``, the block that records one run;
- :mod:`~nddebug.tracer.recorder`: the op callback, dispatching each op and collecting events;
- :mod:`~nddebug.tracer.eager`: eager ops, digested as the callback sees them;
- :mod:`~nddebug.tracer.instrument`: graph ops, instrumented with digest ops when created;
- :mod:`~nddebug.tracer.transport`: how graph digests reach the host;
- :mod:`~nddebug.tracer.plain`: outside a block, instrumented functions run without their records;
- :mod:`~nddebug.tracer.rerun`: rerun mode, each op's copies compared with it;
- :mod:`~nddebug.tracer.registry`: process-wide state (instrumented ops, the gate);
- :mod:`~nddebug.tracer.ops`, :mod:`~nddebug.tracer.location`: facts about ops and user code.
"""

from nddebug.tracer.block import DETAIL_ENV, EMULATE_ENV, LABEL_ENV, RECORD_ENV, trace
from nddebug.tracer.eager import digest_eager_tensor
from nddebug.tracer.recorder import Recorder
from nddebug.tracer.registry import REGISTRY, inside_nddebug

__all__ = [
    "DETAIL_ENV",
    "EMULATE_ENV",
    "LABEL_ENV",
    "RECORD_ENV",
    "REGISTRY",
    "Recorder",
    "digest_eager_tensor",
    "inside_nddebug",
    "trace",
]
