"""Bad files get a clear error and lose nothing: recording files created by several processes
at once or half-created by a killed one, recordings with inconsistent rows, a damaged native
library in the cache, and a ``%%nddebug -o`` that cannot be written. Real SQLite files, real
subprocesses, real TensorFlow where TensorFlow is involved; no mocks."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import nddebug
from nddebug import storage
from nddebug.recording import Event, OpInfo, Recording
from tests.helpers import CPU_ONLY, ROOT, run_python, subprocess_env


def small(label: str, n_events: int = 3) -> Recording:
    """A small synthetic run (no TensorFlow needed)."""
    rec = Recording(label=label, digest_algorithm="test", environment={"python": "3"})
    key, where = "eager:Mul@x.py:1 (f)", "x.py:1 (f)"
    rec.ops[0] = OpInfo(0, key, "Mul", "", "", "CPU", where, ["float32"], [[2]], [True])
    rec.events = [
        Event(seq=i, op_id=0, call=i, digests=[(i, -i)], inputs=[(1, 2)], shapes=[[2]])
        for i in range(n_events)
    ]
    return rec


# What a child process needs to make such runs: nddebug.storage and nddebug.recording only.
_SMALL = (
    "from nddebug import storage\n"
    "from nddebug.recording import Event, OpInfo, Recording\n" + inspect.getsource(small)
)


# ------------------------------------------------------------------ creation races

_SAVER = textwrap.dedent(
    """
    import json, os, sys, time

    path, go, who, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    runs = [small(f"{who}-{i}") for i in range(n)]
    while not os.path.exists(go):  # all savers start together
        time.sleep(0.001)
    errors = []
    for rec in runs:
        try:
            storage.save([rec], path)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps(errors))
    """
)


def _save_concurrently(path: Path, processes: int = 6, each: int = 10) -> list[str]:
    """``processes`` fresh interpreters (no TensorFlow) each save ``each`` runs to ``path``,
    one save per run, released at the same moment; the errors they met."""
    go = path.with_name(path.name + ".go")
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _SMALL + _SAVER, str(path), str(go), f"p{k}", str(each)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=subprocess_env(),
            cwd=ROOT,
        )
        for k in range(processes)
    ]
    time.sleep(1.0)  # let every child import and wait at the start line
    go.touch()
    errors = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        errors += json.loads(out.strip().splitlines()[-1])
    return errors


@pytest.mark.parametrize("start", ["new path", "empty file", "half-created file"])
def test_six_processes_making_their_first_save_at_once_all_succeed(tmp_path, start):
    path = tmp_path / "shared.nddebug"
    if start == "empty file":  # e.g. made by tempfile.mkstemp
        path.write_bytes(b"")
    elif start == "half-created file":  # an older nddebug killed while creating it
        _half_created(path, n_tables=3)
    errors = _save_concurrently(path)
    assert errors == []
    runs = nddebug.load(str(path))
    assert len(runs) == 60
    assert sorted(r.label for r in runs) == sorted(f"p{k}-{i}" for k in range(6) for i in range(10))
    for k in range(6):  # each process's runs in the order it saved them
        mine = [r.label for r in runs if r.label.startswith(f"p{k}-")]
        assert mine == [f"p{k}-{i}" for i in range(10)]
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".creating")]


_KILLED_AT_LINK = textwrap.dedent(
    """
    import os, signal, sys

    def killed(*args):  # the process dies after the schema is built, before it is in place
        os.kill(os.getpid(), signal.SIGKILL)

    os.link = killed
    storage.save([small("lost")], sys.argv[1])
    """
)


def test_a_process_killed_while_creating_the_file_leaves_nothing_half_made(tmp_path):
    path = tmp_path / "new.nddebug"
    child = subprocess.run(
        [sys.executable, "-c", _SMALL + _KILLED_AT_LINK, str(path)],
        capture_output=True,
        env=subprocess_env(),
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    assert not path.exists()  # never a file without its schema and meta rows
    with pytest.raises(nddebug.RecordingFileError, match="no such recording file"):
        nddebug.load(str(path))
    rec = small("kept")
    rec.save(str(path))
    assert [r.label for r in nddebug.load(str(path))] == ["kept"]


_KILLED_AT_STATEMENT = textwrap.dedent(
    """
    import os, signal, sqlite3, sys

    # Count every SQL statement of every connection the save opens; die as statement N starts.
    n, count = int(sys.argv[2]), [0]
    connect = sqlite3.connect

    def traced(*args, **kwargs):
        con = connect(*args, **kwargs)
        con.set_trace_callback(step)
        return con

    def step(sql):
        count[0] += 1
        if count[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)

    sqlite3.connect = traced
    storage.save([small("first")], sys.argv[1])
    print("saved", flush=True)
    """
)


def test_a_first_save_killed_between_any_two_statements_leaves_a_whole_file_or_none(tmp_path):
    """Kill the first save as its 1st, 2nd, 3rd … SQL statement starts (temporary file,
    schema, meta rows, the run): the path is then absent, or a recording that loads (without
    the run) and takes further runs."""
    outcomes = []
    n = 0
    while not outcomes or outcomes[-1] != "finished":
        batch = []
        for _ in range(4):  # a few children at a time
            n += 1
            path = tmp_path / f"kill{n}.nddebug"
            child = subprocess.Popen(
                [sys.executable, "-c", _SMALL + _KILLED_AT_STATEMENT, str(path), str(n)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=subprocess_env(),
                cwd=ROOT,
            )
            batch.append((path, child))
        for path, child in batch:
            out, err = child.communicate(timeout=120)
            if child.returncode == 0:
                assert out == b"saved\n"
                outcomes.append("finished")
                continue
            assert child.returncode == -signal.SIGKILL, err.decode()[-2000:]
            if not path.exists():
                outcomes.append("absent")
            else:
                runs = nddebug.load(str(path))  # never half-created
                assert [r.label for r in runs] in ([], ["first"])
                outcomes.append(f"{len(runs)} run(s)")
            small("after").save(str(path))  # and it can always be appended to
            assert nddebug.load(str(path))[-1].label == "after"
        assert n < 200, outcomes
    # Both stages were hit: before the file was in place, and after it (run not committed).
    assert {"absent", "0 run(s)"} <= set(outcomes), outcomes
    first_present = outcomes.index("0 run(s)")
    assert set(outcomes[:first_present]) == {"absent"}, outcomes


# ------------------------------------------------------------------ half-created files


def _half_created(path: Path, n_tables: int, run_rows: bool = False) -> None:
    """A file as an older nddebug left it when killed during its first save: it created the
    tables one autocommitted statement at a time, then wrote the meta rows."""
    con = sqlite3.connect(path)
    for statement in storage._STATEMENTS[:n_tables]:
        con.execute(statement)
    if run_rows:
        con.execute(
            "INSERT INTO runs VALUES ('abc', 0, 'kept', 'complete', 'run', 'x', '{}', '[]', 'now')"
        )
    con.commit()
    con.close()


@pytest.mark.parametrize("n_tables", range(len(storage._STATEMENTS) + 1))
def test_a_half_created_file_is_named_so_and_a_save_completes_it(tmp_path, n_tables):
    path = tmp_path / "half.nddebug"
    _half_created(path, n_tables)
    before = path.read_bytes()
    with pytest.raises(nddebug.RecordingFileError) as exc:
        nddebug.load(str(path))
    message = str(exc.value)
    assert str(path) in message and "\n" not in message
    assert ("empty" if n_tables == 0 else "half-created") in message
    assert "holds no runs" in message
    assert path.read_bytes() == before  # loading writes nothing
    storage.check_appendable(str(path))
    rec = small("completed")
    rec.save(str(path))
    (loaded,) = nddebug.load(str(path))
    assert loaded.label == "completed" and loaded.events == rec.events
    with sqlite3.connect(path) as con:
        meta = dict(con.execute("SELECT key, value FROM meta"))
    assert meta["format"] == storage.FORMAT
    assert meta["format_version"] == str(storage.FORMAT_VERSION)


def test_a_half_created_file_that_holds_runs_is_never_reinitialised(tmp_path):
    path = tmp_path / "half-with-runs.nddebug"
    _half_created(path, len(storage._STATEMENTS), run_rows=True)
    before = path.read_bytes()
    with pytest.raises(nddebug.RecordingFileError, match="half-created") as load_exc:
        nddebug.load(str(path))
    assert "will not re-initialise" in str(load_exc.value)
    with pytest.raises(nddebug.RecordingFileError, match="half-created") as save_exc:
        small("new").save(str(path))
    assert str(path) in str(save_exc.value)
    with pytest.raises(nddebug.RecordingFileError, match="half-created"):
        storage.check_appendable(str(path))
    assert path.read_bytes() == before


def test_a_table_named_like_ours_in_someone_elses_database_is_left_alone(tmp_path):
    path = tmp_path / "theirs.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE runs (id INTEGER, started TEXT)")  # not nddebug's columns
    con.commit()
    con.close()
    before = path.read_bytes()
    with pytest.raises(nddebug.RecordingFileError, match="not an nddebug recording"):
        nddebug.load(str(path))
    with pytest.raises(nddebug.RecordingFileError, match="not writing to it"):
        small("x").save(str(path))
    assert path.read_bytes() == before


@pytest.mark.parametrize("content", [b"\n", b"x", b"SQLite for", b"notes about the run\n"])
def test_a_short_file_that_is_not_sqlite_is_refused_not_replaced(tmp_path, content):
    """SQLite takes a file shorter than its header for an empty database: a one-byte note
    given as the output was replaced by a recording. Only a file of no bytes is empty."""
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(nddebug.RecordingFileError, match="not a recording"):
        small("x").save(str(path))
    with pytest.raises(nddebug.RecordingFileError, match="not a recording"):
        storage.check_appendable(str(path))
    with pytest.raises(nddebug.RecordingFileError, match="not a recording"):
        nddebug.load(str(path))
    assert path.read_bytes() == content
    empty = tmp_path / "empty.nddebug"
    empty.write_bytes(b"")
    small("x").save(str(empty))  # a file of no bytes is empty: it becomes the recording
    assert [r.label for r in nddebug.load(str(empty))] == ["x"]


# ------------------------------------------------------------------ damaged rows


@pytest.fixture(scope="module")
def traced_file(tmp_path_factory) -> Path:
    """Two real traced runs (eager ops and a tf.function) in one file."""
    import tensorflow as tf

    @tf.function
    def step(a):
        return tf.reduce_sum(tf.nn.relu(a * 2.0))

    path = tmp_path_factory.mktemp("traced") / "good.nddebug"
    for i in range(2):
        with nddebug.trace(label=f"run {i}", path=str(path)):
            x = tf.constant([[1.0, -2.0], [3.0, -4.0]]) + 1.0
            step(x)
    # The damage below is done to rows of the row format (version 2), which older files keep;
    # damaged chunks of the columnar format are tested in test_storage_compact.py.
    rows = path.with_name("good-v2.nddebug")
    storage.save(nddebug.load(str(path)), str(rows), format_version=2)
    return rows


def _damage(path: Path, statement: str) -> None:
    """Apply one UPDATE/INSERT to the second run's rows (its run_id is bound as ``:run``)."""
    con = sqlite3.connect(path)
    with con:
        (run,) = con.execute("SELECT run_id FROM runs WHERE ordinal = 1").fetchone()
        first_seq = "(SELECT MIN(seq) FROM events WHERE run_id = :run)"
        first_op = "(SELECT MIN(op_id) FROM ops WHERE run_id = :run)"
        statement = statement.replace("FIRST_SEQ", first_seq).replace("FIRST_OP", first_op)
        assert con.execute(statement, {"run": run}).rowcount >= 1, statement
    con.close()


