"""The recording file: one SQLite database holding any number of runs.

Why SQLite: it is in the standard library (readable wherever Python is, TensorFlow or not),
each run is written in one transaction (a crash mid-write leaves every earlier run intact),
and the schema and a ``meta`` table make the file self-describing. Structured fields are
JSON text and captured arrays are ``.npy`` bytes loaded with ``allow_pickle=False``:
nothing in the file is ever unpickled.

A new file appears complete or not at all: its schema and ``meta`` rows are written to a
temporary file in the same folder, which is then hard-linked into place only if the path is
still free (a concurrent creator's file is never replaced; the loser appends to it). Loading
checks every row against the data model, so a damaged file is a RecordingFileError that names
the run, never a KeyError later in the analysis.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import json
import os
import sqlite3
import uuid
from collections.abc import Iterable
from typing import Any

import numpy as np

from nddebug.errors import RecordingFileError
from nddebug.recording import (
    Recording,
    RowError,
    event_from_row,
    json_kind,
    op_from_row,
    reruns_from_row,
)

FORMAT = "nddebug-recording"
# 2 added the reruns table (recordings of kind "rerun"): a version-1 reader would compare
# such a recording as one plain run and miss what its re-executions found.
FORMAT_VERSION = 2
# Seconds a writer waits for another process's write to finish (SQLite's busy timeout).
BUSY_TIMEOUT = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, ordinal INTEGER NOT NULL, label TEXT, status TEXT NOT NULL,
    kind TEXT NOT NULL,
    digest_algorithm TEXT NOT NULL, environment TEXT NOT NULL, warnings TEXT NOT NULL,
    saved_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ops (
    run_id TEXT NOT NULL, op_id INTEGER NOT NULL, info TEXT NOT NULL,
    PRIMARY KEY (run_id, op_id));
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, op_id INTEGER NOT NULL, call INTEGER NOT NULL,
    digests TEXT NOT NULL, inputs TEXT, shapes TEXT, PRIMARY KEY (run_id, seq));
CREATE TABLE IF NOT EXISTS reruns (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, digests TEXT NOT NULL,
    PRIMARY KEY (run_id, seq));
CREATE TABLE IF NOT EXISTS captured (
    run_id TEXT NOT NULL, name TEXT NOT NULL, dtype TEXT NOT NULL, npy BLOB NOT NULL,
    PRIMARY KEY (run_id, name));
"""
_STATEMENTS = [s.strip() for s in _SCHEMA.split(";") if s.strip()]

_DESCRIPTION = (
    "nddebug recording: runs(one row per traced run), ops(static facts per traced op, JSON), "
    "events(one row per op execution: digests of its outputs as JSON [[lo, hi] | null, ...]), "
    "reruns(per op execution of a rerun recording: the digests of each extra execution on the "
    "same inputs, JSON [[[lo, hi] | null, ...], ...]), captured(full output values as .npy "
    "bytes). Digest definition: see nddebug.digest."
)
_META_KEYS = {"format", "format_version", "written_by", "description"}


