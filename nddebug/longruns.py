"""Compare long runs in a recording file without a Python object per op execution.

``nddebug.compare(nddebug.load(path))`` builds one :class:`Event` per op execution: about
700 bytes each, so two runs of 10M executions need about 14 GB. :func:`compare_file` reads
the runs as arrays instead (:func:`nddebug.storage.load_columns`: op ids, calls and output
digests, about 40 bytes per execution), finds the first top-level call at which each run
parts from the first (:func:`nddebug.storage.first_difference`, call by call, so the order in
which a call's graph ops finished does not count) and counts, per step, the executions that
differ (:func:`nddebug.storage.call_differences`). Then it reads back only the first
divergent call of every run, in full, and analyses it op by op as any report does: the
source, what it propagated to, where it was made and why. The calls before it are equal in
every run, so that call holds the source. The report says which step that is in the whole
run and draws the whole run's timeline.
"""

from __future__ import annotations

import os

import numpy as np

from nddebug import storage
from nddebug.check import compare
from nddebug.report import Report
from nddebug.timeline import Window, step_of, steps_among

#: Runs with at least this many op executions are compared as arrays by :func:`compare_file`
#: (and by ``nddebug report``); shorter ones are loaded whole. NDDEBUG_LONG_RUN overrides it.
LONG_RUN = 1_000_000


def long_run_threshold() -> int:
    """:data:`LONG_RUN`, or the NDDEBUG_LONG_RUN environment variable when set."""
    value = os.environ.get("NDDEBUG_LONG_RUN", "")
    return int(value) if value.isdigit() and int(value) > 0 else LONG_RUN


def compare_file(path: str, long_run: int | None = None) -> Report:
    """Compare the runs of the recording file ``path`` (the first is the reference), in
    memory bounded by arrays of the runs' digests when a run holds ``long_run`` op executions
    or more (default: :func:`long_run_threshold`); otherwise as
    ``nddebug.compare(nddebug.load(path))``. Runs of other kinds
    (captures, rerun mode) and runs that make different numbers of calls are loaded whole."""
    long_run = long_run_threshold() if long_run is None else long_run
    sizes = [n for *_, n in storage.run_index(path)]
    if len(sizes) < 2 or max(sizes) < long_run:
        return compare(storage.load(path))
    runs = storage.load_columns(path, fields=("call", "outputs"))
    if any(r.kind != "run" for r in runs):
        return compare(storage.load(path))
    ref = runs[0]
    calls = [storage.call_numbers(r) for r in runs]
    if len({int(c[-1]) if len(c) else -1 for c in calls}) > 1:
        # Another number of calls: the paths part somewhere, and calls cannot be matched by
        # number after it. The whole comparison aligns them by their ops.
        return compare(storage.load(path))
    first: int | None = None
    for run in runs[1:]:
        i = storage.first_difference(ref, run, order="call")
        if i is None:
            continue
        if i >= len(ref):
            return compare(storage.load(path))  # it made more calls: compared whole
        k = int(calls[0][i])
        first = k if first is None else min(first, k)
    window = first if first is not None else int(calls[0][-1])
    end = int(np.searchsorted(calls[0], window, side="right")) - 1
    if ref.call is not None and ref.call[end] < 0:
        return compare(storage.load(path))  # executions no call claimed: compared whole
    ranges = []
    for run, numbers in zip(runs, calls, strict=True):
        at = np.flatnonzero(numbers == window)  # calls are numbered in order: one stretch
        if not at.size:
            return compare(storage.load(path))  # that call is not there: compared whole
        ranges.append(storage.seq_range(path, run.run_id, int(at[0]), int(at[-1]) + 1))
    recordings = [
        storage.load_run(path, run.run_id, seqs) for run, seqs in zip(runs, ranges, strict=True)
    ]
    return Report(recordings, mode="compare", window=_window(runs, calls, window))


def _ends(numbers: np.ndarray) -> np.ndarray:
    """The index of each call's last execution (any of its executions names the call's
    top-level op by its seq: ``call``)."""
    return np.append(np.flatnonzero(numbers[1:] != numbers[:-1]), len(numbers) - 1)


def _window(runs: list[storage.RunColumns], calls: list[np.ndarray], window: int) -> Window:
    """Where call number ``window`` sits in the reference run, and the whole run's timeline."""
    ref, numbers = runs[0], calls[0]
    assert ref.call is not None
    ends = _ends(numbers)
    # The top-level op of each call: the execution whose seq is the call's (``call``); its op
    # id is found among the call's executions, whichever position it arrived in.
    top = [(int(ref.call[i]), ref.ops.get(_top_op(ref, numbers, i))) for i in ends.tolist()]
    steps = steps_among([(seq, op) for seq, op in top if seq >= 0])
    per_call = np.zeros(len(ends), np.int64)
    for run, theirs in zip(runs[1:], calls[1:], strict=True):
        np.maximum(per_call, storage.call_differences(ref, run, numbers, theirs), out=per_call)
    per_call[ref.call[ends] < 0] = 0  # no call claimed them: in no step (as divergence_per_step)
    timeline = np.zeros(len(steps), np.int64)
    if steps:
        # A call belongs to the step of the first step call at or after it (step_of).
        at = np.searchsorted(np.asarray(steps), ref.call[ends], side="left")
        np.add.at(timeline, np.minimum(at, len(steps) - 1), per_call)
    start = int(np.searchsorted(numbers, window, side="left"))
    ran = np.flatnonzero(np.bincount(ref.op_id)) if len(ref) else np.zeros(0, np.int64)
    return Window(
        step=step_of(steps, int(ref.call[ends[window]])),
        steps=len(steps),
        first_index=start,
        executions=len(ref),
        timeline=timeline.tolist(),
        executed=frozenset(ran.tolist()),
    )


def _top_op(run: storage.RunColumns, numbers: np.ndarray, end: int) -> int:
    """The op id of the top-level op of the call that ends at execution ``end``: the op whose
    key names no graph (an eager op or function call), first or last in the call."""
    first = int(np.searchsorted(numbers, numbers[end], side="left"))
    for i in (end, first):
        op = run.ops.get(int(run.op_id[i]))
        if op is not None and not op.graph:
            return int(run.op_id[i])
    return int(run.op_id[end])
