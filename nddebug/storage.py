"""The recording file: one SQLite database holding any number of runs.

Why SQLite: it is in the standard library (readable wherever Python is, TensorFlow or not),
each run is written in one transaction (a crash mid-write leaves every earlier run intact),
and the schema and a ``meta`` table make the file self-describing. Structured fields are
JSON text and captured arrays are ``.npy`` bytes loaded with ``allow_pickle=False``:
nothing in the file is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import os
import sqlite3
from collections.abc import Iterable

import numpy as np

from nddebug.errors import RecordingFileError
from nddebug.recording import Event, Recording, op_from_row

FORMAT = "nddebug-recording"
# 2 added the reruns table (recordings of kind "rerun"): a version-1 reader would compare
# such a recording as one plain run and miss what its re-executions found.
FORMAT_VERSION = 2

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

_DESCRIPTION = (
    "nddebug recording: runs(one row per traced run), ops(static facts per traced op, JSON), "
    "events(one row per op execution: digests of its outputs as JSON [[lo, hi] | null, ...]), "
    "reruns(per op execution of a rerun recording: the digests of each extra execution on the "
    "same inputs, JSON [[[lo, hi] | null, ...], ...]), captured(full output values as .npy "
    "bytes). Digest definition: see nddebug.digest."
)


def _connect(path: str, create: bool) -> sqlite3.Connection:
    if not create and not os.path.exists(path):
        raise RecordingFileError(f"{path}: no such recording file")
    try:
        con = sqlite3.connect(path)
        con.execute("PRAGMA foreign_keys = ON")
        return con
    except sqlite3.Error as exc:
        raise RecordingFileError(f"{path}: cannot open as a recording file ({exc})") from exc


def _check_format(con: sqlite3.Connection, path: str) -> None:
    try:
        ok = con.execute("PRAGMA quick_check").fetchone()[0]
        if ok != "ok":
            raise RecordingFileError(f"{path}: the file is damaged ({ok}); it may be truncated")
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
    except ValueError:
        raise RecordingFileError(
            f"{path}: damaged recording: format_version is {meta.get('format_version')!r}"
        ) from None
    if version > FORMAT_VERSION:
        raise RecordingFileError(
            f"{path}: written by a newer nddebug (format version {version}; this nddebug reads "
            f"up to {FORMAT_VERSION}); upgrade nddebug to read it"
        )


def save(recordings: Iterable[Recording], path: str) -> None:
    """Append runs to ``path``; each run is one transaction, so an interruption loses at most
    the run being written. A run already in the file (same run_id) is left as it is."""
    con = _connect(path, create=True)
    try:
        try:
            tables = {
                r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
        except sqlite3.DatabaseError as exc:
            raise RecordingFileError(f"{path}: exists and is not a recording ({exc})") from exc
        fresh = not tables
        if tables and "meta" not in tables:
            raise RecordingFileError(
                f"{path}: is an SQLite database but not an nddebug recording; not writing to it"
            )
        if not fresh:
            _check_format(con, path)
        with con:
            con.executescript(_SCHEMA)
            if not fresh:
                # Older layouts are a subset of this one: the file now holds this version.
                con.execute(
                    "UPDATE meta SET value = ? WHERE key = 'format_version' AND "
                    "CAST(value AS INTEGER) < ?",
                    (str(FORMAT_VERSION), FORMAT_VERSION),
                )
            if fresh:
                from nddebug import __version__

                con.executemany(
                    "INSERT OR IGNORE INTO meta VALUES (?, ?)",
                    [
                        ("format", FORMAT),
                        ("format_version", str(FORMAT_VERSION)),
                        ("written_by", f"nddebug {__version__}"),
                        ("description", _DESCRIPTION),
                    ],
                )
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
    if con.execute("SELECT 1 FROM runs WHERE run_id = ?", (rec.run_id,)).fetchone():
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


def _digests(rows: list) -> list:
    return [tuple(d) if d is not None else None for d in rows]


def load(path: str) -> list[Recording]:
    """Every run in ``path``, in the order they were saved."""
    con = _connect(path, create=False)
    try:
        _check_format(con, path)
        runs = con.execute(
            "SELECT run_id, label, status, kind, digest_algorithm, environment, warnings "
            "FROM runs ORDER BY ordinal"
        ).fetchall()
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        out = []
        for run_id, label, status, kind, algorithm, env, warnings in runs:
            rec = Recording(
                label=label or "",
                run_id=run_id,
                status=status,
                kind=kind,
                digest_algorithm=algorithm,
                environment=json.loads(env),
                warnings=json.loads(warnings),
            )
            for (info,) in con.execute("SELECT info FROM ops WHERE run_id = ?", (run_id,)):
                op = op_from_row(json.loads(info))
                rec.ops[op.op_id] = op
            for seq, op_id, call, digests, inputs, shapes in con.execute(
                "SELECT seq, op_id, call, digests, inputs, shapes FROM events "
                "WHERE run_id = ? ORDER BY seq",
                (run_id,),
            ):
                rec.events.append(
                    Event(
                        seq=seq,
                        op_id=op_id,
                        call=call,
                        digests=_digests(json.loads(digests)),
                        inputs=None if inputs is None else _digests(json.loads(inputs)),
                        shapes=None if shapes is None else json.loads(shapes),
                    )
                )
            if "reruns" in tables:
                by_seq = {ev.seq: ev for ev in rec.events}
                for seq, digests in con.execute(
                    "SELECT seq, digests FROM reruns WHERE run_id = ?", (run_id,)
                ):
                    by_seq[seq].reruns = [_digests(row) for row in json.loads(digests)]
            for name, dtype, blob in con.execute(
                "SELECT name, dtype, npy FROM captured WHERE run_id = ?", (run_id,)
            ):
                rec.values[name] = _restore(np.load(io.BytesIO(blob), allow_pickle=False), dtype)
            out.append(rec)
        return out
    except (sqlite3.DatabaseError, json.JSONDecodeError, ValueError, TypeError, KeyError) as exc:
        raise RecordingFileError(f"{path}: the recording is damaged or incomplete ({exc})") from exc
    finally:
        con.close()
