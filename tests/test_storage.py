"""The recording file (nddebug.storage): round trip, appending, crash safety, bad files, no
pickle, and loading/comparing/rendering without TensorFlow. Real TensorFlow, real SQLite files,
real subprocesses; no mocks."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug import digest as dg
from nddebug import storage
from nddebug.recording import Event, OpInfo, Recording

ROOT = Path(__file__).resolve().parents[1]


def python_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


# ------------------------------------------------------------------ recordings to store


class _Stop(Exception):
    pass


@pytest.fixture(scope="module")
def real_runs() -> list[Recording]:
    """Real traces: eager ops and a tf.function with an unseeded random op (so the two runs
    differ), an interrupted run, and a run with warnings."""
    x = tf.constant(np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4))

    @tf.function
    def step(a):
        h = tf.nn.relu(tf.matmul(a, a, transpose_b=True))
        return tf.reduce_sum(h) + tf.random.uniform([])

    runs = []
    for i in range(2):
        with nddebug.trace(label=f"run {i}") as rec:
            y = x * 2.0 - 1.0
            positive = y > 0.0  # bool output
            half = tf.cast(y, tf.float16) * tf.constant(0.5, tf.float16)
            step(y)
            tf.reduce_sum(tf.cast(positive, tf.int64))
            del half
        runs.append(rec)

    with pytest.raises(_Stop), nddebug.trace(label="interrupted") as interrupted:
        x + 1.0
        raise _Stop
    runs.append(interrupted)

    @tf.function
    def traced_before(a):
        return a * 3.0

    traced_before(x)  # traced outside trace(): runs uninstrumented inside it (a warning)
    with nddebug.trace(label="with warnings") as warned:
        traced_before(x)
    runs.append(warned)
    return runs


def test_real_runs_are_what_the_tests_need(real_runs):
    r0, r1, interrupted, warned = real_runs
    assert len(r0.events) == len(r1.events) >= 8
    assert {op.graph for op in r0.ops.values()} > {""}  # eager and graph ops
    assert any(e.digests != f.digests for e, f in zip(r0.events, r1.events, strict=True))
    assert any(op.dtypes == ["bool"] for op in r0.ops.values())
    assert any(op.dtypes == ["float16"] for op in r0.ops.values())
    assert any(e.shapes is None for e in r0.events) and any(e.shapes for e in r0.events)
    assert interrupted.status == "interrupted" and interrupted.events
    assert any("uninstrumented" in w for w in warned.warnings)
    assert all(r.digest_algorithm == dg.ALGORITHM for r in real_runs)


def captured_values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "0:0": rng.standard_normal((3, 5)).astype(np.float16),
        "1:0": rng.integers(0, 2, (4, 2)).astype(bool),
        "2:0": np.float32(-0.0).reshape(()),  # 0-d, negative zero
        "3:0": np.zeros((0, 3), np.int64),
        "4:0": (rng.standard_normal(6) + 1j * rng.standard_normal(6)).astype(np.complex64),
        "5:0": np.asfortranarray(rng.standard_normal((3, 4))),
        "6:1": np.array([np.nan, np.inf, -np.inf, 1e-45], np.float32),
        "7:0": np.arange(256, dtype=np.uint8),
    }


def synthetic(label: str = "synthetic", n_events: int = 6, seq0: int = 0) -> Recording:
    """Every field set, with awkward values: extreme int64 digests, None digests, unknown dims,
    unicode and quotes, captured values of several dtypes."""
    rec = Recording(
        label=label,
        digest_algorithm=dg.ALGORITHM,
        status="interrupted",
        kind="capture",
        environment={"nested": {"list": [1, 2.5, None, True]}, "devices": ["/device:CPU:0"]},
        warnings=["first", "quotes ' \" and ünïcode ✓", ""],
        values=captured_values(),
    )
    rec.ops[7] = OpInfo(
        op_id=7,
        key="f/While/body/AssignAddVariableOp#1",
        op_type="AssignAddVariableOp",
        op_name="While/body/AssignAddVariableOp",
        graph="f",
        device="/job:localhost/replica:0/task:0/device:CPU:0",
        location="tränïng.py:12 (step)",
        dtypes=["float32", "resource"],
        shapes=[[None, 4], None],
        digestible=[True, False],
        stateful=True,
        attrs={"seed": 0, "seed2": 87654321},
        note="value of the variable after this update",
        resource="dense/kernel:0",
        function="instrumented",
        rerun="stateful",
        written=["dense/kernel:0"],
        fused={"f/While/body/Sqrt": "Sqrt", 'f/While/body/tränïng "q"': "Mul"},
    )
    rec.ops[3] = OpInfo(
        op_id=3,
        key="eager:Mul@x.py:1 (<module>)",
        op_type="Mul",
        op_name="",
        graph="",
        device="",
        location="",
        dtypes=["float32", "float32"],
        shapes=[[], [2, 3]],
        digestible=[True, True],
    )
    for i in range(n_events):
        seq = seq0 + i
        if i % 2:
            rec.events.append(
                Event(seq=seq, op_id=7, call=-1, digests=[(2**63 - 1, -(2**63)), None])
            )
        else:
            rec.events.append(
                Event(
                    seq=seq,
                    op_id=3,
                    call=seq,
                    digests=[(i, -i), (0, 0)],
                    inputs=[(-1, 1), (2**63 - 1, 0)],
                    shapes=[[], [2, 3]],
                    reruns=[[(i, -i), None], [(i + 1, 2**63 - 1), (0, 0)]],
                )
            )
    return rec


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def test_synthetic_recording_sets_every_optional_field():
    """Guards the round-trip tests: a field added to the data model must be given a
    non-default value in synthetic(), or its round trip would go untested."""
    rec = synthetic()
    groups = {Recording: [rec], OpInfo: list(rec.ops.values()), Event: rec.events}
    for cls, objs in groups.items():
        for f in dataclasses.fields(cls):
            default = _default(f)
            if default is dataclasses.MISSING or f.name == "run_id":
                continue
            if f.metadata.get("saved") is False:
                continue  # where this process keeps the run, not part of it
            assert any(getattr(o, f.name) != default for o in objs), (
                f"synthetic() leaves {cls.__name__}.{f.name} at its default: set it"
            )


def assert_same_run(loaded: Recording, original: Recording) -> None:
    assert loaded.run_id == original.run_id
    assert loaded.label == original.label
    assert loaded.status == original.status
    assert loaded.kind == original.kind
    assert loaded.digest_algorithm == original.digest_algorithm
    assert loaded.environment == original.environment
    assert loaded.warnings == original.warnings
    assert loaded.ops == original.ops
    assert loaded.events == original.events
    assert sorted(loaded.values) == sorted(original.values)
    for name, value in original.values.items():
        got = loaded.values[name]
        want = np.asarray(value)
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), name  # bit for bit


def assert_names_file(exc: pytest.ExceptionInfo, path: Path) -> None:
    assert str(path) in str(exc.value)


# ------------------------------------------------------------------ round trip


def test_round_trip_of_real_recordings(real_runs, tmp_path):
    path = tmp_path / "runs.ndd"
    # The first run also holds full values, as the capture pass of check() stores them.
    runs = [dataclasses.replace(real_runs[0], values=captured_values()), *real_runs[1:]]
    for rec in runs:
        rec.save(str(path))
    loaded = nddebug.load(str(path))
    assert [r.label for r in loaded] == ["run 0", "run 1", "interrupted", "with warnings"]
    for got, want in zip(loaded, runs, strict=True):
        assert_same_run(got, want)
    assert loaded[2].status == "interrupted"
    assert loaded[0].values["1:0"].dtype == np.bool_
    assert loaded[0].values["0:0"].dtype == np.float16
    assert np.signbit(loaded[0].values["2:0"])


def test_round_trip_of_edge_case_fields(tmp_path):
    path = tmp_path / "edge.ndd"
    rec = synthetic()
    empty = Recording(label="", digest_algorithm=dg.ALGORITHM)  # no ops, no events
    storage.save([rec, empty], str(path))
    loaded = nddebug.load(str(path))
    assert len(loaded) == 2
    assert_same_run(loaded[0], rec)
    assert_same_run(loaded[1], empty)
    assert loaded[0].events[1].digests == [(2**63 - 1, -(2**63)), None]
    assert loaded[0].ops[7].shapes == [[None, 4], None]


def test_loaded_recordings_compare_like_the_originals(real_runs, tmp_path):
    path = tmp_path / "cmp.ndd"
    storage.save(real_runs[:2], str(path))
    before = nddebug.compare(real_runs[:2])
    after = nddebug.compare(nddebug.load(str(path)))
    assert not before.ok
    assert str(after) == str(before)
    assert after.culprits.equals(before.culprits)


def test_round_trip_of_ml_dtypes_captured_values(tmp_path):
    # .npy has no bfloat16/float8: np.save alone would write raw void 'V2' (this was a bug).
    path = tmp_path / "bf16.ndd"
    rec = synthetic()
    rec.values = {
        "0:0": np.array([1.5, -0.0, 3.0, np.nan], ml_dtypes.bfloat16),
        "1:0": np.array([[0.5, -2.0]], ml_dtypes.float8_e4m3fn),
    }
    rec.save(str(path))
    (loaded,) = nddebug.load(str(path))
    assert_same_run(loaded, rec)


def test_check_report_with_bfloat16_captures_survives_save_and_load(tmp_path):
    x = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))

    @tf.function
    def step(a):
        noise = tf.random.uniform([3, 4], dtype=tf.bfloat16)
        return tf.reduce_sum(tf.cast(a, tf.bfloat16) * noise)

    report = nddebug.check(step, x, repeats=2)
    assert len(report.captures) == 2
    path = tmp_path / "bf16-check.ndd"
    report.save(str(path))
    again = nddebug.compare(nddebug.load(str(path)))
    cols = ["op_type", "role", "max_abs_diff", "max_ulp"]
    assert again.culprits[cols].equals(report.culprits[cols])


# ------------------------------------------------------------------ appending


def test_appending_keeps_order_and_never_duplicates(tmp_path):
    path = str(tmp_path / "append.ndd")
    a, b, c, d = (synthetic(label=name, seq0=10 * i) for i, name in enumerate("abcd"))
    a.save(path)
    storage.save([b, c], path)
    a.save(path)  # already in the file: not written again
    storage.save([c, d, b], path)  # c and b already there; d is new
    loaded = nddebug.load(path)
    assert [r.label for r in loaded] == ["a", "b", "c", "d"]
    for got, want in zip(loaded, [a, b, c, d], strict=True):
        assert_same_run(got, want)
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 4
        assert con.execute("SELECT SUM(events) FROM chunks").fetchone()[0] == 4 * len(a.events)


def test_report_save_writes_every_run(real_runs, tmp_path):
    path = tmp_path / "report.ndd"
    report = nddebug.compare(real_runs[:2])
    report.save(str(path))
    loaded = nddebug.load(str(path))
    assert [r.run_id for r in loaded] == [r.run_id for r in real_runs[:2]]
    for got, want in zip(loaded, real_runs[:2], strict=True):
        assert_same_run(got, want)
    report.save(str(path))  # saving the same report again adds nothing
    assert len(nddebug.load(str(path))) == 2


@pytest.fixture(scope="module")
def check_report() -> nddebug.Report:
    """A real check() of a step with an unseeded random op: two compared runs and two capture
    runs holding the divergent ops' full values."""
    x = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))

    @tf.function
    def step(a):
        return tf.reduce_sum(a * tf.random.uniform([3, 4]))

    report = nddebug.check(step, x, repeats=2)
    assert not report.ok and len(report.captures) == 2
    assert all(r.values for r in report.captures)
    return report


