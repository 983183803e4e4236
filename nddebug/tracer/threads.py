"""TensorFlow work that other Python threads do while a block records: seen, not recorded.

TensorFlow's op callbacks are per thread, so a block records only the thread that opened
it. A step that hands work to threads (a ``ThreadPoolExecutor`` computing per-shard updates,
a data loader's workers running ``tf.image`` ops, ``MirroredStrategy.run`` of a plain Python
function, whose replicas run eagerly in threads) did TensorFlow work nddebug never compared:
its variable writes, and whatever of its results the user keeps, could differ between runs
while the verdict said "reproducible". The check below does not record that work; it notes
that it happened, so that the verdict says what it did not compare.

Eager ops enter TensorFlow through ``pywrap_tfe``'s execute entry points, which the generated
op wrappers look up on the module at each call: while a block is open they are wrapped with
a thread test. Other threads' function calls are seen by the call hook
(:meth:`nddebug.tracer.recorder.Recorder.foreign_call`), which notes them here.

Threads that Python did not start (``threading._DummyThread``: TensorFlow's own threads
running a ``tf.py_function`` body or a ``Dataset.from_generator`` generator) are left out:
what their code hands back enters the step through a recorded op (``EagerPyFunc``,
``IteratorGetNext``), whose outputs are compared.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from nddebug.recording import OTHER_THREADS
from nddebug.tracer.ops import FUNCTION_CALL, as_str

# pywrap_tfe's entry points for one eager op (the generated wrappers' fast path, and
# execute.execute's: the fallback, and ops built by hand) -> the position of the op's name.
_ENTRY_POINTS = {"TFE_Py_FastPathExecute": 1, "TFE_Py_Execute": 2, "TFE_Py_ExecuteCancelable": 2}


class ThreadWatch:
    """Counts the TensorFlow ops and function calls that Python threads other than
    ``thread`` run between :meth:`install` and :meth:`uninstall`."""

    def __init__(self, thread: int) -> None:
        self.thread = thread
        # ("op"/"call", op type or function name) -> count. Counter updates from several
        # threads can lose a count under races; only whether there was any matters.
        self.seen: Counter[tuple[str, str]] = Counter()
        self._originals: dict[str, Any] = {}

    def note(self, kind: str, name: str) -> None:
        """Note one op (``kind="op"``) or function call (``"call"``) of the current thread
        if it is a Python thread other than the block's."""
        if threading.get_ident() == self.thread:
            return
        current = threading.current_thread()
        if isinstance(current, threading._DummyThread):  # TensorFlow's: see the docstring
            return
        self.seen[(kind, name)] += 1

    def install(self) -> None:
        from tensorflow.python import pywrap_tfe

        for entry, name_at in _ENTRY_POINTS.items():
            original = getattr(pywrap_tfe, entry, None)
            if original is None:
                continue
            self._originals[entry] = original
            setattr(pywrap_tfe, entry, self._wrap(original, name_at))

    def uninstall(self) -> None:
        from tensorflow.python import pywrap_tfe

        for entry, original in self._originals.items():
            setattr(pywrap_tfe, entry, original)
        self._originals.clear()

    def _wrap(self, original: Any, name_at: int) -> Any:
        block = self.thread
        note = self.note

        def entry(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != block:
                name = as_str(args[name_at]) if len(args) > name_at else "?"
                if not FUNCTION_CALL.match(name):  # a call: noted by the call hook
                    note("op", name)
            return original(*args, **kwargs)

        return entry

    def summary(self) -> str | None:
        """The warning that says what the other threads ran, or None if nothing: op types
        and function names sorted."""
        if not self.seen:
            return None
        ops = sorted({n for k, n in self.seen if k == "op"})
        calls = sorted({n for k, n in self.seen if k == "call"})
        parts = []
        if ops:
            parts.append("eager ops " + _some(ops))
        if calls:
            parts.append("function calls " + _some(calls))
        # No thread count or names: they vary from run to run (a pool's workers, two fits),
        # and the report lists each distinct warning of its runs.
        return (
            f"{OTHER_THREADS} ({'; '.join(parts)}): "
            "op callbacks are per thread, so nddebug records only the thread that opened the "
            "block, and what those threads computed or wrote (variables) was not compared. "
            "Run that work on the block's thread to have it compared."
        )


def _some(names: list[str], most: int = 6) -> str:
    if len(names) <= most:
        return ", ".join(names)
    return ", ".join(names[:most]) + f" and {len(names) - most} more"
