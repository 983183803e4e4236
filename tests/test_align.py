"""Aligning two runs' sequences of top-level ops: where they match and where they first part.
Pure: lists of keys, no TensorFlow."""

from __future__ import annotations

from typing import Any

import pytest

from nddebug.analysis import _matching_blocks


def _matched(ref: list[str], other: list[str]) -> list[tuple[int, int]]:
    blocks, _ = _matching_blocks(ref, other)
    return [(a + k, b + k) for a, b, size in blocks for k in range(size)]


def test_identical_runs_match_everywhere_and_never_part() -> None:
    keys = ["step"] * 50_000  # a long loop of one op: difflib alone is quadratic here
    blocks, first = _matching_blocks(keys, list(keys))
    assert blocks == [(0, 0, 50_000)] and first is None


def test_runs_part_where_they_first_differ_and_match_again_after() -> None:
    ref = ["a", "b", "a", "b", "c", "d"]
    other = ["a", "b", "x", "c", "d"]
    _, first = _matching_blocks(ref, other)
    assert first == (2, 2)
    pairs = _matched(ref, other)
    assert (0, 0) in pairs and (1, 1) in pairs  # the common head
    assert (4, 3) in pairs and (5, 4) in pairs  # the common tail
    assert all(ref[a] == other[b] for a, b in pairs)


def test_a_longer_run_parts_where_the_shorter_ends() -> None:
    ref = ["s"] * 40
    other = ["s"] * 45
    _, first = _matching_blocks(ref, other)
    assert first == (40, 40)
    assert len(_matched(ref, other)) == 40


def _runs_with_an_extra_assign(extra_in: int, fresh: bool = False) -> list:
    """Two traced runs of four calls of one step; in run ``extra_in`` only, the variable the
    step reads is assigned before the third call. ``fresh``: each run builds its variable and
    step again, as a run in another process does (its variable has another handle id)."""
    import tensorflow as tf

    import nddebug

    def build():
        v = tf.Variable(1.0)

        @tf.function
        def step(x):
            return v.assign_add(x * v)

        return v, step

    v, step = build()
    recs = []
    for run in range(2):
        if fresh:
            v, step = build()
        v.assign(1.0)
        with nddebug.trace() as rec:
            for i in range(4):
                if i == 2 and run == extra_in:
                    v.assign(2.0)
                step(tf.constant(0.5))
        recs.append(rec)
    return recs


def test_an_op_that_only_a_later_run_made_is_a_finding() -> None:
    """An assignment that ran in the second run only was dropped (only the reference run's
    extra ops were units): the read it changed was named the source, the variable "changed
    outside the traced block". Either way round, it is the op that ran in some runs only."""
    import nddebug

    for extra_in in (0, 1):
        report = nddebug.compare(_runs_with_an_extra_assign(extra_in))
        rows = {(f.op.op_type, f.role) for f in report.comparison.findings}
        assert ("AssignVariableOp", "control flow") in rows, (extra_in, str(report))
        assert not [f for f in report.comparison.findings if f.role == "source"], str(report)


@pytest.mark.parametrize("extra_in", [0, 1])
def test_an_op_only_one_run_made_is_where_runs_part_and_what_it_wrote_only_propagates(
    extra_in: int,
) -> None:
    """Runs that each build their variable (another process, a model built again): the
    assignment only run 1 made was not linked to the read of the same variable (its handle
    id differs), so the read was named the source, "changed outside the traced block"; and
    where the runs first part named that read, not the assignment. Now the runs part at the
    third step, in the assignment, whichever run made it, and nothing is a source."""
    import nddebug

    report = nddebug.compare(_runs_with_an_extra_assign(extra_in, fresh=True))
    findings = report.comparison.findings
    assert not [f for f in findings if f.role == "source"], str(report)
    assert {f.kind for f in findings if f.role == "propagated"} == {"control flow"}, str(report)
    fd = report.first_divergence
    assert fd is not None and fd.role == "control flow", fd
    assert fd.step == 3 and fd.steps == 4, fd
    assert fd.op_type in ("AssignVariableOp", "Const", "Fill"), fd


def _setup_explained(report: Any) -> set[str]:
    """The op types of the findings explained as the first run's setup that later runs reused."""
    return {
        f.op.op_type for f in report.comparison.findings if "later runs reused" in f.explanation
    }


def test_variables_only_the_first_run_made_are_its_setup_but_not_where_each_run_made_its_own():
    """Variables made in the first run only, and reused by the next, are the first call's
    setup ("make one call before recording"). Two recordings of different programs each made
    their own, and were told the same (probe round 40, F2): they only took other paths."""
    import tensorflow as tf

    import nddebug

    def program_a() -> Any:
        v = tf.Variable(tf.ones([3]))
        return v.assign_add(tf.ones([3]) * 2.0)

    def program_b() -> Any:
        w = tf.Variable(tf.zeros([5]))
        return w.assign_sub(tf.ones([5]))

    recs = []
    for program in (program_a, program_b):
        with nddebug.trace() as rec:
            program()
        recs.append(rec)
    different = nddebug.compare(recs)
    assert {"VarHandleOp"} <= {f.op.op_type for f in different.comparison.findings}
    assert _setup_explained(different) == set(), str(different)

    made: list[Any] = []
    recs = []
    for _ in range(2):
        with nddebug.trace() as rec:
            if not made:
                made.append(tf.Variable(tf.ones([3])))
            made[0].assign_add(tf.ones([3]))
        recs.append(rec)
    reused = nddebug.compare(recs)
    assert "VarHandleOp" in _setup_explained(reused), str(reused)