def test_report_save_writes_captures_too(check_report, tmp_path):
    path = tmp_path / "check.ndd"
    check_report.save(str(path))
    loaded = nddebug.load(str(path))
    originals = check_report.recordings + check_report.captures
    assert [r.label for r in loaded] == [r.label for r in originals]
    for got, want in zip(loaded, originals, strict=True):
        assert_same_run(got, want)
    again = nddebug.compare(loaded)
    cols = ["op_type", "role", "kind", "max_abs_diff", "max_ulp", "frac_differing"]
    assert again.culprits[cols].equals(check_report.culprits[cols])
    assert again.culprits["max_abs_diff"].notna().any()


# ------------------------------------------------------------------ crash safety


_BIG_WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from nddebug import storage
    from nddebug.recording import Event, OpInfo, Recording

    rec = Recording(label="big", digest_algorithm="x")
    rec.ops[0] = OpInfo(op_id=0, key="k", op_type="T", op_name="", graph="", device="",
                        location="", dtypes=["float32"], shapes=[[1]], digestible=[True])
    rec.events = [Event(seq=i, op_id=0, call=i, digests=[(i, -i)], inputs=[(i, i)],
                        shapes=[[1]]) for i in range(60_000)]
    for k in range(40):
        rec.values[f"{k}:0"] = np.full(1 << 18, k, np.float32)
    print("writing", flush=True)
    storage.save([rec], sys.argv[1])
    print("done", flush=True)
    """
)


def test_run_killed_mid_write_leaves_earlier_runs_intact(tmp_path):
    path = tmp_path / "crash.ndd"
    journal = Path(str(path) + "-journal")
    first, second = synthetic("first"), synthetic("second")
    storage.save([first, second], str(path))
    size_before = path.stat().st_size

    child = subprocess.Popen(
        [sys.executable, "-c", _BIG_WRITER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=python_env(),
    )
    try:
        deadline = time.monotonic() + 60
        # Kill once the run's transaction has started (rollback journal present) and has
        # already spilled uncommitted pages into the database file itself.
        while not (journal.exists() and path.stat().st_size > size_before):
            if child.poll() is not None:
                pytest.fail(
                    "the writer finished before it could be killed: "
                    + child.stderr.read().decode()[-2000:]
                )
            assert time.monotonic() < deadline, "the writer never started writing"
            time.sleep(0.002)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    out = child.stdout.read().decode()
    child.stdout.close()
    child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    assert "writing" in out and "done" not in out
    assert journal.exists(), "no hot journal: the kill did not interrupt a transaction"
    assert path.stat().st_size > size_before  # the file holds part of the killed run

    loaded = nddebug.load(str(path))
    assert [r.label for r in loaded] == ["first", "second"]
    assert_same_run(loaded[0], first)
    assert_same_run(loaded[1], second)
    # The file is still appendable, and the third run lands after the survivors.
    third = synthetic("third")
    third.save(str(path))
    assert [r.label for r in nddebug.load(str(path))] == ["first", "second", "third"]


def test_truncated_file_is_an_error_never_a_partial_run(tmp_path):
    path = tmp_path / "full.ndd"
    runs = [synthetic(f"run {i}", n_events=400, seq0=1000 * i) for i in range(3)]
    runs[2].values = {"0:0": np.arange(20_000, dtype=np.float32)}  # overflow pages
    storage.save(runs[:2], str(path))
    size_after_two = path.stat().st_size
    storage.save(runs[2:], str(path))
    data = path.read_bytes()
    assert len(nddebug.load(str(path))) == 3

    rng = np.random.default_rng(1)
    page = 4096
    cuts = {0, 1, 100, size_after_two, size_after_two - 1, len(data) - 1, len(data) // 2}
    cuts |= set(range(page, len(data), page))
    cuts |= {int(c) for c in rng.integers(1, len(data), 150)}
    cut_path = tmp_path / "cut.ndd"
    for cut in sorted(cuts):
        cut_path.write_bytes(data[:cut])
        with pytest.raises(nddebug.RecordingFileError) as exc:
            loaded = nddebug.load(str(cut_path))
            pytest.fail(f"cut at {cut}/{len(data)} loaded {[len(r.events) for r in loaded]}")
        assert_names_file(exc, cut_path)
        assert not isinstance(exc.value, sqlite3.Error)


# ------------------------------------------------------------------ not a recording


def _write_sqlite(path: Path, statements: list[str]) -> None:
    con = sqlite3.connect(path)
    with con:
        for statement in statements:
            con.execute(statement)
    con.close()


def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path, a phrase the error must contain)"""
    text = tmp_path / "notes.txt"
    text.write_text("epoch 1: loss 0.25\n" * 200)
    empty = tmp_path / "empty.ndd"
    empty.write_bytes(b"")
    foreign = tmp_path / "foreign.sqlite"
    _write_sqlite(foreign, ["CREATE TABLE users (name TEXT)", "INSERT INTO users VALUES ('x')"])
    other_meta = tmp_path / "other-meta.sqlite"
    _write_sqlite(
        other_meta,
        [
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            "INSERT INTO meta VALUES ('format', 'somebody-elses-format')",
        ],
    )
    newer = tmp_path / "newer.ndd"
    synthetic().save(str(newer))
    _write_sqlite(
        newer,
        [f"UPDATE meta SET value = '{storage.FORMAT_VERSION + 1}' WHERE key = 'format_version'"],
    )
    return {
        "text": (text, "not"),
        "empty": (empty, "not"),
        "sqlite-without-meta": (foreign, "not"),
        "other-format": (other_meta, "not an nddebug recording"),
        "newer-version": (newer, "newer"),
        "missing": (tmp_path / "missing.ndd", "no such"),
        "directory": (tmp_path, "is a folder: name a recording file in it"),
    }