# name -> (the damage, a phrase the error must contain)
DAMAGE = {
    "event of a missing op": (
        "UPDATE events SET op_id = 999999 WHERE run_id = :run AND seq = FIRST_SEQ",
        "names op 999999, which is not in the ops table",
    ),
    "op info a JSON list": (
        "UPDATE ops SET info = json_array(1, 2) WHERE run_id = :run AND op_id = FIRST_OP",
        "op info is a JSON list, not an object",
    ),
    "environment null": (
        "UPDATE runs SET environment = 'null' WHERE run_id = :run",
        "the environment is JSON null, not an object",
    ),
    "warnings an object": (
        "UPDATE runs SET warnings = '{\"a\": 1}' WHERE run_id = :run",
        "not a list of strings",
    ),
    "op info without key": (
        "UPDATE ops SET info = json_remove(info, '$.key') WHERE run_id = :run AND op_id = FIRST_OP",
        "op info lacks the field 'key'",
    ),
    "dtypes a string": (
        "UPDATE ops SET info = json_set(info, '$.dtypes', 'float32') WHERE run_id = :run "
        "AND op_id = FIRST_OP",
        "field 'dtypes' is string",
    ),
    "op id mismatch": (
        "UPDATE ops SET info = json_set(info, '$.op_id', 424242) WHERE run_id = :run "
        "AND op_id = FIRST_OP",
        "info says op_id 424242",
    ),
    "digests a string": (
        "UPDATE events SET digests = '\"abc\"' WHERE run_id = :run AND seq = FIRST_SEQ",
        "not a list of [lo, hi] digests",
    ),
    "digest of three numbers": (
        "UPDATE events SET digests = '[[1, 2, 3]]' WHERE run_id = :run AND seq = FIRST_SEQ",
        "not a list of [lo, hi] digests",
    ),
    "seq as text": (
        "UPDATE events SET seq = 'x' WHERE run_id = :run AND seq = FIRST_SEQ",
        "event seq is string 'x', not an integer",
    ),
    "invalid JSON": (
        "UPDATE ops SET info = '{\"op_id\": ' WHERE run_id = :run AND op_id = FIRST_OP",
        "is not valid JSON",
    ),
    "rerun of a missing event": (
        "INSERT INTO reruns VALUES (:run, 777777, '[[[1, 2]]]')",
        "event seq 777777, which is not in the events table",
    ),
    "unknown status": (
        "UPDATE runs SET status = 'exploded' WHERE run_id = :run",
        "its status is 'exploded', not one of complete, interrupted",
    ),
    "unknown kind": (
        "UPDATE runs SET kind = 'weird' WHERE run_id = :run",
        "its kind is 'weird', not one of run, rerun, capture",
    ),
    "garbled captured value": (
        "INSERT INTO captured VALUES (:run, '0:0', 'float32', x'00010203')",
        "not a readable .npy array",
    ),
}


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_a_damaged_row_is_a_recording_file_error_naming_the_run(traced_file, tmp_path, name):
    statement, phrase = DAMAGE[name]
    path = tmp_path / "damaged.nddebug"
    shutil.copy(traced_file, path)
    _damage(path, statement)
    with pytest.raises(nddebug.RecordingFileError) as exc:
        nddebug.load(str(path))
    message = str(exc.value)
    assert message.startswith(f"{path}: damaged: "), message
    assert phrase in message, message
    assert "run 2 of 2 (label 'run 1'" in message and "\n" not in message
    # Nothing else is lost: the whole run reads back, and saves into a new file.
    whole, problems = storage.salvage(str(path))
    assert [r.label for r in whole] == ["run 0"] and len(problems) == 1
    assert whole[0].events == nddebug.load(str(traced_file))[0].events
    storage.save(whole, str(tmp_path / "recovered.nddebug"))
    assert len(nddebug.load(str(tmp_path / "recovered.nddebug"))) == 1


