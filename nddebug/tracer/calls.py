"""Which ``tf.function`` call a top-level call belongs to, for steps.

A call of a ``tf.function`` from Python can make more than one top-level function call:
the first call of a function that creates variables (a Keras optimizer's slots, made in
the first step) runs TensorFlow's variable initializer before the function itself. Those
calls are one training step, not two: a run recorded by steps (``trace(detail="steps")``,
``nddebug run --steps`` and ``--bisect``) counted one step more than there were, from the
first, and named the step after the one where two runs part."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

_local = threading.local()
_hooked = False
# The block's thread and what to call when a tf.function call made on it returns.
_listener: tuple[int, Callable[[], None]] | None = None


def inside_function_call() -> bool:
    """Whether this thread is inside a ``tf.function`` call made from Python."""
    return getattr(_local, "depth", 0) > 0


def listen(on_end: Callable[[], None] | None) -> None:
    """Call ``on_end`` each time an outermost ``tf.function`` call made on this thread
    returns (``None``: stop)."""
    global _listener
    _listener = (threading.get_ident(), on_end) if on_end is not None else None


def hook_function_calls() -> None:
    """Count ``tf.function`` calls made from Python, per thread. Installed at the first trace
    and never removed; outside a block it costs a counter per call."""
    global _hooked
    if _hooked:
        return
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    cls = polymorphic_function.Function
    original = cls.__call__

    @functools.wraps(original)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(_local, "depth", 0)
        _local.depth = depth + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _local.depth = depth
            listener = _listener
            if depth == 0 and listener is not None and listener[0] == threading.get_ident():
                listener[1]()

    cls.__call__ = __call__
    _hooked = True