@pytest.mark.parametrize(
    "kind",
    [
        "text",
        "empty",
        "sqlite-without-meta",
        "other-format",
        "newer-version",
        "missing",
        "directory",
    ],
)
def test_loading_what_is_not_a_recording_is_a_clear_error(tmp_path, kind):
    path, phrase = _bad_files(tmp_path)[kind]
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(nddebug.RecordingFileError) as exc:
        nddebug.load(str(path))
    assert_names_file(exc, path)
    assert phrase in str(exc.value)
    assert isinstance(exc.value, nddebug.NddebugError)
    if before is not None:
        assert path.read_bytes() == before  # loading never writes to a file that is not ours
    else:
        assert path.is_dir() or not path.exists()


def test_newer_version_message_says_what_to_do(tmp_path):
    path, _ = _bad_files(tmp_path)["newer-version"]
    with pytest.raises(nddebug.RecordingFileError) as exc:
        nddebug.load(str(path))
    message = str(exc.value)
    assert str(storage.FORMAT_VERSION + 1) in message and "upgrade" in message


@pytest.mark.parametrize("kind", ["text", "newer-version", "other-format"])
def test_appending_to_what_is_not_a_recording_is_refused(tmp_path, kind):
    path, _ = _bad_files(tmp_path)[kind]
    before = path.read_bytes()
    with pytest.raises(nddebug.RecordingFileError) as exc:
        synthetic().save(str(path))
    assert_names_file(exc, path)
    assert path.read_bytes() == before