_RUN1 = "WHERE run_id = (SELECT run_id FROM runs WHERE label = 'run 1')"


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize(
    ("what", "statement"),
    [
        ("an op's type", "UPDATE ops SET info = replace(info, '\"Relu\"', '\"Relv\"') " + _RUN1),
        ("an op's key", "UPDATE ops SET info = replace(info, '\"key\": ', '\"key\": 3') " + _RUN1),
        ("a run's label", "UPDATE runs SET label = 'run 7' WHERE label = 'run 1'"),
        ("a run's warnings", "UPDATE runs SET warnings = '[\"x\"]' WHERE label = 'run 1'"),
        # Text that is not UTF-8: SQLite's reader, not the row check, fails on it, and it made
        # the whole file unreadable, salvage() included (probe round 40, F1).
        ("an op's info, not UTF-8", "UPDATE ops SET info = CAST(x'ff' AS TEXT) || info " + _RUN1),
        (
            "a run's environment, not UTF-8",
            "UPDATE runs SET environment = CAST(x'fe' AS TEXT) || environment "
            "WHERE label = 'run 1'",
        ),
        (
            "a run's label, not UTF-8",
            "UPDATE runs SET label = label || CAST(x'ff' AS TEXT) WHERE label = 'run 1'",
        ),
    ],
)
def test_a_changed_byte_in_an_op_or_run_row_is_damage(traced_file, tmp_path, fmt, what, statement):
    """An op's key or type, or a run's label, read back with a byte changed: a bit flipped in
    the ops table (no check covered it) became another op, and the report another verdict
    with exit code 1 and no word of damage (probe round 32, F2: 4 of 460 flips)."""
    path = tmp_path / "damaged.nddebug"
    storage.save(nddebug.load(str(traced_file)), str(path), format_version=fmt)
    con = sqlite3.connect(path)
    with con:
        assert con.execute(statement).rowcount >= 1, statement
    con.close()
    with pytest.raises(nddebug.RecordingFileError, match="a byte changed"):
        nddebug.load(str(path))
    # The other run is whole and reads back, and the damaged one is named.
    whole, problems = storage.salvage(str(path))
    assert [r.label for r in whole] == ["run 0"] and len(problems) == 1, problems
    assert "run 2 of 2 (label 'run " in problems[0] and "\n" not in problems[0], problems


