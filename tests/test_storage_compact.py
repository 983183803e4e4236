"""Format 3 of the recording file: op executions as compressed columns in chunk rows. Loaded
runs equal the saved ones field for field; a run costs at most 32 bytes per op execution on
disk; RunWriter streams a run chunk by chunk and a killed writer leaves what it committed;
older files still load and are upgraded when appended to; load_columns / first_difference
compare runs as arrays. Real TensorFlow traces, real SQLite files, real subprocesses."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug import digest as dg
from nddebug import storage
from nddebug.recording import Event, OpInfo, Recording
from tests.helpers import ROOT, subprocess_env

# ------------------------------------------------------------------ recordings to store


class _Stop(Exception):
    pass


def _small_loop(steps: int, label: str = "") -> Recording:
    """A small training loop traced for ``steps`` steps (a new variable per call, so every
    call records the same ops)."""
    w = tf.Variable(tf.ones([8, 8]) * 0.1)
    x = tf.constant(np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(4, 8))

    @tf.function
    def step(a):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.tanh(tf.matmul(a, w)))
        w.assign_sub(0.05 * tape.gradient(loss, w))
        return loss

    with nddebug.trace(label=label or f"{steps} steps") as rec:
        for _ in range(steps):
            step(x)
    return rec


@pytest.fixture(scope="module")
def loop_200() -> Recording:
    return _small_loop(200)


@pytest.fixture(scope="module")
def real_runs(loop_200) -> list[Recording]:
    """Real traces with every kind of field: eager ops (shapes), a tf.function with an
    unseeded random op, bool/float16/string outputs, a variable's handle (a digest of None),
    an interrupted run, a
    rerun run (re-executions), and the 200-step loop."""
    x = tf.constant(np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4))

    @tf.function
    def step(a):
        h = tf.nn.relu(tf.matmul(a, a, transpose_b=True))
        words = tf.strings.as_string(tf.reduce_sum(h))
        return tf.reduce_sum(h) + tf.random.uniform([]), tf.strings.length(words)

    runs = []
    for i in range(2):
        with nddebug.trace(label=f"run {i}") as rec:
            y = x * 2.0 - 1.0
            positive = y > 0.0
            half = tf.cast(y, tf.float16) * tf.constant(0.5, tf.float16)
            step(y)
            tf.strings.join([tf.constant("a"), tf.constant("b")])
            tf.reduce_sum(tf.cast(positive, tf.int64))
            tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="handle")
            del half
        runs.append(rec)
    with pytest.raises(_Stop), nddebug.trace(label="interrupted") as interrupted:
        x + 1.0
        raise _Stop
    runs.append(interrupted)
    with nddebug.trace(label="rerun", rerun=2) as rerun:
        tf.reduce_sum(tf.matmul(x, x, transpose_b=True) * 2.0)
    runs.append(rerun)
    runs.append(loop_200)
    return runs


def test_the_real_runs_hold_every_kind_of_field(real_runs):
    events = [ev for rec in real_runs for ev in rec.events]
    assert any(ev.shapes for ev in events) and any(ev.shapes is None for ev in events)
    assert any(None in ev.digests for ev in events)
    assert any(ev.inputs for ev in events)
    assert any(ev.reruns for ev in events)
    assert any(ev.call != ev.seq for ev in events)
    assert {op.graph for rec in real_runs for op in rec.ops.values()} > {""}
    assert real_runs[2].status == "interrupted"


def assert_same_events(got: list[Event], want: list[Event]) -> None:
    """Every field of every event, and tuples where the tracer gives tuples."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for f in dataclasses.fields(Event):
            assert getattr(g, f.name) == getattr(w, f.name), (f.name, g, w)
        assert all(d is None or type(d) is tuple for d in g.digests)
        assert all(type(v) is int for d in g.digests if d is not None for v in d)
    assert got == want


def assert_same_run(got: Recording, want: Recording) -> None:
    for f in dataclasses.fields(Recording):
        if f.name not in ("events", "values"):
            assert getattr(got, f.name) == getattr(want, f.name), f.name
    for op_id, op in want.ops.items():
        for f in dataclasses.fields(OpInfo):
            assert getattr(got.ops[op_id], f.name) == getattr(op, f.name), (op_id, f.name)
    assert_same_events(got.events, want.events)
    assert sorted(got.values) == sorted(want.values)
    for name, value in want.values.items():
        assert got.values[name].tobytes() == np.ascontiguousarray(value).tobytes()