def test_appending_to_a_foreign_sqlite_database_is_refused(tmp_path):
    path, _ = _bad_files(tmp_path)["sqlite-without-meta"]
    with pytest.raises(nddebug.RecordingFileError) as exc:
        synthetic().save(str(path))
    assert_names_file(exc, path)
    with sqlite3.connect(path) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"users"}


def test_appending_to_a_file_with_a_garbled_version_is_a_recording_file_error(tmp_path):
    path = tmp_path / "garbled.ndd"
    synthetic().save(str(path))
    _write_sqlite(path, ["UPDATE meta SET value = 'one' WHERE key = 'format_version'"])
    with pytest.raises(nddebug.RecordingFileError) as load_exc:
        nddebug.load(str(path))
    assert_names_file(load_exc, path)
    with pytest.raises(nddebug.RecordingFileError) as exc:
        synthetic("second").save(str(path))
    assert_names_file(exc, path)


@pytest.mark.parametrize(
    "statement, phrase",
    [
        ("DELETE FROM meta WHERE key = 'format_version'", "has no format_version"),
        ("UPDATE meta SET value = '-1' WHERE key = 'format_version'", "format_version is -1"),
    ],
)
def test_a_missing_or_impossible_version_is_damage_and_the_file_stays(tmp_path, statement, phrase):
    """Both loaded as if they were fine (a missing version read as 0)."""
    path = tmp_path / "versionless.ndd"
    synthetic().save(str(path))
    _write_sqlite(path, [statement])
    before = path.read_bytes()
    with pytest.raises(nddebug.RecordingFileError, match=phrase) as exc:
        nddebug.load(str(path))
    assert_names_file(exc, path)
    assert path.read_bytes() == before