@pytest.mark.parametrize("table", ["chunks", "ops"])
def test_a_row_moved_from_one_run_to_another_is_damage(traced_file, tmp_path, table) -> None:
    """Run 1's chunk (or op) rows replaced by copies of run 0's, with run 1's run_id: each
    row's check held, so the file read back as two equal runs, "reproducible" where they
    differed (probe round 35, finding 9). In format 4 the checks cover the run_id."""
    path = tmp_path / "moved.nddebug"
    storage.save(nddebug.load(str(traced_file)), str(path))
    con = sqlite3.connect(path)
    with con:
        first, second = [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY ordinal")]
        columns = [r[1] for r in con.execute(f"PRAGMA table_info({table})")][1:]
        con.execute(f"DELETE FROM {table} WHERE run_id = ?", (second,))
        con.execute(
            f"INSERT INTO {table} SELECT ?, {', '.join(columns)} FROM {table} WHERE run_id = ?",
            (second, first),
        )
    con.close()
    with pytest.raises(nddebug.RecordingFileError, match="moved from another run"):
        nddebug.load(str(path))
    whole, problems = storage.salvage(str(path))
    assert [r.run_id for r in whole] == [first] and len(problems) == 1


def test_rows_written_without_a_check_still_read(traced_file, tmp_path) -> None:
    """Files written before rows had checks (and rows SQLite rewrote) read as they are."""
    path = tmp_path / "old.nddebug"
    shutil.copy(traced_file, path)
    con = sqlite3.connect(path)
    with con:
        con.execute("UPDATE ops SET info = json_remove(info, '$.row_check', '$.run_check')")
        con.execute("UPDATE runs SET environment = json_remove(environment, '$.row_check')")
    con.close()
    assert [r.label for r in nddebug.load(str(path))] == ["run 0", "run 1"]


@pytest.mark.parametrize(
    "name", ["event of a missing op", "op info a JSON list", "environment null", "seq as text"]
)
def test_the_cli_reports_a_damaged_file_in_one_line(traced_file, tmp_path, name):
    statement, phrase = DAMAGE[name]
    path = tmp_path / "damaged.nddebug"
    shutil.copy(traced_file, path)
    _damage(path, statement)
    done = subprocess.run(
        [sys.executable, "-m", "nddebug", "report", str(path)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode not in (0, 1), (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if "damaged" in line]
    assert len(lines) == 1 and phrase in lines[0], done.stderr
    assert str(path) in lines[0]


def test_the_cli_still_reports_the_undamaged_file(traced_file):
    done = subprocess.run(
        [sys.executable, "-m", "nddebug", "report", str(traced_file)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "reproducible" in done.stdout


# ------------------------------------------------------------------ the native library cache

_LOAD_NATIVE = textwrap.dedent(
    """
    import json
    import tensorflow as tf
    import nddebug
    from nddebug import native

    lib = native.load()
    out = {"loaded": lib is not None, "problem": native.problem()}
    if lib is not None:  # the rebuilt library works
        out["digest"] = list(lib.digest_bytes(b"nddebug"))
    with nddebug.trace() as rec:
        tf.function(lambda x: x * 2.0)(tf.ones([3]))
    out["warnings"] = rec.warnings
    out["events"] = len(rec.events)
    print(json.dumps(out))
    """
)


def test_a_truncated_native_library_is_rebuilt_or_bypassed_never_a_crash(tmp_path, monkeypatch):
    from nddebug import native

    if shutil.which(os.environ.get("CXX") or "g++") is None:
        pytest.skip("no C++ compiler: the native library cannot be built here")
    library = native.build()  # the user's cache, built (or verified) as usual
    assert native.damage(library) == ""
    cache = tmp_path / "cache"
    shutil.copytree(library.parent, cache, ignore=shutil.ignore_patterns("*.tmp"))
    copy = cache / library.name
    size = copy.stat().st_size
    reference = run_python(_LOAD_NATIVE, env={**CPU_ONLY, native.CACHE_ENV: str(cache)})
    assert reference["loaded"], reference

    with open(copy, "r+b") as f:  # a truncated copy: loading it was SIGBUS
        f.truncate(size // 2)
    assert "truncated" in native.damage(copy)

    # No compiler: the pure-TF path, and the trace says why.
    no_cxx = {**CPU_ONLY, native.CACHE_ENV: str(cache), "CXX": str(tmp_path / "no-such-g++")}
    fallback = run_python(_LOAD_NATIVE, env=no_cxx)
    assert not fallback["loaded"]
    assert "truncated" in fallback["problem"] and "no C++ compiler" in fallback["problem"]
    assert any("native ops could not be built" in w for w in fallback["warnings"])
    assert fallback["events"] == reference["events"]
    assert copy.stat().st_size == size // 2  # left as it was

    # A library without its size/hash record (an older nddebug's cache) is not verifiable:
    # not loaded either. Both are rebuilt by the same build (one compile, ~1.5 min here).
    native.sidecar_path(copy).unlink()
    assert "no size/hash record" in native.damage(copy)
    fallback = run_python(_LOAD_NATIVE, env=no_cxx)
    assert not fallback["loaded"] and "no size/hash record" in fallback["problem"]

    # With a compiler: rebuilt, verified and loaded.
    rebuilt = run_python(_LOAD_NATIVE, env={**CPU_ONLY, native.CACHE_ENV: str(cache)})
    assert rebuilt["loaded"] and rebuilt["problem"] == "", rebuilt
    assert rebuilt["digest"] == reference["digest"]
    assert copy.stat().st_size == size and native.damage(copy) == ""
    monkeypatch.setenv(native.CACHE_ENV, str(cache))
    assert native.build() == copy and native.damage(copy) == ""  # whole: kept, not rebuilt


# ------------------------------------------------------------------ %%nddebug -o


_MAGIC = """
    import contextlib, io, json, os, shutil
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nddebug")
    setup = shell.run_cell('''
    import tensorflow as tf
    runs = 0
    ''')
    assert setup.success, setup.error_in_exec
    cell = "runs += 1\\ntotal = tf.reduce_sum(tf.random.uniform([3]))\\n"
    tmp = __TMP__
    out = {}

    foreign = os.path.join(tmp, "notes.txt")
    with open(foreign, "w") as f:
        f.write("not a recording\\n" * 100)
    for name, target in [
        ("html", os.path.join(tmp, "missing", "dir", "report.html")),
        ("recording", os.path.join(tmp, "missing", "dir", "runs.nddebug")),
        ("foreign", foreign),
    ]:
        shell.user_ns["runs"] = 0
        try:
            shell.run_cell_magic("nddebug", f"-n 2 -o {target}", cell)
            out[name] = {"error": None}
        except UsageError as e:
            out[name] = {"error": str(e)}
        out[name]["runs"] = shell.user_ns["runs"]
        out[name]["stored"] = "_nddebug_report" in shell.user_ns

    # The folder disappears while the cell runs: the report is kept and the error printed.
    for name, base in [("html", "report.html"), ("recording", "runs.nddebug")]:
        folder = os.path.join(tmp, "vanishing-" + name)
        os.makedirs(folder)
        target = os.path.join(folder, base)
        vanishing = f"import shutil\\nshutil.rmtree({folder!r}, ignore_errors=True)\\n" + cell
        shell.user_ns.pop("_nddebug_report", None)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            report = shell.run_cell_magic("nddebug", f"-n 2 -o {target}", vanishing)
        out["vanished-" + name] = {
            "stored": shell.user_ns.get("_nddebug_report") is report,
            "ok": report.ok,
            "stderr": err.getvalue(),
        }

    # A recording -o gets every compared and capture run, written after the check.
    target = os.path.join(tmp, "good.nddebug")
    report = shell.run_cell_magic("nddebug", f"-n 2 -o {target}", cell)
    import nddebug
    out["saved"] = {
        "labels": [r.label for r in nddebug.load(target)],
        "expected": [r.label for r in report.recordings + report.captures],
    }
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def magic(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("magic-out")
    return run_python(_MAGIC.replace("__TMP__", repr(str(tmp))), env=CPU_ONLY)


@pytest.mark.parametrize("kind", ["html", "recording"])
def test_magic_output_in_a_missing_folder_is_refused_before_the_cell_runs(magic, kind):
    got = magic[kind]
    assert got["runs"] == 0 and not got["stored"], got
    error = got["error"]
    assert "no folder" in error and os.path.join("missing", "dir") in error, error
    assert "nothing was run" in error and "\n" not in error


def test_magic_output_that_is_not_a_recording_is_refused_before_the_cell_runs(magic):
    got = magic["foreign"]
    assert got["runs"] == 0 and not got["stored"], got
    assert "notes.txt" in got["error"] and "not a recording" in got["error"], got


@pytest.mark.parametrize("kind", ["html", "recording"])
def test_magic_keeps_the_report_when_saving_fails_after_the_runs(magic, kind):
    got = magic["vanished-" + kind]
    assert got["stored"] and got["ok"] is False, got
    assert "the report was not saved to" in got["stderr"], got
    assert "_nddebug_report" in got["stderr"]


def test_magic_recording_output_holds_every_run(magic):
    saved = magic["saved"]
    assert saved["labels"] == saved["expected"]
    assert saved["labels"] == ["repeat 0", "repeat 1", "capture 0", "capture 1"]


def test_sqlite_damage_is_said_on_one_line():
    """SQLite's quick_check answers "*** in database main ***" and the problem on the next
    line (a bit flipped in a page of a recording): the error printed both lines, where a
    bad file gets one."""
    rows = [("*** in database main ***\nMultiple uses for byte 3505 of page 7",)]
    assert storage.integrity_problem(rows) == (
        "*** in database main *** Multiple uses for byte 3505 of page 7"
    )
    split = [("*** in database main ***",), ("On tree page 4 cell 2: extends off page",)]
    assert "\n" not in storage.integrity_problem(split)
    assert "extends off page" in storage.integrity_problem(split)
    assert storage.integrity_problem([("ok",)]) == ""


def test_a_damaged_schema_name_that_is_not_text_is_a_recording_file_error(traced_file, tmp_path):
    """A damaged page of SQLite's schema: the table's name is no longer UTF-8, and SQLite's
    message about it ("malformed database schema (<name>)") quotes those bytes, which Python
    could not decode. load() raised a bare UnicodeDecodeError, and the CLI printed a
    traceback and exited 1, as if culprits had been found."""
    data = bytearray(traced_file.read_bytes())
    name, sql = data.find(b"tableeventsevents"), data.find(b"CREATE TABLE events")
    assert name > 0 and sql > 0
    data[name + 6] = 0x8E  # the "e" of the name "events"
    data[sql + 15] = 0xFF  # and the statement, so that SQLite rejects the schema
    path = tmp_path / "damaged.nddebug"
    path.write_bytes(bytes(data))
    with pytest.raises(nddebug.RecordingFileError, match="byte 0x8e is not UTF-8"):
        nddebug.load(str(path))
    from tests.test_cli import nddebug as nddebug_cli

    for command in (["report", str(path)], ["diff", str(path), str(traced_file)]):
        done = nddebug_cli(*command)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and str(path) in done.stderr, done.stderr
    assert path.read_bytes() == bytes(data)  # refused, and left as it was
