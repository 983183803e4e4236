"""The block's call lock: re-entrant, taken in the order threads asked for it, and a timed-out
wait leaves the line without blocking those behind it."""

from __future__ import annotations

import threading
import time

import pytest

from nddebug.tracer.fairlock import FairRLock


def test_reentrant_and_only_its_owner_releases() -> None:
    lock = FairRLock()
    assert lock.acquire() and lock.acquire(timeout=0.1)
    other: list[bool] = []
    t = threading.Thread(target=lambda: other.append(lock.acquire(timeout=0.05)))
    t.start()
    t.join()
    assert other == [False]  # held twice by this thread
    errors: list[BaseException] = []

    def release_it() -> None:
        try:
            lock.release()
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=release_it)
    t.start()
    t.join()
    assert len(errors) == 1  # another thread cannot release it
    lock.release()
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()  # a third release: not held any more


def test_waiting_threads_get_it_in_the_order_they_asked() -> None:
    """The holder that asks again goes behind those already waiting (threading.RLock would
    usually hand it straight back)."""
    lock = FairRLock()
    order: list[str] = []
    lock.acquire()

    def take(name: str) -> None:
        assert lock.acquire(timeout=5.0)
        order.append(name)
        lock.release()

    waiters = []
    for name in ("a", "b", "c"):
        t = threading.Thread(target=take, args=(name,))
        t.start()
        waiters.append(t)
        time.sleep(0.05)  # each is in line before the next starts
    lock.release()
    take("holder again")
    for t in waiters:
        t.join()
    assert order == ["a", "b", "c", "holder again"]


def test_a_timed_out_waiter_does_not_block_the_line() -> None:
    lock = FairRLock()
    lock.acquire()
    results: dict[str, bool] = {}

    def take(name: str, timeout: float) -> None:
        results[name] = lock.acquire(timeout=timeout)
        if results[name]:
            lock.release()

    first = threading.Thread(target=take, args=("gives up", 0.1))
    first.start()
    time.sleep(0.02)
    second = threading.Thread(target=take, args=("waits", 5.0))
    second.start()
    first.join()
    lock.release()
    second.join(5.0)
    assert results == {"gives up": False, "waits": True}
