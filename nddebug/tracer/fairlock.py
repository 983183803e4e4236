"""A re-entrant lock that threads take in the order they asked for it.

The recording thread holds the block's call lock from the start of each of its function
calls until that call's rows are drained, and takes it again for its next call at once.
``threading.RLock`` is not fair: a thread that releases it and asks again usually gets it
back before a thread that has been waiting. Another thread's call of an instrumented
function then waited out its bound (5 s) while the block's loop ran, and ran unguarded, its
op executions mixed into the run (two runs of the same work compared as "NOT
reproducible"). With this lock the other thread's call runs at the next call boundary.
"""

from __future__ import annotations

import collections
import threading
import time


class FairRLock:
    """Re-entrant, first come first served; ``acquire(timeout=...)`` as ``threading.RLock``'s."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._count = 0
        self._queue: collections.deque[object] = collections.deque()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._count += 1
                return True
            if self._owner is None and not self._queue:
                self._owner, self._count = me, 1
                return True
            if not blocking:
                return False
            token = object()
            self._queue.append(token)
            deadline = None if timeout < 0 else time.monotonic() + timeout
            while self._owner is not None or self._queue[0] is not token:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    self._queue.remove(token)
                    self._cond.notify_all()  # the next in line may be free to go now
                    return False
                self._cond.wait(remaining)
            self._queue.popleft()
            self._owner, self._count = me, 1
            return True

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("cannot release a lock this thread does not hold")
            self._count -= 1
            if self._count == 0:
                self._owner = None
                self._cond.notify_all()

    def __enter__(self) -> FairRLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
