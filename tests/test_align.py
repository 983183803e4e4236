"""Aligning two runs' sequences of top-level ops: where they match and where they first part.
Pure: lists of keys, no TensorFlow."""

from __future__ import annotations

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