def test_a_symbolic_link_loop_is_named_as_one(tmp_path):
    """It read "no such recording file", the path being there."""
    (tmp_path / "a.ndd").symlink_to(tmp_path / "b.ndd")
    (tmp_path / "b.ndd").symlink_to(tmp_path / "a.ndd")
    with pytest.raises(nddebug.RecordingFileError, match=r"symbolic link to .*b\.ndd"):
        nddebug.load(str(tmp_path / "a.ndd"))


def test_saving_into_a_missing_directory_is_a_recording_file_error(tmp_path):
    path = tmp_path / "no-such-dir" / "runs.ndd"
    with pytest.raises(nddebug.RecordingFileError) as exc:
        synthetic().save(str(path))
    assert_names_file(exc, path)


def test_an_empty_file_can_become_a_recording(tmp_path):
    # e.g. a path made by tempfile.mkstemp(): an empty file is an empty SQLite database.
    path = tmp_path / "made-by-mkstemp.ndd"
    path.write_bytes(b"")
    rec = synthetic()
    rec.save(str(path))
    (loaded,) = nddebug.load(str(path))
    assert_same_run(loaded, rec)


# ------------------------------------------------------------------ no pickle


class _Payload:
    """Unpickling this creates ``marker``: proof that a pickle was executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _pickled_npy(marker: Path) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array([_Payload(marker), None], dtype=object), allow_pickle=True)
    return buf.getvalue()


def test_a_pickled_captured_value_is_refused_not_executed(tmp_path):
    # The payload is live: numpy with pickles allowed runs it.
    probe = tmp_path / "probe-marker"
    np.load(io.BytesIO(_pickled_npy(probe)), allow_pickle=True)
    assert probe.exists()

    path = tmp_path / "crafted.ndd"
    rec = synthetic()
    rec.values = {"0:0": np.arange(4, dtype=np.float32)}
    rec.save(str(path))
    marker = tmp_path / "pwned"
    con = sqlite3.connect(path)
    with con:
        changed = con.execute(
            "UPDATE captured SET npy = ? WHERE run_id = ? AND name = '0:0'",
            (_pickled_npy(marker), rec.run_id),
        ).rowcount
    con.close()
    assert changed == 1
    with pytest.raises(nddebug.RecordingFileError) as exc:
        nddebug.load(str(path))
    assert_names_file(exc, path)
    assert not marker.exists(), "loading a recording executed a pickle"


def test_an_object_array_cannot_be_captured_silently(tmp_path):
    path = tmp_path / "objects.ndd"
    first = synthetic("first")
    first.save(str(path))
    bad = synthetic("objects")
    bad.values = {"0:0": np.array([{"a": 1}, None], dtype=object)}
    with pytest.raises(nddebug.RecordingFileError) as exc:
        bad.save(str(path))
    assert "object" in str(exc.value).lower()
    # Nothing of the refused run is in the file; the earlier run is intact.
    loaded = nddebug.load(str(path))
    assert [r.label for r in loaded] == ["first"]
    assert_same_run(loaded[0], first)
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT SUM(events) FROM chunks").fetchone()[0] == len(first.events)


def test_every_captured_blob_is_a_plain_npy(check_report, tmp_path):
    path = tmp_path / "blobs.ndd"
    rec = synthetic()
    storage.save([rec, *check_report.captures], str(path))
    with sqlite3.connect(path) as con:
        blobs = con.execute("SELECT name, npy FROM captured").fetchall()
    assert len(blobs) == len(rec.values) + sum(len(r.values) for r in check_report.captures)
    for name, blob in blobs:
        f = io.BytesIO(blob)
        version = np.lib.format.read_magic(f)
        read_header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        _shape, _fortran, dtype = read_header(f)
        assert not dtype.hasobject, name
        np.load(io.BytesIO(blob), allow_pickle=False)


# ------------------------------------------------------------------ without TensorFlow


_NO_TF = textwrap.dedent(
    """
    import json
    import sys

    sys.modules["tensorflow"] = None  # any `import tensorflow` now raises ImportError
    import nddebug

    out = {}
    for name, path in [("traced", sys.argv[1]), ("check", sys.argv[2])]:
        runs = nddebug.load(path)
        report = nddebug.compare(runs[:2] if name == "traced" else runs)
        out[name] = {
            "runs": len(runs),
            "ok": report.ok,
            "text": str(report),
            "html": report._repr_html_(),
            "culprits": report.culprits.to_json(),
        }
    try:
        import tensorflow  # noqa: F401
        out["tensorflow_importable"] = True
    except ImportError:
        out["tensorflow_importable"] = False
    out["tf_modules"] = sorted(m for m in sys.modules if m.startswith("tensorflow."))
    print(json.dumps(out))
    """
)


def test_load_compare_and_render_without_tensorflow(real_runs, check_report, tmp_path):
    traced = tmp_path / "traced.ndd"
    storage.save(real_runs, str(traced))
    checked = tmp_path / "check.ndd"
    check_report.save(str(checked))

    done = subprocess.run(
        [sys.executable, "-c", _NO_TF, str(traced), str(checked)],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["tensorflow_importable"] is False
    assert out["tf_modules"] == []

    # Same results as with TensorFlow loaded, from the same files.
    expected = {
        "traced": nddebug.compare(nddebug.load(str(traced))[:2]),
        "check": nddebug.compare(nddebug.load(str(checked))),
    }
    for name, report in expected.items():
        got = out[name]
        assert got["ok"] is report.ok is False
        assert got["text"] == str(report)
        assert got["html"] == report._repr_html_()
        assert got["culprits"] == report.culprits.to_json()
        assert "source" in got["text"]
    assert out["traced"]["runs"] == len(real_runs)
    assert out["check"]["runs"] == 4