def _chunk_rows(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as con:
        return con.execute(
            "SELECT run_id, chunk, first_seq, events, arrays, data FROM chunks "
            "ORDER BY run_id, chunk"
        ).fetchall()


def _meta(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as con:
        return dict(con.execute("SELECT key, value FROM meta"))


# ------------------------------------------------------------------ round trip and size


def test_real_recordings_round_trip_exactly(real_runs, tmp_path):
    path = tmp_path / "runs.nddebug"
    runs = [dataclasses.replace(real_runs[0], values={"0:0": np.arange(5, dtype=np.float32)})]
    runs += real_runs[1:]
    storage.save(runs, str(path))
    assert _meta(path)["format_version"] == "4" == str(storage.FORMAT_VERSION)
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT COUNT(*) FROM events").fetchone() == (0,)
        assert con.execute("SELECT SUM(events) FROM chunks").fetchone() == (
            sum(len(r.events) for r in runs),
        )
    loaded = nddebug.load(str(path))
    assert [r.label for r in loaded] == [r.label for r in runs]
    for got, want in zip(loaded, runs, strict=True):
        assert_same_run(got, want)
    before = nddebug.compare(real_runs[:2])
    after = nddebug.compare(loaded[:2])
    assert not before.ok and str(after) == str(before)


def test_edge_case_events_round_trip(tmp_path):
    """Values the tracer never makes but the data model allows: extreme digests, None
    inputs and dims, empty lists, seq gaps, negative calls, out-of-order events."""
    rec = Recording(label="edge", digest_algorithm=dg.ALGORITHM, kind="rerun")
    rec.ops[2**40] = OpInfo(2**40, "k", "T", "", "", "", "", [], [], [])
    big, small = 2**63 - 1, -(2**63)
    rec.events = [
        Event(5, 2**40, -1, [(big, small), None, (0, 0)], [None, (big, big)], [[None, 3], None]),
        Event(-7, 2**40, 2**62, [], [], [], [[]]),
        Event(2**62, 2**40, -(2**62), [None], None, [[2**62, 0]], [[None], [(1, 2)], []]),
        Event(6, 2**40, 6, [(big, small)], [(big, small)] * 300, None, []),
    ]
    storage.save([rec], str(tmp_path / "edge.nddebug"))
    (got,) = nddebug.load(str(tmp_path / "edge.nddebug"))
    assert_same_events(got.events, sorted(rec.events, key=lambda ev: ev.seq))


def test_a_run_costs_at_most_32_bytes_per_op_execution(loop_200, tmp_path):
    one = _small_loop(1, label="one step")
    sizes = {}
    for name, rec in (("one", one), ("many", loop_200)):
        path = tmp_path / f"{name}.nddebug"
        rec.save(str(path))
        sizes[name] = path.stat().st_size
    executions = len(loop_200.events) - len(one.events)
    assert len(loop_200.events) >= 200 * 10
    per_execution = (sizes["many"] - sizes["one"]) / executions
    payload = sum(len(r[4]) + len(r[5]) for r in _chunk_rows(tmp_path / "many.nddebug"))
    assert per_execution <= 32, per_execution
    assert payload / len(loop_200.events) <= 32
    # Format 2 for scale: one JSON row per execution.
    old = tmp_path / "old.nddebug"
    storage.save([loop_200], str(old), format_version=2)
    assert old.stat().st_size > 4 * sizes["many"]


def test_runs_longer_than_a_chunk_span_several_chunks(loop_200, tmp_path):
    path = tmp_path / "chunks.nddebug"
    with storage.RunWriter(str(path), dataclasses.replace(loop_200, events=[]), chunk_events=97):
        pass
    (empty,) = nddebug.load(str(path))
    assert empty.events == []
    path.unlink()
    rec = dataclasses.replace(loop_200, run_id="x" * 32, events=list(loop_200.events))
    with storage.RunWriter(str(path), rec, chunk_events=97) as writer:
        pass
    assert writer.chunks_written == -(-len(rec.events) // 97) > 20
    (got,) = nddebug.load(str(path))
    assert_same_run(got, dataclasses.replace(rec, status="complete"))
    (columns,) = storage.load_columns(str(path))
    _assert_columns_match(columns, got)


# ------------------------------------------------------------------ streaming


_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from nddebug import storage
    from nddebug.recording import Event, OpInfo, Recording

    path, how = sys.argv[1], sys.argv[2]
    rec = Recording(label="streamed", run_id="f" * 32, digest_algorithm="x",
                    warnings=["traced before"], environment={"python": "3"})
    op = lambda i: OpInfo(i, f"k{i}", "T", "", "", "", "", ["float32"], [[2]], [True])
    writer = storage.RunWriter(path, rec)
    for k in range(3):
        events = [Event(100 * k + i, k, 100 * k, [(k, i)], [(k, i - 1)] if i else [], None)
                  for i in range(50)]
        writer.append(events, {k: op(k)})
        print("appended", k, flush=True)
    if how == "mid-append":
        insert = storage._insert_chunks

        def killed(*args):  # the 4th chunk is inserted, not committed, when the process dies
            insert(*args)
            os.kill(os.getpid(), signal.SIGKILL)

        storage._insert_chunks = killed
        writer.append([Event(1000, 0, 1000, [(9, 9)], [], None)], {})
    os._exit(0)  # no close(): as if the process were killed between chunks
    """
)


def _streamed(k: int) -> list[Event]:
    return [
        Event(100 * k + i, k, 100 * k, [(k, i)], [(k, i - 1)] if i else [], None) for i in range(50)
    ]


@pytest.mark.parametrize("how", ["between chunks", "mid-append"])
def test_a_killed_writer_leaves_its_chunks_readable_and_the_run_interrupted(tmp_path, how):
    path = tmp_path / "stream.nddebug"
    storage.save([_small_run("before")], str(path))
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, str(path), how.split()[0]],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == (-signal.SIGKILL if how == "mid-append" else 0), done.stderr
    assert done.stdout.split("\n")[:3] == ["appended 0", "appended 1", "appended 2"]
    if how == "mid-append":
        assert Path(str(path) + "-journal").exists()  # a hot journal: the 4th chunk is undone
    before, streamed = nddebug.load(str(path))
    assert before.label == "before"
    assert streamed.label == "streamed" and streamed.status == "interrupted"
    assert streamed.warnings == ["traced before", storage.UNCLOSED_WARNING]
    assert streamed.events == _streamed(0) + _streamed(1) + _streamed(2)
    assert sorted(streamed.ops) == [0, 1, 2]
    (_, columns) = storage.load_columns(str(path))
    assert len(columns) == 150 and columns.status == "interrupted"
    # The file takes more runs afterwards.
    storage.save([_small_run("after")], str(path))
    assert [r.label for r in nddebug.load(str(path))] == ["before", "streamed", "after"]


def _small_run(label: str, n: int = 3) -> Recording:
    rec = Recording(label=label, digest_algorithm="x", environment={"python": "3"})
    rec.ops[0] = OpInfo(0, "eager:Mul@x.py:1 (f)", "Mul", "", "", "CPU", "", ["float32"],
                        [[2]], [True])  # fmt: skip
    rec.events = [Event(i, 0, i, [(i, -i)], [(1, 2)], [[2]]) for i in range(n)]
    return rec


def test_a_closed_writer_gives_the_run_as_saved(real_runs, tmp_path):
    path = tmp_path / "closed.nddebug"
    rec = real_runs[0]
    header = dataclasses.replace(rec, ops={}, events=[], warnings=["early"])
    writer = storage.RunWriter(str(path), header)
    (opened,) = nddebug.load(str(path))
    assert opened.status == "interrupted" and opened.events == []
    assert opened.warnings == ["early", storage.UNCLOSED_WARNING]
    # Events arrive in pieces, each with the ops seen so far; another process's save lands
    # between two appends.
    seen: dict[int, OpInfo] = {}
    for k in range(0, len(rec.events), 5):
        piece = rec.events[k : k + 5]
        for ev in piece:
            seen[ev.op_id] = rec.ops[ev.op_id]
        writer.append(piece, dict(seen))
        if k == 5:
            storage.save([_small_run("meanwhile")], str(path))
    # The ops no execution named, and one changed since it was appended, come with close().
    moved = dataclasses.replace(rec.ops[rec.events[0].op_id], device="/device:CPU:1")
    last = {i: op for i, op in rec.ops.items() if i not in seen} | {moved.op_id: moved}
    values = {"1:0": np.ones(3, np.float16)}
    writer.close("complete", warnings=rec.warnings, values=values, ops=last)
    writer.close("interrupted")  # closing twice does nothing
    with pytest.raises(nddebug.RecordingFileError, match="closed"):
        writer.append(rec.events[:1], {})
    got, meanwhile = nddebug.load(str(path))
    assert meanwhile.label == "meanwhile"
    ops = {**rec.ops, moved.op_id: moved}
    assert_same_run(got, dataclasses.replace(rec, values=values, ops=ops))
    assert got.status == "complete"


def test_a_writer_in_a_with_block_that_raises_closes_the_run_as_interrupted(tmp_path):
    path = tmp_path / "raised.nddebug"
    rec = _small_run("raised")
    with pytest.raises(_Stop), storage.RunWriter(str(path), rec) as writer:
        writer.append([Event(10, 0, 10, [(1, 1)], None, None)])
        raise _Stop
    (got,) = nddebug.load(str(path))
    assert got.status == "interrupted" and got.warnings == []
    assert got.events == [*rec.events, Event(10, 0, 10, [(1, 1)], None, None)]


def test_the_writer_refuses_what_it_could_not_load_back(tmp_path):
    path = str(tmp_path / "refused.nddebug")
    rec = _small_run("r")
    with storage.RunWriter(path, rec) as writer:
        with pytest.raises(nddebug.RecordingFileError, match="not after"):
            writer.append([Event(1, 0, 1, [(0, 0)], None, None)])
        with pytest.raises(nddebug.RecordingFileError, match="op 5"):
            writer.append([Event(20, 5, 20, [(0, 0)], None, None)])
        with pytest.raises(nddebug.RecordingFileError, match="seq 30"):
            writer.append([Event(30, 0, 30, [], None, None)] * 2)
        with pytest.raises(nddebug.RecordingFileError, match="64-bit"):
            writer.append([Event(40, 0, 40, [(2**64, 0)], None, None)])
    with pytest.raises(nddebug.RecordingFileError, match="already in the file"):
        storage.RunWriter(path, rec)
    (got,) = nddebug.load(path)
    assert got.events == rec.events and got.status == "complete"


# ------------------------------------------------------------------ older formats


def test_older_files_load_and_are_upgraded_when_appended_to(real_runs, tmp_path):
    v1, v2 = tmp_path / "v1.nddebug", tmp_path / "v2.nddebug"
    storage.save(real_runs[:2], str(v2), format_version=2)
    storage.save(real_runs[:2], str(v1), format_version=2)
    with sqlite3.connect(v1) as con:  # as nddebug 0.1 wrote it
        con.execute("DROP TABLE reruns")
        con.execute("UPDATE meta SET value = '1' WHERE key = 'format_version'")
    for path, version in ((v1, "1"), (v2, "2")):
        meta = _meta(path)
        assert meta["format_version"] == version
        with sqlite3.connect(path) as con:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
            rows = con.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        assert "chunks" not in tables and rows == sum(len(r.events) for r in real_runs[:2])
        for got, want in zip(nddebug.load(str(path)), real_runs[:2], strict=True):
            assert_same_run(got, want)
        old_columns = storage.load_columns(str(path))
        assert storage.first_difference(old_columns[0], old_columns[0]) is None
        # Appending a new run upgrades the file; the old runs keep their rows.
        storage.save(real_runs[3:], str(path))
        assert _meta(path)["format_version"] == "4"
        assert "chunks" in _meta(path)["description"]
        with sqlite3.connect(path) as con:
            assert con.execute("SELECT COUNT(*) FROM events").fetchone()[0] == rows
            assert con.execute("SELECT COUNT(DISTINCT run_id) FROM chunks").fetchone() == (2,)
        loaded = nddebug.load(str(path))
        for got, want in zip(loaded, real_runs[:2] + real_runs[3:], strict=True):
            assert_same_run(got, want)
        columns = storage.load_columns(str(path))
        _assert_columns_match(columns[0], loaded[0])
        _assert_columns_match(columns[2], loaded[2])


def test_format_2_can_still_be_written_for_older_readers(real_runs, tmp_path):
    path = tmp_path / "for-old.nddebug"
    storage.save(real_runs[3:4], str(path), format_version=2)
    assert _meta(path)["format_version"] == "2"
    storage.save(real_runs[:1], str(path))  # a format-3 run upgrades it
    storage.save(real_runs[1:2], str(path), format_version=2)  # rows in a format-4 file
    assert _meta(path)["format_version"] == "4"
    loaded = nddebug.load(str(path))
    for got, want in zip(loaded, [real_runs[3], real_runs[0], real_runs[1]], strict=True):
        assert_same_run(got, want)
    with pytest.raises(ValueError, match="format_version"):
        storage.save(real_runs[:1], str(path), format_version=1)


def test_a_newer_file_is_still_refused(tmp_path):
    path = tmp_path / "newer.nddebug"
    _small_run("x").save(str(path))
    with sqlite3.connect(path) as con:
        con.execute("UPDATE meta SET value = '5' WHERE key = 'format_version'")
    for load in (nddebug.load, storage.load_columns):
        with pytest.raises(nddebug.RecordingFileError, match="newer"):
            load(str(path))
    with pytest.raises(nddebug.RecordingFileError, match="newer"):
        storage.RunWriter(str(path), _small_run("y"))


# ------------------------------------------------------------------ damaged chunks


def _rewrite_chunk(path: Path, run: int, change: Any) -> None:
    """Replace chunk 0 of the ``run``-th run by change(arrays dict, data) -> (arrays, data)."""
    with sqlite3.connect(path) as con:
        (run_id,) = con.execute("SELECT run_id FROM runs WHERE ordinal = ?", (run,)).fetchone()
        arrays, data = con.execute(
            "SELECT arrays, data FROM chunks WHERE run_id = ? AND chunk = 0", (run_id,)
        ).fetchone()
        arrays, data = change(json.loads(arrays), data)
        con.execute(
            "UPDATE chunks SET arrays = ?, data = ? WHERE run_id = ? AND chunk = 0",
            (arrays if isinstance(arrays, str) else json.dumps(arrays), data, run_id),
        )


def _replace_array(name: str, values: np.ndarray) -> Any:
    def change(arrays: dict, data: bytes) -> tuple[dict, bytes]:
        raw = values.tobytes()
        arrays[name] = [values.dtype.str, "raw", values.size, len(data), len(raw)]
        return arrays, data + raw

    return change


def _garble(name: str) -> Any:
    def change(arrays: dict, data: bytes) -> tuple[dict, bytes]:
        _, codec, _, offset, nbytes = arrays[name]
        assert codec == "zlib"
        bad = bytearray(data)
        bad[offset + 2 : offset + nbytes] = b"\xff" * (nbytes - 2)
        return arrays, bytes(bad)

    return change


def _bomb(arrays: dict, data: bytes) -> tuple[dict, bytes]:
    big = zlib.compress(b"\0" * (64 << 20))
    arrays["codes"] = ["|u1", "zlib", arrays["codes"][2], len(data), len(big)]
    return arrays, data + big


DAMAGE = {
    "op not in the ops table": (_replace_array("op_id", np.full(64, 99999, "<i4")), "op 99999"),
    "garbled zlib": (_garble("digests"), "not readable zlib data"),
    "object dtype": (
        lambda a, d: ({**a, "op_id": ["|O", "raw", 64, 0, 512]}, d),
        "is described as",
    ),
    "beyond the data": (
        lambda a, d: ({**a, "call": [a["call"][0], "raw", 64, len(d), 512]}, d),
        "beyond the end",
    ),
    "missing array": (
        lambda a, d: ({k: v for k, v in a.items() if k != "codes"}, d),
        "lacks the array 'codes'",
    ),
    "wrong count": (_replace_array("outputs", np.ones(63, "|u1")), "has 63 values"),
    "code beyond the dictionary": (_replace_array("codes", np.full(192, 250, "|u1")), "dictionary"),
    "decompression bomb": (_bomb, "does not hold"),
    "directory not JSON": (lambda a, d: ("{", d), "not valid JSON"),
    "data not bytes": (lambda a, d: (a, "text"), "not bytes"),
}


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_a_damaged_chunk_is_a_recording_file_error_naming_the_run(tmp_path, name):
    change, phrase = DAMAGE[name]
    path = tmp_path / "damaged.nddebug"
    good = _small_run("good", n=64)
    bad = _small_run("bad", n=64)
    bad.events = [Event(i, 0, i, [(i, -i), (i, i)], [(i, -i)], None) for i in range(64)]
    storage.save([good, bad], str(path))
    _rewrite_chunk(path, 1, change)
    for load in (nddebug.load, storage.load_columns):
        with pytest.raises(nddebug.RecordingFileError) as exc:
            load(str(path))
        message = str(exc.value)
        assert message.startswith(f"{path}: damaged: ") and "\n" not in message, message
        assert phrase in message and "chunk 0" in message, message
        assert "run 2 of 2 (label 'bad'" in message, message
    whole, problems = storage.salvage(str(path))
    assert [r.label for r in whole] == ["good"] and len(problems) == 1
    assert whole[0].events == good.events


def test_a_missing_chunk_is_named(tmp_path):
    path = tmp_path / "gap.nddebug"
    rec = _small_run("gap", n=30)
    with storage.RunWriter(str(path), rec, chunk_events=10):
        pass
    with sqlite3.connect(path) as con:
        con.execute("DELETE FROM chunks WHERE chunk = 1")
    with pytest.raises(nddebug.RecordingFileError, match="chunk 1 is missing"):
        nddebug.load(str(path))


def test_a_truncated_format_3_file_is_an_error_never_a_partial_run(tmp_path):
    path = tmp_path / "full.nddebug"
    runs = [_small_run(f"run {i}", n=20_000) for i in range(3)]
    storage.save(runs, str(path))
    data = path.read_bytes()
    assert len(nddebug.load(str(path))) == 3
    cut_path = tmp_path / "cut.nddebug"
    for cut in sorted({1, 100, *range(4096, len(data), max(4096, len(data) // 40))}):
        cut_path.write_bytes(data[:cut])
        with pytest.raises(nddebug.RecordingFileError):
            nddebug.load(str(cut_path))
        with pytest.raises(nddebug.RecordingFileError):
            storage.load_columns(str(cut_path))


# ------------------------------------------------------------------ columns


def _gathered(columns: storage.RunColumns, index: np.ndarray) -> list[Any]:
    rows = columns.digests[np.where(index < 0, 0, index)] if len(columns.digests) else None
    return [None if i < 0 else tuple(rows[k].tolist()) for k, i in enumerate(index.tolist())]


def _assert_columns_match(columns: storage.RunColumns, rec: Recording) -> None:
    events = rec.events
    assert len(columns) == len(events) and columns.ops == rec.ops
    assert columns.op_id.tolist() == [ev.op_id for ev in events]
    assert columns.seq.tolist() == [ev.seq for ev in events]
    assert columns.call.tolist() == [ev.call for ev in events]
    outputs = _gathered(columns, columns.outputs)
    offsets = columns.out_offsets.tolist()
    assert [outputs[offsets[i] : offsets[i + 1]] for i in range(len(events))] == [
        ev.digests for ev in events
    ]
    inputs = _gathered(columns, columns.inputs)
    offsets = columns.in_offsets.tolist()
    got = [
        inputs[offsets[i] : offsets[i + 1]] if columns.has_inputs[i] else None
        for i in range(len(events))
    ]
    assert got == [ev.inputs for ev in events]


def test_load_columns_gives_the_same_executions_as_load(real_runs, tmp_path):
    path = tmp_path / "columns.nddebug"
    storage.save(real_runs, str(path))
    loaded = nddebug.load(str(path))
    columns = storage.load_columns(str(path))
    assert [c.label for c in columns] == [r.label for r in real_runs]
    for c, rec in zip(columns, loaded, strict=True):
        _assert_columns_match(c, rec)
        assert c.op_id.dtype == np.int32 and c.outputs.dtype == np.int32
        assert (c.status, c.kind, c.warnings) == (rec.status, rec.kind, rec.warnings)
        for i in range(len(rec)):
            assert c.output_digests(i) == rec.events[i].digests
            assert c.input_digests(i) == rec.events[i].inputs
        _assert_columns_match(storage.columns_from_recording(rec), rec)
    # Fewer fields: the same outputs, the unused arrays left out, the dictionary smaller.
    small = storage.load_columns(str(path), fields=("outputs",))
    for s, c in zip(small, columns, strict=True):
        assert s.seq is None and s.call is None and s.inputs is None
        assert np.array_equal(s.out_offsets, c.out_offsets)
        assert _gathered(s, s.outputs) == _gathered(c, c.outputs)
        assert len(s.digests) <= len(c.digests)
    with pytest.raises(ValueError, match="unknown fields"):
        storage.load_columns(str(path), fields=("shapes",))


def test_first_difference_of_real_runs(real_runs, loop_200, tmp_path):
    path = tmp_path / "cmp.nddebug"
    storage.save(real_runs[:2], str(path))
    a, b = storage.load_columns(str(path))
    where = storage.first_difference(a, b)
    first = next(
        i
        for i, (x, y) in enumerate(zip(real_runs[0].events, real_runs[1].events, strict=True))
        if x.digests != y.digests
    )
    assert where == first
    assert storage.first_difference(a, a) is None
    # By call: the step's call, the one that holds the unseeded random op.
    start = storage.first_difference(a, b, order="call")
    assert start <= where
    call = [ev for ev in real_runs[0].events[start:] if ev.call == a.call[start]]
    assert "RandomUniform" in {real_runs[0].ops[ev.op_id].op_type for ev in call}
    # A deterministic loop: its graph ops may arrive in another order in each run, but each
    # call runs the same ops with the same outputs.
    loop = storage.columns_from_recording(loop_200)
    again = storage.columns_from_recording(_small_loop(200, label="again"))
    assert storage.first_difference(loop, again, order="call") is None
    arrival = storage.first_difference(loop, again)
    if arrival is not None:
        step = loop.call[arrival]
        assert loop.call[arrival:].tolist()[:1] == again.call[arrival:].tolist()[:1] == [step]


def _columns(ops: list[int], outputs: list[list[Any]], keys: dict[int, str] | None = None):
    """RunColumns made by hand: op ids, and per execution its output digests."""
    keys = keys or {i: f"op{i}" for i in set(ops)}
    rec = Recording(label="hand")
    for op_id, key in keys.items():
        rec.ops[op_id] = OpInfo(op_id, key, "T", "", "", "", "", [], [], [])
    rec.events = [Event(i, o, i, d) for i, (o, d) in enumerate(zip(ops, outputs, strict=True))]
    return storage.columns_from_recording(rec)


def _reference(a: storage.RunColumns, b: storage.RunColumns) -> int | None:
    for i in range(min(len(a), len(b))):
        if a.ops[int(a.op_id[i])].key != b.ops[int(b.op_id[i])].key:
            return i
        if a.output_digests(i) != b.output_digests(i):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def test_first_difference_on_crafted_columns():
    base = [[(1, 2)], [(3, 4), None], [], [(5, 6)], [(1, 2)]]
    ops = [0, 1, 2, 0, 0]
    a = _columns(ops, base)
    assert storage.first_difference(a, _columns(ops, base)) is None
    cases = {
        "another op": (([0, 1, 3, 0, 0], base), 2),
        "another digest": ((ops, [*base[:3], [(5, 7)], base[4]]), 3),
        "hi half only": ((ops, [[(1, 3)], *base[1:]]), 0),
        "None for a digest": ((ops, [base[0], [(3, 4), (0, 0)], *base[2:]]), 1),
        "one output fewer": ((ops, [base[0], [(3, 4)], *base[2:]]), 1),
        "a prefix": ((ops[:3], base[:3]), 3),
        "longer": (([*ops, 1], [*base, []]), 5),
        "last only": ((ops, [*base[:4], [(2, 1)]]), 4),
    }
    for name, ((ops_b, outs_b), want) in cases.items():
        b = _columns(ops_b, outs_b)
        assert storage.first_difference(a, b) == want == _reference(a, b), name
        assert storage.first_difference(b, a) == want, name
        for block in (1, 2, 3):
            assert storage.first_difference(a, b, block=block) == want, (name, block)
    # Op ids are per process: the same keys under other ids are the same ops.
    renamed = _columns([7, 8, 9, 7, 7], base, keys={7: "op0", 8: "op1", 9: "op2"})
    assert storage.first_difference(a, renamed) is None
    empty = _columns([], [])
    assert storage.first_difference(empty, empty) is None
    assert storage.first_difference(a, empty) == 0


def _columns_with_calls(rows: list[tuple[int, int, list[Any]]]) -> storage.RunColumns:
    """RunColumns by hand: per execution (call, op id, output digests)."""
    rec = Recording(label="calls")
    for op_id in range(4):
        rec.ops[op_id] = OpInfo(op_id, f"op{op_id}", "T", "", "", "", "", [], [], [])
    rec.events = [Event(i, o, c, d) for i, (c, o, d) in enumerate(rows)]
    return storage.columns_from_recording(rec)


def _call_reference(a: storage.RunColumns, b: storage.RunColumns) -> int | None:
    """order="call" in plain Python: calls as sorted lists of (key, digests)."""

    def calls(run: storage.RunColumns) -> list[tuple[int, list[str]]]:
        out: list[tuple[int, list[str]]] = []
        for i in range(len(run)):
            item = repr((run.ops[int(run.op_id[i])].key, run.output_digests(i)))
            if i and run.call[i] == run.call[i - 1]:
                out[-1][1].append(item)
            else:
                out.append((i, [item]))
        return [(start, sorted(items)) for start, items in out]

    ca, cb = calls(a), calls(b)
    for (start, x), (_, y) in zip(ca, cb, strict=False):
        if x != y:
            return start
    if len(ca) == len(cb):
        return None
    return ca[len(cb)][0] if len(ca) > len(cb) else len(a)


def test_first_difference_by_call_ignores_the_order_inside_a_call():
    x, y, z = [(1, 1)], [(2, 2)], [None]
    a = _columns_with_calls([(0, 0, x), (3, 1, y), (3, 2, z), (3, 3, x), (4, 0, y)])
    cases = {
        "same": ([(0, 0, x), (3, 1, y), (3, 2, z), (3, 3, x), (4, 0, y)], None, None),
        "reordered in a call": ([(0, 0, x), (3, 3, x), (3, 1, y), (3, 2, z), (4, 0, y)], None, 1),
        "other digest in a call": ([(0, 0, x), (3, 3, x), (3, 1, x), (3, 2, z), (4, 0, y)], 1, 1),
        "a call one op shorter": ([(0, 0, x), (3, 1, y), (3, 2, z), (4, 3, x), (5, 0, y)], 1, None),
        "last call differs": ([(0, 0, x), (3, 1, y), (3, 2, z), (3, 3, x), (4, 0, x)], 4, 4),
        "prefix ending inside a call": ([(0, 0, x), (3, 1, y), (3, 2, z)], 1, 3),
        "prefix ending at a call": ([(0, 0, x), (3, 1, y), (3, 2, z), (3, 3, x)], 4, 4),
        "longer": ([(0, 0, x), (3, 1, y), (3, 2, z), (3, 3, x), (4, 0, y), (5, 0, y)], 5, 5),
        "last call longer": ([(0, 0, x), (3, 1, y), (3, 2, z), (3, 3, x), (4, 0, y), (4, 1, y)],
                             4, 5),
    }  # fmt: skip
    for name, (rows, by_call, by_arrival) in cases.items():
        b = _columns_with_calls(rows)
        for block in (1, 2, 3, 1 << 20):
            assert storage.first_difference(a, b, block, order="call") == by_call, (name, block)
            assert storage.first_difference(b, a, block, order="call") == by_call, (name, block)
        assert _call_reference(a, b) == by_call, name
        assert storage.first_difference(a, b) == by_arrival, name
    with pytest.raises(ValueError, match="call field"):
        storage.first_difference(a, storage.columns_from_recording(Recording(), ()), order="call")
    with pytest.raises(ValueError, match="order"):
        storage.first_difference(a, a, order="sorted")


def test_first_difference_agrees_with_a_plain_loop_on_random_runs():
    rng = np.random.default_rng(20261122)
    for trial in range(200):
        n = int(rng.integers(0, 40))
        ops = rng.integers(0, 4, n).tolist()
        outs = [
            [None if rng.random() < 0.1 else (int(rng.integers(0, 3)), 0)
             for _ in range(int(rng.integers(0, 3)))]
            for _ in range(n)
        ]  # fmt: skip
        a = _columns(ops, outs, keys={i: f"op{i}" for i in range(4)})
        ops_b, outs_b = list(ops), [list(o) for o in outs]
        for _ in range(int(rng.integers(0, 3))):  # a few random changes
            if n and rng.random() < 0.5:
                i = int(rng.integers(0, n))
                if outs_b[i] and rng.random() < 0.7:
                    outs_b[i][int(rng.integers(0, len(outs_b[i])))] = (9, 9)
                else:
                    ops_b[i] = (ops_b[i] + 1) % 4
        if rng.random() < 0.2:
            ops_b, outs_b = ops_b[: n // 2], outs_b[: n // 2]
        b = _columns(ops_b, outs_b, keys={i: f"op{i}" for i in range(4)})
        want = _reference(a, b)
        for block in (1, 3, 1 << 20):
            assert storage.first_difference(a, b, block=block) == want, (trial, block)
        # The same runs cut into calls, each call's executions shuffled in b.
        cuts = np.sort(rng.integers(0, n + 1, 4)) if n else np.zeros(0, int)
        calls = np.searchsorted(cuts, np.arange(n), side="right")
        rows_a = [(int(c), o, d) for c, o, d in zip(calls, ops, outs, strict=True)]
        rows_b = [(int(c), o, d) for c, o, d in zip(calls, ops_b, outs_b, strict=False)]
        order = rng.permutation(len(rows_b))
        rows_b = sorted((rows_b[i] for i in order), key=lambda row: row[0])  # shuffled within
        ca, cb = _columns_with_calls(rows_a), _columns_with_calls(rows_b)
        want = _call_reference(ca, cb)
        assert want is None or ops_b != ops or outs_b != outs
        for block in (1, 3, 1 << 20):
            assert storage.first_difference(ca, cb, block, order="call") == want, (trial, block)


# ------------------------------------------------------------------ read without nddebug


def _doc_reader() -> str:
    text = (Path(ROOT) / "docs" / "format.md").read_text()
    match = re.search(r"<!-- reader-v3 -->\s*```python\n(.*?)```", text, re.S)
    assert match, "docs/format.md lost its format-3 reader"
    return match.group(1)


def test_the_reader_in_docs_format_md_reads_a_file_without_nddebug(real_runs, tmp_path):
    path = tmp_path / "doc.nddebug"
    storage.save(real_runs, str(path))
    script = tmp_path / "reader.py"
    script.write_text(_doc_reader())
    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(path, work / "runs.nddebug")
    done = subprocess.run(
        [sys.executable, "-I", str(script), "runs.nddebug"],
        capture_output=True,
        text=True,
        cwd=work,
        timeout=120,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, done.stderr
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["label"] for r in runs] == [r.label for r in real_runs]
    for got, rec in zip(runs, real_runs, strict=True):
        want = [[ev.seq, ev.op_id, ev.call, ev.digests, ev.inputs, ev.reruns] for ev in rec.events]
        assert got["events"] == json.loads(json.dumps(want))


def test_every_flipped_bit_of_a_chunk_is_damage_never_another_run(tmp_path):
    """The arrays hold small numbers raw (an op id, a count): a flipped bit there loaded as
    another run, and the report moved the first divergence to another op and step. A check
    at the end of each chunk's data covers its bytes and the row's other columns."""
    path = tmp_path / "flips.nddebug"
    rec = _small_run("flips", n=40)
    rec.events = [Event(i, 0, i + i // 7, [(i, -i)], [(i, i)], None) for i in range(40)]
    storage.save([rec], str(path))
    assert nddebug.load(str(path))[0].events == rec.events
    with sqlite3.connect(path) as con:
        data, first_seq = con.execute("SELECT data, first_seq FROM chunks").fetchone()
    assert data[-8:-4] == b"ndcr"  # bound to its run (format 4)
    silent = []
    for position in range(len(data)):
        for bit in (0, 5):
            bad = bytearray(data)
            bad[position] ^= 1 << bit
            with sqlite3.connect(path) as con:
                con.execute("UPDATE chunks SET data = ?", (bytes(bad),))
            try:
                nddebug.load(str(path))
            except nddebug.RecordingFileError as exc:
                assert "\n" not in str(exc)
            else:
                silent.append((position, bit))
    assert not silent, f"flips that loaded without an error: {silent[:10]}"
    with sqlite3.connect(path) as con:
        con.execute("UPDATE chunks SET data = ?, first_seq = ?", (data, first_seq + 1))
    with pytest.raises(nddebug.RecordingFileError, match="check does not match"):
        nddebug.load(str(path))


def test_chunks_written_before_the_check_still_load(tmp_path):
    """A chunk whose data ends with its arrays (files written before the check) loads as it
    did; bytes after the arrays that are not a check are damage."""
    path = tmp_path / "old.nddebug"
    rec = _small_run("old", n=20)
    storage.save([rec], str(path))
    with sqlite3.connect(path) as con:
        (data,) = con.execute("SELECT data FROM chunks").fetchone()
        con.execute("UPDATE chunks SET data = ?", (data[:-8],))
    assert nddebug.load(str(path))[0].events == rec.events
    with sqlite3.connect(path) as con:
        con.execute("UPDATE chunks SET data = ?", (data[:-8] + b"junk",))
    with pytest.raises(nddebug.RecordingFileError, match="not a check"):
        nddebug.load(str(path))


def test_a_run_still_being_written_is_not_said_to_have_raised(tmp_path) -> None:
    """`nddebug report` on a file a long run streams to: the open run reads "interrupted",
    and the report said it "ended with an exception inside the block" (probe round 45, F2).
    A run whose block raised still says so."""
    x = tf.constant(np.ones([4, 4], np.float32))
    runs = []
    for label in ("a", "b"):
        with nddebug.trace(label=label) as rec:
            tf.matmul(x, x)
        runs.append(rec)
    path = tmp_path / "live.nddebug"
    storage.save([runs[0]], str(path))
    header = dataclasses.replace(runs[1], ops={}, events=[])
    writer = storage.RunWriter(str(path), header)
    writer.append(runs[1].events, runs[1].ops)  # the second run is still being written
    notes = " ".join(str(nddebug.compare(nddebug.load(str(path)))).split())
    assert "run(s) [1] were not closed in their file" in notes, notes
    assert "exception" not in notes, notes
    raised = dataclasses.replace(runs[1], status="interrupted")
    notes = " ".join(str(nddebug.compare([runs[0], raised])).split())
    assert "run(s) [1] ended with an exception inside the block" in notes, notes