def _columns() -> dict[str, list[str]]:
    """Each table of the schema -> its column names."""
    con = sqlite3.connect(":memory:")
    try:
        for statement in _STATEMENTS:
            con.execute(statement)
        return {
            table: [row[1] for row in con.execute(f"PRAGMA table_info({table})")]
            for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
    finally:
        con.close()


_TABLES = _columns()
_DATA_TABLES = ("runs", "ops", "events", "reruns", "captured")


def _connect(path: str, create: bool) -> sqlite3.Connection:
    if not create and not os.path.exists(path):
        raise RecordingFileError(f"{path}: no such recording file")
    try:
        con = sqlite3.connect(path, timeout=BUSY_TIMEOUT)
        con.execute("PRAGMA foreign_keys = ON")
        return con
    except sqlite3.Error as exc:
        raise RecordingFileError(f"{path}: cannot open as a recording file ({exc})") from exc


# ------------------------------------------------------------------ what the file holds

_RECORDING, _EMPTY, _HALF, _FOREIGN = "recording", "empty", "half-created", "foreign"


def _layout(con: sqlite3.Connection) -> tuple[str, int]:
    """What the database is: a recording (it has a ``format`` row in ``meta``, whatever its
    value), empty (no tables), half-created (only nddebug's tables, no format row: a save
    that was interrupted while creating the file, in nddebug before creation was atomic), or
    foreign. With the number of rows in the data tables of a half-created file."""
    tables = {
        name: [row[1] for row in con.execute(f"PRAGMA table_info({name})").fetchall()]
        for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
    }
    if not tables:
        return _EMPTY, 0
    if "meta" in tables and tables["meta"] == _TABLES["meta"]:
        keys = {k for (k,) in con.execute("SELECT key FROM meta").fetchall()}
        if "format" in keys:
            return _RECORDING, 0
        if not keys <= _META_KEYS:
            return _FOREIGN, 0
    elif "meta" in tables:
        return _FOREIGN, 0
    ours = all(name in _TABLES and cols == _TABLES[name] for name, cols in tables.items())
    if not ours:
        return _FOREIGN, 0
    rows = sum(
        con.execute(f"SELECT COUNT(*) FROM {name}").fetchone()[0]
        for name in _DATA_TABLES
        if name in tables
    )
    return _HALF, rows


def _not_a_recording(path: str, layout: str, rows: int, writing: bool) -> RecordingFileError:
    if layout == _EMPTY:
        return RecordingFileError(
            f"{path}: empty: not an nddebug recording yet (an SQLite file without tables: an "
            "empty file, or one made before a first save finished); it holds no runs"
        )
    if layout == _HALF:
        held = (
            "it holds no runs, and saving to it re-initialises it"
            if not rows
            else f"it holds {rows} row(s) of run data, so nddebug will not re-initialise it"
        )
        return RecordingFileError(
            f"{path}: half-created recording: it has nddebug's tables but no format row in "
            f"meta (an earlier nddebug was interrupted while creating it); {held}"
        )
    refused = "; not writing to it" if writing else ""
    return RecordingFileError(
        f"{path}: is an SQLite database but not an nddebug recording{refused}"
    )


def _check_format(con: sqlite3.Connection, path: str, writing: bool = False) -> None:
    try:
        ok = con.execute("PRAGMA quick_check").fetchall()[0][0]
        if ok != "ok":
            raise RecordingFileError(f"{path}: the file is damaged ({ok}); it may be truncated")
        layout, rows = _layout(con)
        if layout != _RECORDING:
            raise _not_a_recording(path, layout, rows, writing)
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        raise RecordingFileError(
            f"{path}: not a readable nddebug recording ({exc}); the file may be truncated or "
            "not a recording"
        ) from exc
    if meta.get("format") != FORMAT:
        raise RecordingFileError(
            f"{path}: not an nddebug recording (format={meta.get('format')!r})"
        )
    try:
        version = int(meta.get("format_version", "0"))
    except (TypeError, ValueError):
        raise RecordingFileError(
            f"{path}: damaged recording: format_version is {meta.get('format_version')!r}"
        ) from None
    if version > FORMAT_VERSION:
        raise RecordingFileError(
            f"{path}: written by a newer nddebug (format version {version}; this nddebug reads "
            f"up to {FORMAT_VERSION}); upgrade nddebug to read it"
        )


# ------------------------------------------------------------------ creating and appending


def _initialise(con: sqlite3.Connection, drop: Iterable[str] = ()) -> None:
    """Schema and meta rows in the open transaction (dropping the tables ``drop`` first)."""
    from nddebug import __version__

    for name in drop:
        con.execute(f"DROP TABLE IF EXISTS {name}")
    for statement in _STATEMENTS:
        con.execute(statement)
    con.executemany(
        "INSERT OR REPLACE INTO meta VALUES (?, ?)",
        [
            ("format", FORMAT),
            ("format_version", str(FORMAT_VERSION)),
            ("written_by", f"nddebug {__version__}"),
            ("description", _DESCRIPTION),
        ],
    )


def _create(path: str) -> None:
    """Make ``path`` a new, complete (empty) recording unless it exists: build it in a
    temporary file next to it and hard-link that into place. ``os.link`` fails if the path
    exists, so a file another process created meanwhile is kept (and appended to). Where the
    file system has no hard links, the file is initialised in place under SQLite's write lock
    instead (see :func:`_prepare`)."""
    if os.path.lexists(path):
        return
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:12]}.creating")
    try:
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    except OSError as exc:
        raise RecordingFileError(f"{path}: cannot create the recording file ({exc})") from exc
    try:
        con = sqlite3.connect(tmp)
        try:
            with con:
                con.execute("BEGIN IMMEDIATE")
                _initialise(con)
        finally:
            con.close()
        try:
            os.link(tmp, path)  # fails if the path exists: nothing is ever replaced
        except FileExistsError:
            pass  # another process created it first: append to that file
        except OSError:
            pass  # no hard links on this file system: _prepare initialises it in place
    except sqlite3.Error as exc:
        raise RecordingFileError(f"{path}: could not create the recording ({exc})") from exc
    finally:
        for leftover in (tmp, tmp + "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def _prepare(con: sqlite3.Connection, path: str) -> None:
    """Make the open file ready for appending: check it is a recording this nddebug may
    write, bring an older layout up to this version, and initialise an empty or half-created
    file that holds no runs. Anything else is refused and left untouched."""
    try:
        layout, rows = _layout(con)
    except sqlite3.DatabaseError as exc:
        raise RecordingFileError(f"{path}: exists and is not a recording ({exc})") from exc
    if layout in (_EMPTY, _HALF):
        # Decide again under the write lock: another process may be initialising it too.
        with con:
            con.execute("BEGIN IMMEDIATE")
            layout, rows = _layout(con)
            if layout == _EMPTY or (layout == _HALF and not rows):
                tables = [n for (n,) in con.execute("SELECT name FROM sqlite_master")]
                _initialise(con, drop=[n for n in tables if n in _TABLES])
                return
    if layout != _RECORDING:
        raise _not_a_recording(path, layout, rows, writing=True)
    _check_format(con, path, writing=True)
    tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    version = con.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchall()
    if set(_TABLES) <= tables and version == [(str(FORMAT_VERSION),)]:
        return
    with con:
        # Older layouts are a subset of this one: the file now holds this version.
        con.execute("BEGIN IMMEDIATE")
        for statement in _STATEMENTS:
            con.execute(statement)
        con.execute(
            "UPDATE meta SET value = ? WHERE key = 'format_version' AND CAST(value AS INTEGER) < ?",
            (str(FORMAT_VERSION), FORMAT_VERSION),
        )


def check_appendable(path: str) -> None:
    """Raise RecordingFileError unless :func:`save` could append to ``path``: its folder
    exists and is writable, and the file is absent, empty, half-created without runs, or a
    recording of a version this nddebug writes. Writes nothing."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise RecordingFileError(f"{path}: no folder {folder} to save it in")
    if not os.access(folder, os.W_OK):
        raise RecordingFileError(f"{path}: the folder {folder} is not writable")
    if not os.path.lexists(path):
        return
    if os.path.isdir(path):
        raise RecordingFileError(f"{path}: is a folder, not a recording file")
    con = _connect(path, create=False)
    try:
        layout, rows = _layout(con)
        if layout == _EMPTY or (layout == _HALF and not rows):
            return
        if layout != _RECORDING:
            raise _not_a_recording(path, layout, rows, writing=True)
        _check_format(con, path, writing=True)
    except sqlite3.DatabaseError as exc:
        raise RecordingFileError(f"{path}: exists and is not a recording ({exc})") from exc
    finally:
        con.close()


def save(recordings: Iterable[Recording], path: str) -> None:
    """Append runs to ``path``; each run is one transaction, so an interruption loses at most
    the run being written. A run already in the file (same run_id) is left as it is. A new
    file appears complete (schema and meta) or not at all."""
    _create(path)
    con = _connect(path, create=True)
    try:
        _prepare(con, path)
        for rec in recordings:
            _save_run(con, rec)
    except sqlite3.Error as exc:
        raise RecordingFileError(f"{path}: could not write the recording ({exc})") from exc
    except RecordingFileError as exc:
        if path in str(exc):
            raise
        raise RecordingFileError(f"{path}: {exc}") from exc
    finally:
        con.close()


def _save_run(con: sqlite3.Connection, rec: Recording) -> None:
    if con.execute("SELECT 1 FROM runs WHERE run_id = ?", (rec.run_id,)).fetchall():
        return
    with con:
        # Take the write lock before choosing the ordinal: processes may append concurrently.
        con.execute("BEGIN IMMEDIATE")
        ordinal = con.execute("SELECT COALESCE(MAX(ordinal), -1) + 1 FROM runs").fetchone()[0]
        now = datetime.datetime.now(datetime.UTC).isoformat()
        con.execute(
            "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                rec.run_id,
                ordinal,
                rec.label,
                rec.status,
                rec.kind,
                rec.digest_algorithm,
                json.dumps(rec.environment, default=str),
                json.dumps(rec.warnings),
                now,
            ),
        )
        con.executemany(
            "INSERT INTO ops VALUES (?, ?, ?)",
            [
                (rec.run_id, op.op_id, json.dumps(dataclasses.asdict(op), default=str))
                for op in rec.ops.values()
            ],
        )
        con.executemany(
            "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    rec.run_id,
                    ev.seq,
                    ev.op_id,
                    ev.call,
                    json.dumps(ev.digests),
                    None if ev.inputs is None else json.dumps(ev.inputs),
                    None if ev.shapes is None else json.dumps(ev.shapes),
                )
                for ev in rec.events
            ],
        )
        con.executemany(
            "INSERT INTO reruns VALUES (?, ?, ?)",
            [(rec.run_id, ev.seq, json.dumps(ev.reruns)) for ev in rec.events if ev.reruns],
        )
        for name, array in rec.values.items():
            array = np.asarray(array)
            buf = io.BytesIO()
            np.save(buf, _portable(array), allow_pickle=False)
            con.execute(
                "INSERT INTO captured VALUES (?, ?, ?, ?)",
                (rec.run_id, name, array.dtype.name, buf.getvalue()),
            )


def _portable(array: np.ndarray) -> np.ndarray:
    """.npy knows only numpy's own dtypes: store bfloat16, float8 … as same-width integers."""
    if array.dtype.kind == "O":
        raise RecordingFileError(f"cannot store an array of Python objects ({array.dtype})")
    if array.dtype.kind == "V" or array.dtype.name not in np.sctypeDict:
        return array.view(f"u{array.dtype.itemsize}")
    return array


def _restore(array: np.ndarray, dtype: str) -> np.ndarray:
    if array.dtype.name == dtype:
        return array
    try:
        import ml_dtypes  # installed with TensorFlow

        return array.view(getattr(ml_dtypes, dtype))
    except (ImportError, AttributeError):
        return array  # the raw bits, still comparable


# ------------------------------------------------------------------ loading


def _json(text: Any, what: str) -> Any:
    if not isinstance(text, (str, bytes)):
        raise RowError(f"{what} is stored as {type(text).__name__}, not JSON text")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RowError(f"{what} is not valid JSON ({exc})") from None


def _text(value: Any, what: str, null: bool = False) -> str:
    if (value is None and null) or isinstance(value, str):
        return value or ""
    raise RowError(f"{what} is {type(value).__name__} {value!r:.60}, not text")


def _read_run(con: sqlite3.Connection, row: tuple, tables: set[str]) -> Recording:
    """One run, every row checked against the data model (RowError says what is wrong)."""
    run_id, label, status, kind, algorithm, env, warnings = row
    environment = _json(env, "the environment")
    if not isinstance(environment, dict):
        raise RowError(f"the environment is JSON {json_kind(environment)}, not an object")
    warned = _json(warnings, "the warnings")
    if not isinstance(warned, list) or not all(isinstance(w, str) for w in warned):
        raise RowError(f"the warnings are {warned!r:.60}, not a list of strings")
    rec = Recording(
        label=_text(label, "the label", null=True),
        run_id=run_id,
        status=_text(status, "the status"),
        kind=_text(kind, "the kind"),
        digest_algorithm=_text(algorithm, "the digest algorithm"),
        environment=environment,
        warnings=warned,
    )
    for op_id, info in con.execute("SELECT op_id, info FROM ops WHERE run_id = ?", (run_id,)):
        op = op_from_row(_json(info, f"op {op_id!r}'s info"))
        if op.op_id != op_id:
            raise RowError(f"op {op_id!r}'s info says op_id {op.op_id}")
        rec.ops[op.op_id] = op
    for seq, op_id, call, digests, inputs, shapes in con.execute(
        "SELECT seq, op_id, call, digests, inputs, shapes FROM events "
        "WHERE run_id = ? ORDER BY seq",
        (run_id,),
    ):
        where = f"event seq {seq!r}"
        ev = event_from_row(
            seq,
            op_id,
            call,
            _json(digests, f"{where}: digests"),
            None if inputs is None else _json(inputs, f"{where}: inputs"),
            None if shapes is None else _json(shapes, f"{where}: shapes"),
        )
        if ev.op_id not in rec.ops:
            raise RowError(f"{where} names op {ev.op_id}, which is not in the ops table")
        rec.events.append(ev)
    if "reruns" in tables:
        by_seq = {ev.seq: ev for ev in rec.events}
        for seq, digests in con.execute(
            "SELECT seq, digests FROM reruns WHERE run_id = ?", (run_id,)
        ):
            if seq not in by_seq:
                raise RowError(f"reruns name event seq {seq!r}, which is not in the events table")
            by_seq[seq].reruns = reruns_from_row(_json(digests, f"reruns of seq {seq}"), seq)
    for name, dtype, blob in con.execute(
        "SELECT name, dtype, npy FROM captured WHERE run_id = ?", (run_id,)
    ):
        what = f"captured value {name!r}"
        _text(name, "a captured value's name")
        _text(dtype, f"{what}: dtype")
        if not isinstance(blob, bytes):
            raise RowError(f"{what} is {type(blob).__name__}, not .npy bytes")
        try:
            rec.values[name] = _restore(np.load(io.BytesIO(blob), allow_pickle=False), dtype)
        except Exception as exc:  # noqa: BLE001 - any failure to parse untrusted bytes
            raise RowError(f"{what} is not a readable .npy array ({exc})") from None
    return rec


def salvage(path: str) -> tuple[list[Recording], list[str]]:
    """The runs of ``path`` that read back whole, and one line per run that does not (what is
    wrong with it). For a damaged file: save the runs into a new file to keep them. Raises
    RecordingFileError only if the file as a whole is unreadable."""
    con = _connect(path, create=False)
    try:
        _check_format(con, path)
        try:
            tables = {
                r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            runs = con.execute(
                "SELECT run_id, label, status, kind, digest_algorithm, environment, warnings "
                "FROM runs ORDER BY ordinal"
            ).fetchall()
            out, problems = [], []
            for n, row in enumerate(runs, 1):
                label = row[1]
                name = f"run {n} of {len(runs)} (label {label!r}, run_id {str(row[0])[:8]})"
                try:
                    if not isinstance(row[0], str):
                        raise RowError(f"its run_id is {type(row[0]).__name__}, not text")
                    out.append(_read_run(con, row, tables))
                except RowError as exc:
                    problems.append(" ".join(f"{exc}, {name}".split()))  # one line
            return out, problems
        except sqlite3.DatabaseError as exc:
            raise RecordingFileError(
                f"{path}: the recording is damaged or incomplete ({exc})"
            ) from exc
    finally:
        con.close()


def load(path: str) -> list[Recording]:
    """Every run in ``path``, in the order they were saved. A file with a damaged run raises
    RecordingFileError naming it (:func:`salvage` returns the runs that are whole)."""
    runs, problems = salvage(path)
    if problems:
        more = f" (and {len(problems) - 1} more damaged run(s))" if len(problems) > 1 else ""
        raise RecordingFileError(
            f"{path}: damaged: {problems[0]}{more}; {len(runs)} other run(s) read back whole: "
            "nddebug.storage.salvage(path) returns them"
        )
    return runs
