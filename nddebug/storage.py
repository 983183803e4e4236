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

Format version 3 stores op executions in columns: one ``chunks`` row per block of up to
CHUNK_EVENTS executions, holding little-endian NumPy arrays (op ids, calls, per-event digest
counts, and each digest slot as a code into a per-chunk dictionary of distinct digests),
each compressed with zlib where that makes it smaller (10 to 20 bytes per execution instead
of about 210 as JSON rows). Runs written by versions 1 and 2 (one JSON ``events`` row per
execution) still load. :class:`RunWriter` streams a long run chunk by chunk, each committed,
and :func:`load_columns` / :func:`first_difference` compare millions of executions as arrays,
without one Python object per execution. docs/format.md describes the layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import io
import itertools
import json
import os
import re
import sqlite3
import stat
import threading
import uuid
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from nddebug.errors import RecordingFileError
from nddebug.recording import (
    UNCLOSED_WARNING,
    Digest,
    Event,
    OpInfo,
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
# 3 added the chunks table (op executions as compressed columns): a version-2 reader would
# see runs without op executions.
# 4 binds every chunk and op row to its run: their checks include the run_id (a row copied
# from one run into another read as that run's, and a NOT reproducible file as
# reproducible: probe round 35). A version-3 reader would take the new checks for damage.
FORMAT_VERSION = 4
#: The versions save() can write: 4 (columns, checks bound to the run), 3 (the same with
#: checks of each row alone), or 2 (one JSON row per op execution, for files that an older
#: nddebug must read).
WRITABLE_VERSIONS = (2, 3, 4)
#: Op executions per chunk row when a whole run is saved (RunWriter: one chunk per append,
#: split at this size).
CHUNK_EVENTS = 65536
#: zlib level of the chunk arrays: level 6 saves 3% more on a traced CNN and takes 2.6 times
#: as long to save.
ZLIB_LEVEL = 1
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
CREATE TABLE IF NOT EXISTS chunks (
    run_id TEXT NOT NULL, chunk INTEGER NOT NULL, first_seq INTEGER NOT NULL,
    events INTEGER NOT NULL, outputs INTEGER NOT NULL, inputs INTEGER NOT NULL,
    entries INTEGER NOT NULL, arrays TEXT NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (run_id, chunk));
"""
_STATEMENTS = [s.strip() for s in _SCHEMA.split(";") if s.strip()]
# The tables each writable version has (a file of a version has at least these).
_VERSION_STATEMENTS = {
    2: [s for s in _STATEMENTS if "TABLE IF NOT EXISTS chunks" not in s],
    3: _STATEMENTS,
    4: _STATEMENTS,  # the same tables; only the rows' checks changed
}

_DESCRIPTION = (
    "nddebug recording: runs(one row per traced run), ops(static facts per traced op, JSON), "
    "events(one row per op execution: digests of its outputs as JSON [[lo, hi] | null, ...]), "
    "reruns(per op execution of a rerun recording: the digests of each extra execution on the "
    "same inputs, JSON [[[lo, hi] | null, ...], ...]), captured(full output values as .npy "
    "bytes). Digest definition: see nddebug.digest."
)
_DESCRIPTION_3 = (
    "nddebug recording: runs(one row per traced run), ops(static facts per traced op, JSON), "
    "chunks(op executions of runs of format 3 and later, one row per block: little-endian "
    "numpy arrays, zlib-compressed where smaller, concatenated in data and listed in arrays "
    "as JSON name -> [dtype, codec, count, offset, nbytes]; digests are codes into a per-chunk "
    "dictionary: 0 none, 1 next new entry, c >= 2 the entry c - 1 places back), "
    "events/reruns(one JSON row per op execution, runs written by format versions 1 and 2), "
    "captured(full output values as .npy bytes). Layout: docs/format.md of nddebug; digest "
    "definition: nddebug.digest."
)
_META_KEYS = {"format", "format_version", "written_by", "description"}
#: A run's status and kind (Recording.status, Recording.kind): anything else is damage.
STATUSES = ("complete", "interrupted")
KINDS = ("run", "rerun", "capture")


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
_VERSION_TABLES = {
    v: {re.search(r"EXISTS (\w+)", s).group(1) for s in statements}
    for v, statements in _VERSION_STATEMENTS.items()
}
_DATA_TABLES = ("runs", "ops", "events", "reruns", "captured", "chunks")
#: What SQLite raises for a file it cannot read as a database. Python raises UnicodeDecodeError
#: instead of the DatabaseError when SQLite's message quotes a damaged page's bytes that are
#: not UTF-8 (a schema name, in "malformed database schema (...)"): damage all the same.
DAMAGED = (sqlite3.DatabaseError, UnicodeDecodeError)
#: Any SQLite failure, damage included.
SQLITE_ERRORS = (sqlite3.Error, UnicodeDecodeError)


def _why(exc: BaseException) -> str:
    """An SQLite failure in words (a UnicodeDecodeError: see DAMAGED)."""
    if isinstance(exc, UnicodeDecodeError):
        byte = exc.object[exc.start]
        return f"damaged bytes where SQLite keeps text: byte 0x{byte:02x} is not UTF-8"
    undecodable = _UNDECODABLE.match(str(exc))
    if undecodable:  # the message goes on to quote the whole damaged text
        return f"its column {undecodable.group(1)!r} holds text that is not UTF-8 (a byte changed)"
    return str(exc)


#: Python's sqlite3 reading a TEXT value that is not UTF-8 (an OperationalError).
_UNDECODABLE = re.compile(r"Could not decode to UTF-8 column '([^']*)'")


def _is_damage(exc: BaseException) -> bool:
    """Whether an SQLite failure while rows are read says those rows are damaged (corrupt
    pages, text that is not UTF-8), not that the file is busy or cannot be opened."""
    if isinstance(exc, sqlite3.OperationalError):
        return bool(_UNDECODABLE.match(str(exc)))
    return isinstance(exc, DAMAGED)


@contextlib.contextmanager
def _rows_of_one_run() -> Iterator[None]:
    """Damage SQLite meets while one run's rows are read is that run's (RowError): a byte
    changed in one op's info made every run of the file unreadable, ``salvage()`` included,
    while the other run was whole (probe round 40)."""
    try:
        yield
    except SQLITE_ERRORS as exc:
        if not _is_damage(exc):
            raise
        raise RowError(_why(exc)) from None


def _connect(path: str, create: bool, threads: bool = False) -> sqlite3.Connection:
    if not create and not os.path.exists(path):
        if os.path.islink(path):
            raise RecordingFileError(
                f"{path}: a symbolic link to {os.readlink(path)}, which does not exist or "
                "links back to itself"
            )
        raise RecordingFileError(f"{path}: no such recording file")
    if os.path.isdir(path):
        raise RecordingFileError(f"{path} is a folder: name a recording file in it")
    _refuse_special(path)
    _refuse_other_bytes(path)
    try:
        con = sqlite3.connect(path, timeout=BUSY_TIMEOUT, check_same_thread=not threads)
        con.execute("PRAGMA foreign_keys = ON")
        return con
    except SQLITE_ERRORS as exc:
        raise RecordingFileError(f"{path}: cannot open as a recording file ({_why(exc)})") from exc


#: The first bytes of every SQLite database file.
_SQLITE_HEADER = b"SQLite format 3\x00"


def _refuse_special(path: str) -> None:
    """Refuse what exists but is not a regular file (a named pipe, a device such as
    /dev/null, a socket): reading a FIFO waits for a writer for ever (``nddebug report FIFO``
    hung), and /dev/null passed as an empty file and failed only when a run was saved."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # absent (created later) or unreadable: said where it is opened
    if not stat.S_ISREG(mode):
        what = (
            "a named pipe (FIFO)"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "not a regular file"
        )
        raise RecordingFileError(
            f"{path} is {what}, not a recording file: name a regular file (nddebug reads and "
            "writes recordings as SQLite databases, which need one)"
        )


def _refuse_other_bytes(path: str) -> None:
    """Refuse a file that holds bytes but is no SQLite database. SQLite itself takes a file
    shorter than its header for an empty database, and saving then replaced it: a one-byte
    note given as ``-o`` became a recording. Only a file of no bytes at all is empty."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise RecordingFileError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if head and head != _SQLITE_HEADER:
        raise RecordingFileError(
            f"{path}: exists and is not a recording (its {len(head)} first byte(s) are not an "
            "SQLite database's); nddebug leaves it as it is"
        )


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


def integrity_problem(rows: list[tuple[Any, ...]]) -> str:
    """What SQLite's ``PRAGMA quick_check`` found, on one line ("" when the file is sound). Its
    report spans lines ("*** in database main ***", then "Multiple uses for byte 3505 of
    page 7"), and an error about a bad file is one line."""
    problems = [" ".join(str(row[0]).split()) for row in rows]
    if problems == ["ok"]:
        return ""
    shown = []
    for text in problems:  # up to the first problem after the "*** in database ***" header
        shown.append(text)
        if not (text.startswith("***") and text.endswith("***")):
            break
    return " ".join(shown) or "no answer"


def _wrong_size(con: sqlite3.Connection, path: str) -> str:
    """How a file's size differs from the pages it holds ("" if it does not).

    Shorter: SQLite reads the missing end of its last page as zeros; a recording cut by a
    few bytes passed the quick check (it does not compare an index with its table), and the
    index it lost made its runs load with no events. Longer: SQLite reads only the pages its
    header counts; two recordings joined with ``cat`` loaded as the first alone, the runs of
    the second dropped without a word (probe round 40)."""
    if os.path.exists(path + "-wal"):
        return ""  # pages past the end of the file may be in the write-ahead log
    # Read under one read transaction: another process's commit cannot change the file
    # between the page count and the size (six processes saving at once saw one).
    own = not con.in_transaction
    if own:
        con.execute("BEGIN")
    try:
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()  # holds the read lock
        size = os.path.getsize(path)
    except OSError:
        return ""
    finally:
        if own:
            con.rollback()
    if size > pages * page_size:
        return (
            f"it holds {size - pages * page_size:,} bytes after the end of its {pages} pages "
            "that SQLite would not read: two files joined into one?"
        )
    if size == pages * page_size:
        return ""
    return (
        f"it holds {size:,} bytes of the {pages * page_size:,} of its {pages} pages; "
        "it may be truncated"
    )


def _check_format(con: sqlite3.Connection, path: str, writing: bool = False) -> None:
    try:
        problem = integrity_problem(con.execute("PRAGMA quick_check").fetchall())
        if problem:
            raise RecordingFileError(
                f"{path}: the file is damaged ({problem}); it may be truncated"
            )
        problem = _wrong_size(con, path)
        if problem:
            raise RecordingFileError(f"{path}: the file is damaged ({problem})")
        layout, rows = _layout(con)
        if layout != _RECORDING:
            raise _not_a_recording(path, layout, rows, writing)
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    except DAMAGED as exc:
        raise RecordingFileError(
            f"{path}: not a readable nddebug recording ({_why(exc)}); the file may be truncated or "
            "not a recording"
        ) from exc
    if meta.get("format") != FORMAT:
        raise RecordingFileError(
            f"{path}: not an nddebug recording (format={meta.get('format')!r})"
        )
    try:
        version = int(meta["format_version"])
    except KeyError:
        raise RecordingFileError(
            f"{path}: damaged recording: its meta table has no format_version"
        ) from None
    except (TypeError, ValueError):
        raise RecordingFileError(
            f"{path}: damaged recording: format_version is {meta.get('format_version')!r}"
        ) from None
    if version < 1:
        raise RecordingFileError(f"{path}: damaged recording: format_version is {version}")
    if version > FORMAT_VERSION:
        raise RecordingFileError(
            f"{path}: written by a newer nddebug (format version {version}; this nddebug reads "
            f"up to {FORMAT_VERSION}); upgrade nddebug to read it"
        )


# ------------------------------------------------------------------ creating and appending


def _initialise(
    con: sqlite3.Connection, drop: Iterable[str] = (), version: int = FORMAT_VERSION
) -> None:
    """Schema and meta rows of ``version`` in the open transaction (dropping the tables
    ``drop`` first)."""
    from nddebug import __version__

    for name in drop:
        con.execute(f"DROP TABLE IF EXISTS {name}")
    for statement in _VERSION_STATEMENTS[version]:
        con.execute(statement)
    con.executemany(
        "INSERT OR REPLACE INTO meta VALUES (?, ?)",
        [
            ("format", FORMAT),
            ("format_version", str(version)),
            ("written_by", f"nddebug {__version__}"),
            ("description", _DESCRIPTION_3 if version >= 3 else _DESCRIPTION),
        ],
    )


def _create(path: str, version: int = FORMAT_VERSION) -> None:
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
                _initialise(con, version=version)
        finally:
            con.close()
        try:
            os.link(tmp, path)  # fails if the path exists: nothing is ever replaced
        except FileExistsError:
            pass  # another process created it first: append to that file
        except OSError:
            pass  # no hard links on this file system: _prepare initialises it in place
    except SQLITE_ERRORS as exc:
        raise RecordingFileError(f"{path}: could not create the recording ({_why(exc)})") from exc
    finally:
        for leftover in (tmp, tmp + "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def _prepare(con: sqlite3.Connection, path: str, version: int = FORMAT_VERSION) -> None:
    """Make the open file ready for appending runs of format ``version``: check it is a
    recording this nddebug may write, bring an older layout up to ``version`` (version 3
    adds the chunks table; the runs already there stay as they are and still load), and
    initialise an empty or half-created file that holds no runs. Anything else is refused and
    left untouched."""
    try:
        layout, rows = _layout(con)
    except DAMAGED as exc:
        raise RecordingFileError(f"{path}: exists and is not a recording ({_why(exc)})") from exc
    if layout in (_EMPTY, _HALF):
        # Decide again under the write lock: another process may be initialising it too.
        with con:
            con.execute("BEGIN IMMEDIATE")
            layout, rows = _layout(con)
            if layout == _EMPTY or (layout == _HALF and not rows):
                tables = [n for (n,) in con.execute("SELECT name FROM sqlite_master")]
                _initialise(con, drop=[n for n in tables if n in _TABLES], version=version)
                return
    if layout != _RECORDING:
        raise _not_a_recording(path, layout, rows, writing=True)
    _check_format(con, path, writing=True)
    if _has_version(con, version):
        return
    with con:
        # Older layouts are a subset of newer ones: the file now holds ``version`` (decided
        # again under the write lock: another process may have upgraded it meanwhile).
        con.execute("BEGIN IMMEDIATE")
        if _has_version(con, version):
            return
        for statement in _VERSION_STATEMENTS[version]:
            con.execute(statement)
        con.execute(
            "UPDATE meta SET value = ? WHERE key = 'format_version' AND CAST(value AS INTEGER) < ?",
            (str(version), version),
        )
        if version >= 3:
            con.execute("UPDATE meta SET value = ? WHERE key = 'description'", (_DESCRIPTION_3,))


def _has_version(con: sqlite3.Connection, version: int) -> bool:
    """Whether the file (checked by _check_format) already has the tables and the
    format_version of ``version`` or a later one."""
    tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    row = con.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
    return _VERSION_TABLES[version] <= tables and int(row[0] if row else 0) >= version


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
    except DAMAGED as exc:
        raise RecordingFileError(f"{path}: exists and is not a recording ({_why(exc)})") from exc
    finally:
        con.close()


def save(
    recordings: Iterable[Recording], path: str, *, format_version: int = FORMAT_VERSION
) -> None:
    """Append runs to ``path``; each run is one transaction, so an interruption loses at most
    the run being written. A run already in the file (same run_id) is left as it is. A new
    file appears complete (schema and meta) or not at all.

    Runs are written in format ``format_version``: 4 (the default: op executions as
    compressed columns, each row's check bound to its run), 3 (the same with checks of each
    row alone, which nddebug before format 4 reads) or 2 (one JSON row per op execution,
    which nddebug before format 3 reads; a new file is then made a file of that version).
    Appending runs of a newer format to a file of an older version upgrades it in place, in
    one transaction: the runs already there keep their rows and still load, and the file then
    reads as the newer version (an older nddebug refuses it as newer)."""
    if format_version not in WRITABLE_VERSIONS:
        raise ValueError(
            f"format_version must be one of {WRITABLE_VERSIONS}, got {format_version!r}"
        )
    bind = format_version >= 4  # checks bound to the run (see FORMAT_VERSION)

    def write(con: sqlite3.Connection, rec: Recording) -> None:
        if format_version >= 3:
            _save_run(con, rec, bind)
        else:
            _save_run_rows(con, rec)

    _create(path, format_version)
    con = _connect(path, create=True)
    try:
        _prepare(con, path, format_version)
        for rec in recordings:
            write(con, rec)
    except SQLITE_ERRORS as exc:
        raise RecordingFileError(f"{path}: could not write the recording ({_why(exc)})") from exc
    except RecordingFileError as exc:
        if path in str(exc):
            raise
        raise RecordingFileError(f"{path}: {exc}") from exc
    finally:
        con.close()


def _has_run(con: sqlite3.Connection, run_id: str) -> bool:
    return bool(con.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchall())


def _insert_run(
    con: sqlite3.Connection, rec: Recording, status: str, warnings: list[str], bind: bool = False
) -> None:
    """The run's row (in the open transaction, which holds the write lock: processes may
    append concurrently, and the ordinal is chosen under it) and its ops."""
    ordinal = con.execute("SELECT COALESCE(MAX(ordinal), -1) + 1 FROM runs").fetchone()[0]
    con.execute(
        "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            rec.run_id,
            ordinal,
            rec.label,
            status,
            rec.kind,
            rec.digest_algorithm,
            _run_environment(rec, status, rec.environment, warnings),
            json.dumps(warnings),
            _now(),
        ),
    )
    con.executemany(
        "INSERT INTO ops VALUES (?, ?, ?)",
        [
            (rec.run_id, op.op_id, _op_json(op, rec.run_id if bind else None))
            for op in rec.ops.values()
        ],
    )


def _run_environment(
    rec: Recording, status: str, environment: dict[str, Any], warnings: list[str]
) -> str:
    """A run row's environment column: the environment's JSON with the check of the whole
    row (see :data:`_ROW_CHECK`)."""
    return _with_check(
        json.dumps(environment, default=str),
        rec.run_id,
        rec.label,
        status,
        rec.kind,
        rec.digest_algorithm,
        json.dumps(warnings),
    )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _op_json(op: OpInfo, run_id: str | None = None) -> str:
    """An op's info row, with its check; bound to ``run_id`` where given (format 4)."""
    body = json.dumps(dataclasses.asdict(op), default=str)
    if run_id is None:
        return _with_check(body)
    return _with_check(body, run_id, key=_RUN_CHECK)


#: How a JSON object row that carries a check begins (an op's info; a run's environment,
#: which checks the whole run row): ``{"row_check": "<8 hex digits>", ...}``, the CRC-32 of
#: the object's text without that key (and, for a run, of its other columns). A flipped bit
#: in an op's key or a run's label otherwise read as another op or run, and the report
#: changed its verdict without a word (probe round 32, F2); with the check it is damage.
#: Readers that predate it ignore the key; rows written before it have none (nothing to
#: verify).
_ROW_CHECK = '{"row_check": "'
#: The same for a row bound to its run (format 4): its check includes the run_id, so a row
#: copied into another run is damage too.
_RUN_CHECK = '{"run_check": "'


def _row_crc(body: str, others: tuple[Any, ...]) -> str:
    head = "|".join(str(o) for o in others).encode()
    return f"{zlib.crc32(body.encode(), zlib.crc32(head)):08x}"


def _with_check(body: str, *others: Any, key: str = _ROW_CHECK) -> str:
    """``body`` (a JSON object's text) with the check of it and of ``others`` as its first
    key (see :data:`_ROW_CHECK`, :data:`_RUN_CHECK`)."""
    if not body.startswith("{"):
        return body
    rest = body[1:] if body == "{}" else ", " + body[1:]
    return f'{key}{_row_crc(body, others)}"{rest}'


def _without_check(text: Any, *others: Any, run_id: str | None = None) -> Any:
    """The text a row's check was made over: ``text`` without its check, which is verified
    against it and ``others`` (RowError where a byte changed); a check bound to its run
    (:data:`_RUN_CHECK`) against ``run_id`` too. Text with no check is returned as it is."""
    if isinstance(text, str) and text.startswith(_RUN_CHECK):
        if run_id is None:
            raise RowError("its check is bound to a run, and no run was given to verify it")
        moved = " or it was moved from another run"
        return _strip_check(text, _RUN_CHECK, (*others, run_id), moved)
    if not isinstance(text, str) or not text.startswith(_ROW_CHECK):
        return text
    return _strip_check(text, _ROW_CHECK, others, "")


def _strip_check(text: str, key: str, others: tuple[Any, ...], moved: str) -> str:
    at = len(key)
    crc, rest = text[at : at + 8], text[at + 8 :]
    if rest == '"}':
        body = "{}"
    elif rest.startswith('", '):
        body = "{" + rest[3:]
    else:
        raise RowError("its check is not followed by the row it checks (a byte changed)")
    if crc != _row_crc(body, others):
        raise RowError(f"its check does not match what it holds (a byte changed{moved})")
    return body


def _save_run(con: sqlite3.Connection, rec: Recording, bind: bool = True) -> None:
    """One run in format 4 (3 without ``bind``): its events as chunks of columns, all in one
    transaction."""
    if _has_run(con, rec.run_id):
        return
    events = _in_seq_order(rec.events)
    # Encoded before the write lock is taken: other writers wait only for the inserts.
    chunks = [
        _encode_chunk(events[i : i + CHUNK_EVENTS]) for i in range(0, len(events), CHUNK_EVENTS)
    ]
    _check_ops(chunks, set(rec.ops), rec.ops)
    values = _value_rows(rec.run_id, rec.values)
    with con:
        con.execute("BEGIN IMMEDIATE")
        _insert_run(con, rec, rec.status, rec.warnings, bind)
        _insert_chunks(con, rec.run_id, 0, chunks, bind)
        con.executemany("INSERT INTO captured VALUES (?, ?, ?, ?)", values)


def _save_run_rows(con: sqlite3.Connection, rec: Recording) -> None:
    """One run in format 2: one JSON row per op execution."""
    if _has_run(con, rec.run_id):
        return
    with con:
        con.execute("BEGIN IMMEDIATE")
        _insert_run(con, rec, rec.status, rec.warnings)
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
        con.executemany(
            "INSERT INTO captured VALUES (?, ?, ?, ?)", _value_rows(rec.run_id, rec.values)
        )


def _value_rows(run_id: str, values: Mapping[str, Any]) -> list[tuple[str, str, str, bytes]]:
    rows = []
    for name, value in values.items():
        array = np.asarray(value)
        buf = io.BytesIO()
        np.save(buf, _portable(array), allow_pickle=False)
        rows.append((run_id, name, array.dtype.name, buf.getvalue()))
    return rows


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


# ------------------------------------------------------------------ format 3: chunks of columns
#
# A chunk holds up to CHUNK_EVENTS op executions of one run as little-endian NumPy arrays,
# each zlib-compressed when that makes it smaller, concatenated in ``data`` and listed in
# ``arrays`` (JSON: name -> [dtype, codec, count, offset, nbytes]). Per execution:
#   op_id, call             integers; call = first_seq + cumsum(stored), seq likewise when
#                           stored (absent: first_seq, first_seq + 1, ...)
#   outputs                 number of output digests
#   inputs, shapes, reruns  number of entries + 1; 0 = None (absent array: all None)
# then, per shape, ``ranks`` (rank + 1, 0 = None) and ``dims`` (``null_dims``: positions of
# None dims), and per extra execution ``rerun_outputs`` (its number of digests). Every digest
# slot (per execution: its outputs, its inputs, then each extra execution's outputs) is one
# ``codes`` entry: 0 = None, 1 = the next new entry of the chunk's dictionary ``digests``
# (its lo values, then its hi values), c >= 2 = the entry c - 1 places before the end of the
# dictionary so far. Most inputs are an earlier output: a small code instead of 16 bytes.

_UINTS = ("|u1", "<u2", "<u4", "<u8")
_SINTS = ("|i1", "<i2", "<i4", "<i8")
_DTYPES = frozenset((*_UINTS, *_SINTS))
_CODECS = ("raw", "zlib")
_REQUIRED = ("op_id", "call", "outputs", "inputs", "codes", "digests")
_OPTIONAL = ("seq", "shapes", "ranks", "dims", "null_dims", "reruns", "rerun_outputs")
_INT64_MAX = np.iinfo(np.int64).max


@dataclasses.dataclass
class _Chunk:
    """One encoded chunk: the columns of its ``chunks`` row (run_id and chunk number apart)."""

    first_seq: int
    last_seq: int
    events: int
    outputs: int
    inputs: int
    entries: int
    arrays: str
    data: bytes
    op_ids: set[int]


def _narrow(values: np.ndarray) -> np.ndarray:
    """Integers (int64) as the narrowest little-endian integer dtype that holds them all."""
    if not values.size:
        return values.astype("|u1")
    lo, hi = int(values.min()), int(values.max())
    for dtype in _UINTS if lo >= 0 else _SINTS:
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return values.astype(dtype)
    raise AssertionError("int64 values always fit <i8")  # pragma: no cover


def _delta(values: np.ndarray, first: int) -> np.ndarray:
    """The steps from ``first`` (int64, mod 2**64): values = first + cumsum(steps)."""
    return np.diff(values, prepend=np.array([first], np.int64))  # array ops wrap silently


def _undelta(steps: np.ndarray, first: int) -> np.ndarray:
    out = np.cumsum(steps.astype(np.int64), dtype=np.int64)
    out += np.int64(first)
    return out


def _pack(arrays: dict[str, np.ndarray]) -> tuple[str, bytes]:
    """The ``arrays`` directory (JSON) and ``data`` of a chunk."""
    directory: dict[str, list[Any]] = {}
    parts = []
    offset = 0
    for name, array in arrays.items():
        raw = array.tobytes()
        packed = zlib.compress(raw, ZLIB_LEVEL) if len(raw) > 16 else raw
        codec = "zlib" if len(packed) < len(raw) else "raw"
        blob = packed if codec == "zlib" else raw
        directory[name] = [array.dtype.str, codec, int(array.size), offset, len(blob)]
        parts.append(blob)
        offset += len(blob)
    return json.dumps(directory, separators=(",", ":")), b"".join(parts)


def _int64s(values: list[Any], what: str) -> np.ndarray:
    try:
        return np.array(values, dtype=np.int64)
    except (OverflowError, TypeError, ValueError) as exc:
        raise RecordingFileError(f"cannot store {what}: not all 64-bit integers ({exc})") from None


def _in_seq_order(events: Sequence[Event]) -> list[Event]:
    """The events in seq order (as format 2 returned them); a seq that repeats is refused."""
    events = list(events)
    seqs = [ev.seq for ev in events]
    if any(a >= b for a, b in itertools.pairwise(seqs)):
        events.sort(key=lambda ev: ev.seq)
        seqs = [ev.seq for ev in events]
        for a, b in itertools.pairwise(seqs):
            if a == b:
                raise RecordingFileError(f"cannot store two op executions with seq {a}")
    return events


def _dictionary(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes (int64, one per row of ``slots``: [lo, hi] int64) and the dictionary (distinct
    rows in order of first appearance): 1 for a new row, 1 + distance back otherwise."""
    if not len(slots):
        return np.zeros(0, np.int64), np.zeros((0, 2), np.int64)
    keys = np.ascontiguousarray(slots).view(np.dtype((np.void, 16))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    origin = first[inverse.ravel()]  # the slot where each slot's value first appears
    is_new = origin == np.arange(len(slots))
    defined = np.cumsum(is_new)  # entries defined up to and including each slot
    index = defined[origin] - 1  # the dictionary entry of each slot's value
    before = defined - is_new  # entries defined before each slot
    codes = np.where(is_new, 1, 1 + before - index)
    return codes, slots[is_new]


def _encode_chunk(events: Sequence[Event]) -> _Chunk:
    """Encode events (in seq order, seq strictly increasing) as one chunk."""
    seqs: list[Any] = []
    op_ids: list[Any] = []
    calls: list[Any] = []
    n_out: list[int] = []
    n_in: list[int] = []
    n_shapes: list[int] = []
    ranks: list[int] = []
    dims: list[Any] = []
    n_reruns: list[int] = []
    rerun_outputs: list[int] = []
    flat: list[Any] = []  # every digest slot, in order
    extend = flat.extend
    for ev in events:
        seqs.append(ev.seq)
        op_ids.append(ev.op_id)
        calls.append(ev.call)
        digests = ev.digests
        n_out.append(len(digests))
        extend(digests)
        inputs = ev.inputs
        if inputs is None:
            n_in.append(0)
        else:
            n_in.append(len(inputs) + 1)
            extend(inputs)
        reruns = ev.reruns
        if reruns is None:
            n_reruns.append(0)
        else:
            n_reruns.append(len(reruns) + 1)
            for again in reruns:
                rerun_outputs.append(len(again))
                extend(again)
        shapes = ev.shapes
        if shapes is None:
            n_shapes.append(0)
        else:
            n_shapes.append(len(shapes) + 1)
            for shape in shapes:
                if shape is None:
                    ranks.append(0)
                else:
                    ranks.append(len(shape) + 1)
                    dims.extend(shape)
    n = len(events)
    seq = _int64s(seqs, "the seq of an op execution")
    first_seq = int(seq[0])
    if n > 1 and not (seq[1:] > seq[:-1]).all():
        raise RecordingFileError("op executions must be stored in order of strictly rising seq")
    null = np.fromiter((d is None for d in flat), bool, len(flat))
    present = [d for d in flat if d is not None] if null.any() else flat
    values = (
        _int64s(present, "an op execution's digests") if present else np.zeros((0, 2), np.int64)
    )
    if values.ndim != 2 or values.shape[1] != 2:
        raise RecordingFileError("cannot store a digest that is not a pair [lo, hi]")
    codes_present, entries = _dictionary(values)
    codes = np.zeros(len(flat), np.int64)
    codes[~null] = codes_present
    n_in_arr = np.array(n_in, np.int64)
    arrays = {"op_id": _narrow(_int64s(op_ids, "an op id"))}
    if int(seq[-1]) - first_seq != n - 1:
        arrays["seq"] = _narrow(_delta(seq, first_seq))
    arrays["call"] = _narrow(_delta(_int64s(calls, "the call of an op execution"), first_seq))
    arrays["outputs"] = _narrow(np.array(n_out, np.int64))
    arrays["inputs"] = _narrow(n_in_arr)
    arrays["codes"] = _narrow(codes)
    arrays["digests"] = np.ascontiguousarray(entries.T).astype("<i8").ravel()
    if any(n_shapes):
        arrays["shapes"] = _narrow(np.array(n_shapes, np.int64))
        arrays["ranks"] = _narrow(np.array(ranks, np.int64))
        nulls = [i for i, d in enumerate(dims) if d is None] if None in dims else []
        for i in nulls:
            dims[i] = 0
        arrays["dims"] = _narrow(_int64s(dims, "a shape"))
        if nulls:
            arrays["null_dims"] = _narrow(np.array(nulls, np.int64))
    if any(n_reruns):
        arrays["reruns"] = _narrow(np.array(n_reruns, np.int64))
        arrays["rerun_outputs"] = _narrow(np.array(rerun_outputs, np.int64))
    directory, data = _pack(arrays)
    outputs, inputs = int(sum(n_out)), int(np.maximum(n_in_arr - 1, 0).sum())
    check = _chunk_check((first_seq, n, outputs, inputs, len(entries), directory), data)
    return _Chunk(
        first_seq=first_seq,
        last_seq=int(seq[-1]),
        events=n,
        outputs=outputs,
        inputs=inputs,
        entries=len(entries),
        arrays=directory,
        data=data + check,
        op_ids=set(op_ids),
    )


#: A chunk's ``data`` ends with a check of the whole row: these 4 bytes, then the CRC-32
#: (little-endian) of its other columns and its arrays' bytes. A bit flipped in a number the
#: arrays hold raw (an op id, a count) read as another run; with the check it is damage.
#: Chunks written before it have no check (nothing to verify); readers that predate it read
#: the arrays by their offsets and never look past them.
_CHECK_MAGIC = b"ndck"
_CHECK_SIZE = len(_CHECK_MAGIC) + 4


#: The same check bound to the chunk's run (format 4): the CRC-32 covers the run_id too, so a
#: chunk copied into another run is damage (probe round 35).
_RUN_CHECK_MAGIC = b"ndcr"


def _chunk_check(columns: tuple[Any, ...], arrays: bytes, run_id: str | None = None) -> bytes:
    """The check that ends a chunk's data (see :data:`_CHECK_MAGIC`), bound to ``run_id``
    where given (:data:`_RUN_CHECK_MAGIC`)."""
    head = "|".join(str(c) for c in (*columns, *([run_id] if run_id is not None else []))).encode()
    crc = zlib.crc32(arrays, zlib.crc32(head))
    magic = _CHECK_MAGIC if run_id is None else _RUN_CHECK_MAGIC
    return magic + crc.to_bytes(4, "little")


def _bound(chunk: _Chunk, run_id: str) -> bytes:
    """A chunk's data with its check bound to ``run_id`` (format 4)."""
    arrays = chunk.data[:-_CHECK_SIZE]
    columns = (chunk.first_seq, chunk.events, chunk.outputs, chunk.inputs, chunk.entries)
    return arrays + _chunk_check((*columns, chunk.arrays), arrays, run_id)


def _check_ops(chunks: list[_Chunk], known: set[int], ops: Mapping[int, OpInfo]) -> None:
    for chunk in chunks:
        missing = chunk.op_ids - known
        if missing:
            raise RecordingFileError(
                f"cannot store op executions of op {min(missing)}: it is not among the "
                f"run's ops ({len(ops)} known)"
            )


def _insert_chunks(
    con: sqlite3.Connection, run_id: str, number: int, chunks: list[_Chunk], bind: bool = True
) -> None:
    con.executemany(
        "INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                run_id,
                number + k,
                c.first_seq,
                c.events,
                c.outputs,
                c.inputs,
                c.entries,
                c.arrays,
                _bound(c, run_id) if bind else c.data,
            )
            for k, c in enumerate(chunks)
        ],
    )


# ------------------------------------------------------------------ decoding a chunk


@dataclasses.dataclass
class _Columns:
    """One decoded chunk: per execution seq, op_id, call; the digest slots as dictionary
    indices into ``entries`` (-1 for None) with each execution's first slot ``start``; the
    counts (inputs, shapes, reruns: count + 1, 0 = None)."""

    seq: np.ndarray
    op_id: np.ndarray
    call: np.ndarray
    n_out: np.ndarray
    n_in: np.ndarray
    start: np.ndarray  # [n + 1]: first slot of each execution in ``index``
    index: np.ndarray
    entries: np.ndarray  # [k, 2] int64
    arrays: dict[str, np.ndarray]


def _unpack(
    directory_text: Any, data: Any, n: int, columns: tuple[Any, ...], run_id: str | None = None
) -> dict[str, np.ndarray]:
    """The arrays of a chunk, checked against its directory and, given the row's other
    ``columns``, against the check that ends its data (chunks written before it have none)."""
    if not isinstance(data, bytes):
        raise RowError(f"its data is {type(data).__name__}, not bytes")
    directory = _json(directory_text, "its arrays directory")
    if not isinstance(directory, dict):
        raise RowError(f"its arrays directory is JSON {json_kind(directory)}, not an object")
    out = {}
    end = 0
    for name, spec in directory.items():
        if name not in _REQUIRED and name not in _OPTIONAL:
            raise RowError(f"it has an unknown array {name!r}")
        if not (
            isinstance(spec, list)
            and len(spec) == 5
            and spec[0] in _DTYPES
            and spec[1] in _CODECS
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in spec[2:])
        ):
            raise RowError(f"its array {name!r} is described as {spec!r:.80}")
        dtype, codec, count, offset, nbytes = spec
        if offset + nbytes > len(data):
            raise RowError(f"its array {name!r} lies beyond the end of its data")
        blob = data[offset : offset + nbytes]
        end = max(end, offset + nbytes)
        expected = count * np.dtype(dtype).itemsize
        if codec == "zlib":
            try:
                unzip = zlib.decompressobj()
                raw = unzip.decompress(blob, expected)
                complete = unzip.eof and not unzip.unconsumed_tail and not unzip.unused_data
            except zlib.error as exc:
                raise RowError(f"its array {name!r} is not readable zlib data ({exc})") from None
        else:
            raw, complete = blob, True
        if len(raw) != expected or not complete:
            raise RowError(f"its array {name!r} does not hold {count} values of {dtype}")
        out[name] = np.frombuffer(raw, dtype=dtype)
    for name in _REQUIRED:
        if name not in out:
            raise RowError(f"it lacks the array {name!r}")
    _verify_check(data, end, columns, run_id)
    for name in ("op_id", "call", "outputs", "inputs", "seq", "shapes", "reruns"):
        if name in out and len(out[name]) != n:
            raise RowError(f"its array {name!r} has {len(out[name])} values for {n} executions")
    return out


def _counts(values: np.ndarray, name: str, limit: int = 1 << 40) -> np.ndarray:
    """Counts as int64, checked to be >= 0 and small enough to add up safely."""
    if values.size and (values.min() < 0 or values.max() > limit):
        raise RowError(f"its array {name!r} holds a count out of range")
    return values.astype(np.int64)


def _ragged(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The positions starts[i] + 0 .. counts[i] - 1 of every i, concatenated."""
    total = int(counts.sum())
    if not total:
        return np.zeros(0, np.int64)
    shift = starts - (np.cumsum(counts) - counts)
    return np.repeat(shift, counts) + np.arange(total, dtype=np.int64)


def _verify_check(data: bytes, end: int, columns: tuple[Any, ...], run_id: str | None) -> None:
    """Compare the check after a chunk's arrays (if any) with the row it was written for, and
    a check bound to its run with ``run_id``."""
    tail = data[end:]
    if not tail:
        return  # written before chunks had a check
    bound = tail.startswith(_RUN_CHECK_MAGIC)
    if len(tail) != _CHECK_SIZE or not (bound or tail.startswith(_CHECK_MAGIC)):
        raise RowError(f"its data has {len(tail)} byte(s) after its arrays that are not a check")
    if bound and run_id is None:
        raise RowError("its check is bound to a run, and no run was given to verify it")
    if tail != _chunk_check(columns, data[:end], run_id if bound else None):
        moved = " or it was moved from another run" if bound else ""
        raise RowError(f"its check does not match what it holds (a byte changed{moved})")


def _decode_chunk(
    row: tuple, ops: Mapping[int, OpInfo] | None, run_id: str | None = None
) -> _Columns:
    """A ``chunks`` row (first_seq, events, outputs, inputs, entries, arrays, data) decoded and
    checked (RowError says what is wrong); ops: the run's ops, to check the op ids."""
    first_seq, n, n_outputs, n_inputs, n_entries, directory, data = row
    for name, value in (("first_seq", first_seq), ("events", n), ("outputs", n_outputs)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise RowError(f"its {name} is {json_kind(value)} {value!r:.60}, not an integer")
    for name, value in (("inputs", n_inputs), ("entries", n_entries)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise RowError(f"its {name} is {json_kind(value)} {value!r:.60}, not an integer")
    if n <= 0:
        raise RowError(f"it holds {n} op executions")
    columns = (first_seq, n, n_outputs, n_inputs, n_entries, directory)
    a = _unpack(directory, data, n, columns, run_id)
    op_id = a["op_id"].astype(np.int64)
    if ops is not None:
        known = np.fromiter(ops, np.int64, len(ops))
        bad = ~np.isin(op_id, known)
        if bad.any():
            raise RowError(
                f"an op execution names op {int(op_id[bad][0])}, which is not in the ops table"
            )
    seq = (
        _undelta(a["seq"], first_seq)
        if "seq" in a
        else np.arange(first_seq, first_seq + n, dtype=np.int64)
    )
    if n > 1 and not (seq[1:] > seq[:-1]).all():
        raise RowError("its seq values do not rise")
    if int(seq[0]) != first_seq:
        raise RowError(f"its first seq is {int(seq[0])}, not first_seq {first_seq}")
    call = _undelta(a["call"], first_seq)
    n_out = _counts(a["outputs"], "outputs")
    n_in = _counts(a["inputs"], "inputs")
    in_slots = np.maximum(n_in - 1, 0)
    slots = n_out + in_slots
    if "rerun_outputs" in a and "reruns" not in a:
        raise RowError("it has rerun_outputs without reruns")
    if "reruns" in a:
        n_reruns = _counts(a["reruns"], "reruns")
        rerun_outputs = _counts(
            a["rerun_outputs"] if "rerun_outputs" in a else a["reruns"][:0], "rerun_outputs"
        )
        per_event = np.maximum(n_reruns - 1, 0)
        if int(per_event.sum()) != len(rerun_outputs):
            raise RowError("its reruns and rerun_outputs do not agree")
        ends = np.concatenate([[0], np.cumsum(rerun_outputs)])
        bounds = np.concatenate([[0], np.cumsum(per_event)])
        slots = slots + (ends[bounds[1:]] - ends[bounds[:-1]])
    if "shapes" in a:
        n_shapes = _counts(a["shapes"], "shapes")
        ranks = _counts(a.get("ranks", a["shapes"][:0]), "ranks")
        if int(np.maximum(n_shapes - 1, 0).sum()) != len(ranks):
            raise RowError("its shapes and ranks do not agree")
        dims = a.get("dims", a["shapes"][:0])
        if int(np.maximum(ranks - 1, 0).sum()) != len(dims):
            raise RowError("its ranks and dims do not agree")
        if "null_dims" in a:
            null_dims = a["null_dims"]
            if null_dims.size and (null_dims.min() < 0 or int(null_dims.max()) >= len(dims)):
                raise RowError("its null_dims point outside dims")
    elif any(k in a for k in ("ranks", "dims", "null_dims")):
        raise RowError("it has shape arrays without shapes")
    start = np.zeros(n + 1, np.int64)
    np.cumsum(slots, out=start[1:])
    codes = a["codes"]
    if len(codes) != int(start[-1]):
        raise RowError(f"it has {len(codes)} digest codes for {int(start[-1])} digests")
    if int(n_out.sum()) != n_outputs or int(in_slots.sum()) != n_inputs:
        raise RowError("its outputs or inputs column does not match its arrays")
    digests = a["digests"]
    if len(digests) != 2 * n_entries:
        raise RowError(f"its dictionary has {len(digests)} values for {n_entries} entries")
    if codes.size and (codes.min() < 0 or codes.max() > _INT64_MAX):
        raise RowError("it has a digest code out of range")
    codes = codes.astype(np.int64)
    is_new = codes == 1
    before = np.cumsum(is_new) - is_new
    index = np.where(is_new, before, before - (codes - 1))
    index[codes == 0] = -1
    if int(is_new.sum()) != n_entries or (index < -1).any() or ((codes >= 2) & (index < 0)).any():
        raise RowError("its digest codes do not match its dictionary")
    entries = digests.astype(np.int64).reshape(2, n_entries).T
    return _Columns(seq, op_id, call, n_out, n_in, start, index, entries, a)


def _chunk_events(c: _Columns, seqs: tuple[int, int] | None = None) -> list[Event]:
    """Event objects of a decoded chunk (with ``seqs`` (lo, hi): of its executions with a seq
    in that range only)."""
    lo, hi = seqs if seqs is not None else (-(1 << 63), (1 << 63) - 1)
    table: list[Any] = list(zip(c.entries[:, 0].tolist(), c.entries[:, 1].tolist(), strict=True))
    table.append(None)  # index -1
    slots = [table[i] for i in c.index.tolist()]
    n = len(c.seq)
    shapes: list[Any] = [None] * n
    if "shapes" in c.arrays:
        dims = c.arrays["dims"].astype(np.int64).tolist() if "dims" in c.arrays else []
        for i in c.arrays.get("null_dims", np.zeros(0, np.int64)).tolist():
            dims[i] = None
        ranks = c.arrays["ranks"].tolist()
        r = d = 0
        for i, k in enumerate(c.arrays["shapes"].tolist()):
            if k:
                one = []
                for rank in ranks[r : r + k - 1]:
                    one.append(dims[d : d + rank - 1] if rank else None)
                    d += max(rank - 1, 0)
                r += k - 1
                shapes[i] = one
    reruns: list[Any] = [None] * n
    if "reruns" in c.arrays:
        lengths = c.arrays["rerun_outputs"].tolist() if "rerun_outputs" in c.arrays else []
        starts = c.start.tolist()
        outs, ins = c.n_out.tolist(), c.n_in.tolist()
        j = 0
        for i, k in enumerate(c.arrays["reruns"].tolist()):
            if k:
                s = starts[i] + outs[i] + max(ins[i] - 1, 0)
                again = []
                for length in lengths[j : j + k - 1]:
                    again.append(slots[s : s + length])
                    s += length
                j += k - 1
                reruns[i] = again
    starts = c.start[:-1]
    mids = starts + c.n_out  # where each execution's inputs start
    ends = mids + np.maximum(c.n_in - 1, 0)
    # (An explicit loop: about 1 microsecond per execution, most of it Event's __init__.)
    events = []
    append = events.append
    for seq, op_id, call, s, m, e, has, shape, again in zip(
        c.seq.tolist(),
        c.op_id.tolist(),
        c.call.tolist(),
        starts.tolist(),
        mids.tolist(),
        ends.tolist(),
        (c.n_in > 0).tolist(),
        shapes,
        reruns,
        strict=True,
    ):
        if lo <= seq <= hi:
            append(Event(seq, op_id, call, slots[s:m], slots[m:e] if has else None, shape, again))
    return events


_CHUNK_COLUMNS = "first_seq, events, outputs, inputs, entries, arrays, data"


def _read_chunks(
    con: sqlite3.Connection,
    run_id: str,
    ops: Mapping[int, OpInfo],
    seqs: tuple[int, int] | None = None,
) -> Iterable[tuple[int, _Columns]]:
    """The run's chunks, decoded, in order (RowError: a chunk is missing or damaged); with
    ``seqs`` (lo, hi) only those that may hold an execution in that range."""
    query = f"SELECT chunk, {_CHUNK_COLUMNS} FROM chunks WHERE run_id = ? ORDER BY chunk"
    if seqs is not None:
        starts = con.execute(
            "SELECT chunk, first_seq FROM chunks WHERE run_id = ? ORDER BY chunk", (run_id,)
        ).fetchall()
        lo, hi = seqs
        for i, (number, first) in enumerate(starts):
            if first <= hi and (i + 1 == len(starts) or starts[i + 1][1] > lo):
                row = con.execute(
                    f"SELECT {_CHUNK_COLUMNS} FROM chunks WHERE run_id = ? AND chunk = ?",
                    (run_id, number),
                ).fetchone()
                try:
                    yield number, _decode_chunk(tuple(row), ops, run_id)
                except RowError as exc:
                    raise RowError(f"chunk {number}: {exc}") from None
        return
    last = None
    for k, (number, *row) in enumerate(con.execute(query, (run_id,))):
        if number != k:
            raise RowError(f"its chunk {k} is missing (the next is {number!r})")
        try:
            c = _decode_chunk(tuple(row), ops, run_id)
        except RowError as exc:
            raise RowError(f"chunk {k}: {exc}") from None
        if last is not None and int(c.seq[0]) <= last:
            raise RowError(f"chunk {k}: its first seq {int(c.seq[0])} does not follow {last}")
        last = int(c.seq[-1])
        yield k, c


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


_RUN_COLUMNS = "run_id, label, status, kind, digest_algorithm, environment, warnings"


def _read_header(con: sqlite3.Connection, row: tuple) -> Recording:
    """A run's row and its ops, checked (no events yet)."""
    run_id, label, status, kind, algorithm, env, warnings = row
    if not isinstance(run_id, str):
        raise RowError(f"its run_id is {type(run_id).__name__}, not text")
    warned = _json(warnings, "the warnings")
    if not isinstance(warned, list) or not all(isinstance(w, str) for w in warned):
        raise RowError(f"the warnings are {warned!r:.60}, not a list of strings")
    if _text(status, "the status") not in STATUSES:
        raise RowError(f"its status is {status!r}, not one of {', '.join(STATUSES)}")
    if _text(kind, "the kind") not in KINDS:
        raise RowError(f"its kind is {kind!r}, not one of {', '.join(KINDS)}")
    # Values of the right form can still be damaged ones: the row's check says.
    env = _without_check(env, run_id, label, status, kind, algorithm, warnings)
    environment = _json(env, "the environment")
    if not isinstance(environment, dict):
        raise RowError(f"the environment is JSON {json_kind(environment)}, not an object")
    environment.pop("row_check", None)  # a check SQLite's JSON functions rewrote: not verified
    rec = Recording(
        label=_text(label, "the label", null=True),
        run_id=run_id,
        status=status,
        kind=kind,
        digest_algorithm=_text(algorithm, "the digest algorithm"),
        environment=environment,
        warnings=warned,
    )
    for op_id, info in con.execute("SELECT op_id, info FROM ops WHERE run_id = ?", (run_id,)):
        try:
            info = _without_check(info, run_id=run_id)
        except RowError as exc:
            raise RowError(f"op {op_id!r}'s info: {exc}") from None
        op = op_from_row(_json(info, f"op {op_id!r}'s info"))
        if op.op_id != op_id:
            raise RowError(f"op {op_id!r}'s info says op_id {op.op_id}")
        rec.ops[op.op_id] = op
    return rec


def _has_rows(con: sqlite3.Connection, run_id: str, tables: set[str]) -> bool:
    """Whether the run keeps its op executions as JSON rows (formats 1 and 2)."""
    return "events" in tables and bool(
        con.execute("SELECT 1 FROM events WHERE run_id = ? LIMIT 1", (run_id,)).fetchall()
    )


def _read_run(
    con: sqlite3.Connection, row: tuple, tables: set[str], seqs: tuple[int, int] | None = None
) -> Recording:
    """One run, every row checked against the data model (RowError says what is wrong); with
    ``seqs`` (lo, hi) only its op executions in that range of seqs."""
    rec = _read_header(con, row)
    run_id = rec.run_id
    lo, hi = seqs if seqs is not None else (-(1 << 63), (1 << 63) - 1)
    if "events" in tables:
        # (Without a range, every row is read: one whose seq is not a number must be seen.)
        in_range, args = ("AND seq BETWEEN ? AND ? ", (lo, hi)) if seqs is not None else ("", ())
        for seq, op_id, call, digests, inputs, shapes in con.execute(
            "SELECT seq, op_id, call, digests, inputs, shapes FROM events "
            f"WHERE run_id = ? {in_range}ORDER BY seq",
            (run_id, *args),
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
    if "chunks" in tables:
        rows = bool(rec.events)
        for k, chunk in _read_chunks(con, run_id, rec.ops, seqs):
            if rows:
                raise RowError(f"its op executions are both in events rows and in chunk {k}")
            rec.events.extend(_chunk_events(chunk, seqs))
    if "reruns" in tables:
        by_seq = {ev.seq: ev for ev in rec.events}
        for seq, digests in con.execute(
            "SELECT seq, digests FROM reruns WHERE run_id = ?", (run_id,)
        ):
            if seq not in by_seq:
                if seqs is not None:
                    continue  # outside the range read
                raise RowError(f"reruns name event seq {seq!r}, which is not in the events table")
            by_seq[seq].reruns = reruns_from_row(_json(digests, f"reruns of seq {seq}"), seq)
    for name, dtype, blob in con.execute(
        "SELECT name, dtype, npy FROM captured WHERE run_id = ?", (run_id,)
    ):
        what = f"captured value {name!r}"
        _text(name, "a captured value's name")
        head = str(name).split(":")[0]
        if seqs is not None and not (head.lstrip("-").isdigit() and lo <= int(head) <= hi):
            continue  # the value of an execution outside the range read
        _text(dtype, f"{what}: dtype")
        if not isinstance(blob, bytes):
            raise RowError(f"{what} is {type(blob).__name__}, not .npy bytes")
        try:
            rec.values[name] = _restore(np.load(io.BytesIO(blob), allow_pickle=False), dtype)
        except Exception as exc:  # noqa: BLE001 - any failure to parse untrusted bytes
            raise RowError(f"{what} is not a readable .npy array ({exc})") from None
    return rec


@contextlib.contextmanager
def _no_gc() -> Any:
    """The cyclic garbage collector paused: building millions of Event objects (which hold no
    cycles) would otherwise run it again and again, doubling the time a load takes."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def _reading(path: str) -> Iterator[tuple[sqlite3.Connection, set[str]]]:
    """An existing recording file open for reading, its format checked, with the names of its
    tables; an SQLite error while it is read is a RecordingFileError."""
    con = _connect(path, create=False)
    try:
        _check_format(con, path)
        try:
            tables = {
                r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            yield con, tables
        except DAMAGED as exc:
            raise RecordingFileError(
                f"{path}: the recording is damaged or incomplete ({_why(exc)})"
            ) from exc
    finally:
        con.close()


def salvage(path: str) -> tuple[list[Recording], list[str]]:
    """The runs of ``path`` that read back whole, and one line per run that does not (what is
    wrong with it). For a damaged file: save the runs into a new file to keep them. Raises
    RecordingFileError only if the file as a whole is unreadable."""
    with _reading(path) as (con, tables):
        runs = _runs_in_order(con)
        out, problems = [], []
        with _no_gc():
            for n, (rowid, run_id, label) in enumerate(runs, 1):
                name = f"run {n} of {len(runs)} (label {label!r}, run_id {run_id[:8]})"
                try:
                    with _rows_of_one_run():
                        out.append(_read_run(con, _run_row(con, rowid), tables))
                except RowError as exc:
                    problems.append(" ".join(f"{exc}, {name}".split()))  # one line
        return out, problems


def _runs_in_order(con: sqlite3.Connection) -> list[tuple[int, str, str | None]]:
    """Each run's rowid, run_id and label, in the order they were saved, read as bytes: a run
    whose row holds damaged text is still listed (and named), and read alone by
    :func:`_run_row`."""

    def text(value: Any) -> Any:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value

    return [
        (rowid, str(text(run_id)), text(label))
        for rowid, run_id, label in con.execute(
            "SELECT rowid, CAST(run_id AS BLOB), CAST(label AS BLOB) FROM runs ORDER BY ordinal"
        ).fetchall()
    ]


def _run_row(con: sqlite3.Connection, rowid: int) -> tuple:
    """One run's row (the columns :func:`_read_header` reads)."""
    return con.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE rowid = ?", (rowid,)).fetchone()


def load_run(path: str, run_id: str, seqs: tuple[int, int] | None = None) -> Recording:
    """The run ``run_id`` of ``path`` alone (RecordingFileError if it is not there or is
    damaged); with ``seqs`` (lo, hi) only its op executions with a seq in that range (a
    window of a long run: the chunks outside it are not read)."""
    with _reading(path) as (con, tables):
        row = con.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RecordingFileError(f"{path}: holds no run with run_id {run_id}")
        try:
            with _no_gc(), _rows_of_one_run():
                return _read_run(con, row, tables, seqs)
        except RowError as exc:
            raise RecordingFileError(f"{path}: damaged: {exc}, run_id {run_id[:8]}") from exc


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


# ------------------------------------------------------------------ streaming a long run


class RunWriter:
    """Write one run to a recording file while it is traced, a chunk at a time.

    ``RunWriter(path, recording)`` adds the run (its label, run_id, kind, digest algorithm,
    environment, warnings and any ops and events it already holds) at once, with status
    ``interrupted`` and :data:`UNCLOSED_WARNING` in its warnings. Each :meth:`append` commits
    its events as one chunk (split every ``chunk_events``), so a process that dies leaves
    every chunk appended so far readable: ``load`` gives that run with the events so far,
    status ``interrupted``. :meth:`close` sets the final status and warnings and adds captured
    values. As a context manager it closes with ``complete``, or ``interrupted`` if the block
    raised. The file is created as :func:`save` creates it (complete or not at all); other
    processes may append runs to it meanwhile. Safe to call from several threads (one at a
    time)."""

    def __init__(
        self, path: str, recording: Recording, *, chunk_events: int = CHUNK_EVENTS
    ) -> None:
        if chunk_events <= 0:
            raise ValueError(f"chunk_events must be positive, got {chunk_events}")
        self.path = path
        self.run_id = recording.run_id
        self.chunk_events = chunk_events
        self.events_written = 0
        self.chunks_written = 0
        self.closed = False
        self._recording = recording
        self._ops: dict[int, str] = {}  # op_id -> its JSON as written
        self._last_seq: int | None = None
        self._lock = threading.Lock()
        _create(path)
        self._con = _connect(path, create=True, threads=True)
        try:
            _prepare(self._con, path)
            if _has_run(self._con, self.run_id):
                raise RecordingFileError(
                    f"{path}: a run with run_id {self.run_id} is already in the file"
                )
            header = dataclasses.replace(recording, ops={}, events=[], values={})
            with self._con:
                self._con.execute("BEGIN IMMEDIATE")
                _insert_run(
                    self._con,
                    header,
                    "interrupted",
                    [*recording.warnings, UNCLOSED_WARNING],
                    bind=True,
                )
        except BaseException as exc:
            self._con.close()
            self.closed = True
            if isinstance(exc, sqlite3.Error):
                raise RecordingFileError(f"{path}: could not write the recording ({exc})") from exc
            raise
        if recording.ops or recording.events:
            self.append(recording.events, recording.ops)

    def append(self, events: Sequence[Event], ops: Mapping[int, OpInfo] | None = None) -> None:
        """Commit ``events`` (seqs above every seq appended before) as one chunk (several if
        more than ``chunk_events``), with the ops in ``ops`` that are new or changed since the
        last append. Every event's op must be in ``ops`` now or have been before."""
        ops = ops or {}
        with self._lock:
            if self.closed:
                raise RecordingFileError(f"{self.path}: the run {self.run_id[:8]} is closed")
            rows = self._changed_ops(ops)
            events = _in_seq_order(events)
            if events and self._last_seq is not None and events[0].seq <= self._last_seq:
                raise RecordingFileError(
                    f"{self.path}: op execution seq {events[0].seq} is not after the last one "
                    f"appended ({self._last_seq})"
                )
            size = self.chunk_events
            chunks = [_encode_chunk(events[i : i + size]) for i in range(0, len(events), size)]
            _check_ops(chunks, set(self._ops) | set(ops), ops)
            try:
                with self._con:
                    self._con.execute("BEGIN IMMEDIATE")
                    self._con.executemany("INSERT OR REPLACE INTO ops VALUES (?, ?, ?)", rows)
                    _insert_chunks(self._con, self.run_id, self.chunks_written, chunks)
            except SQLITE_ERRORS as exc:
                raise RecordingFileError(
                    f"{self.path}: could not write the recording ({_why(exc)})"
                ) from exc
            self._ops.update((op_id, text) for _, op_id, text in rows)
            self.chunks_written += len(chunks)
            self.events_written += len(events)
            if events:
                self._last_seq = events[-1].seq

    def _changed_ops(self, ops: Mapping[int, OpInfo]) -> list[tuple[str, int, str]]:
        rows = []
        for op_id, op in ops.items():
            if op.op_id != op_id:
                raise ValueError(f"ops[{op_id}] is op {op.op_id}")
            text = _op_json(op, self.run_id)
            if self._ops.get(op_id) != text:
                rows.append((self.run_id, op_id, text))
        return rows

    def close(
        self,
        status: str = "complete",
        *,
        warnings: list[str] | None = None,
        environment: dict[str, Any] | None = None,
        values: Mapping[str, Any] | None = None,
        ops: Mapping[int, OpInfo] | None = None,
    ) -> None:
        """Set the run's final ``status`` (``complete`` or ``interrupted``) and its
        ``warnings`` (by default those it was opened with), replace its environment if given,
        add the captured ``values`` and the ``ops`` that are new or changed since the last
        append, and release the file. Closing twice does nothing."""
        with self._lock:
            if self.closed:
                return
            rec = self._recording
            rows = _value_rows(self.run_id, values or {})
            changed = self._changed_ops(ops or {})
            try:
                with self._con:
                    self._con.execute("BEGIN IMMEDIATE")
                    self._con.executemany("INSERT OR REPLACE INTO ops VALUES (?, ?, ?)", changed)
                    warned = list(rec.warnings if warnings is None else warnings)
                    self._con.execute(
                        "UPDATE runs SET status = ?, warnings = ?, environment = ?, saved_at = ? "
                        "WHERE run_id = ?",
                        (
                            status,
                            json.dumps(warned),
                            _run_environment(
                                rec,
                                status,
                                rec.environment if environment is None else environment,
                                warned,
                            ),
                            _now(),
                            self.run_id,
                        ),
                    )
                    self._con.executemany("INSERT INTO captured VALUES (?, ?, ?, ?)", rows)
            except SQLITE_ERRORS as exc:
                raise RecordingFileError(
                    f"{self.path}: could not write the recording ({_why(exc)})"
                ) from exc
            self.closed = True
            self._con.close()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        self.close("complete" if kind is None else "interrupted")


# ------------------------------------------------------------------ runs as arrays

#: The per-execution arrays load_columns can fill (op_id and outputs always are).
COLUMN_FIELDS = ("seq", "call", "outputs", "inputs")


@dataclasses.dataclass(eq=False)
class RunColumns:
    """One run as NumPy arrays, without a Python object per op execution.

    Execution ``i`` ran op ``op_id[i]`` (see ``ops``); its output digests are the rows
    ``digests[outputs[out_offsets[i]:out_offsets[i + 1]]]`` ([lo, hi] int64 pairs), where an
    index of -1 is an output without a digest (None in :class:`Event.digests`). Its input
    digests likewise, with ``in_offsets`` and ``inputs``; ``has_inputs[i]`` is False where
    ``Event.inputs`` is None. ``digests`` holds the distinct digests of each chunk, chunk
    after chunk (a digest may appear once per chunk). Arrays that were not asked for are
    None. Shapes, re-executions and captured values are left out: :func:`load` gives them."""

    run_id: str
    label: str
    status: str
    kind: str
    digest_algorithm: str
    environment: dict[str, Any]
    warnings: list[str]
    ops: dict[int, OpInfo]
    op_id: np.ndarray  # int32 [n] (int64 if an op id needs it)
    seq: np.ndarray | None  # int64 [n]
    call: np.ndarray | None  # int64 [n]
    digests: np.ndarray  # int64 [k, 2]
    out_offsets: np.ndarray  # int64 [n + 1]
    outputs: np.ndarray  # int32 [m] (int64 beyond 2**31 - 1 digests): rows of digests, -1 None
    in_offsets: np.ndarray | None = None  # int64 [n + 1]
    inputs: np.ndarray | None = None  # like outputs
    has_inputs: np.ndarray | None = None  # bool [n]

    def __len__(self) -> int:
        return len(self.op_id)

    def __repr__(self) -> str:
        return (
            f"<RunColumns {self.label or self.run_id[:8]}: {len(self)} op executions, "
            f"{len(self.ops)} ops, {self.status}>"
        )

    def output_digests(self, i: int) -> list[Digest | None]:
        """Event.digests of execution ``i``."""
        rows = self.outputs[self.out_offsets[i] : self.out_offsets[i + 1]]
        return [None if r < 0 else (int(self.digests[r, 0]), int(self.digests[r, 1])) for r in rows]

    def input_digests(self, i: int) -> list[Digest | None] | None:
        """Event.inputs of execution ``i`` (needs the ``inputs`` field)."""
        if self.inputs is None or self.in_offsets is None or self.has_inputs is None:
            raise ValueError("these columns were loaded without the inputs")
        if not self.has_inputs[i]:
            return None
        rows = self.inputs[self.in_offsets[i] : self.in_offsets[i + 1]]
        return [None if r < 0 else (int(self.digests[r, 0]), int(self.digests[r, 1])) for r in rows]


def _fields(fields: Iterable[str]) -> set[str]:
    wanted = set(fields)
    unknown = wanted - set(COLUMN_FIELDS) - {"op_id"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}; choose from {COLUMN_FIELDS}")
    return wanted


def _index_dtype(entries: int) -> type:
    return np.int32 if entries < 2**31 else np.int64


def _op_dtype(ops: Mapping[int, OpInfo]) -> type:
    ids = list(ops) or [0]
    info = np.iinfo(np.int32)
    return np.int32 if info.min <= min(ids) and max(ids) <= info.max else np.int64


def columns_from_recording(rec: Recording, fields: Iterable[str] = COLUMN_FIELDS) -> RunColumns:
    """A Recording in memory (or a run of a format-1/2 file) as :class:`RunColumns`."""
    wanted = _fields(fields)
    n = len(rec.events)
    table: dict[Digest, int] = {}
    out_rows: list[int] = []
    in_rows: list[int] = []
    out_n = np.zeros(n + 1, np.int64)
    in_n = np.zeros(n + 1, np.int64)
    has_inputs = np.zeros(n, bool)
    for i, ev in enumerate(rec.events):
        for d in ev.digests:
            out_rows.append(-1 if d is None else table.setdefault(tuple(d), len(table)))
        out_n[i + 1] = len(ev.digests)
        if "inputs" in wanted and ev.inputs is not None:
            has_inputs[i] = True
            for d in ev.inputs:
                in_rows.append(-1 if d is None else table.setdefault(tuple(d), len(table)))
            in_n[i + 1] = len(ev.inputs)
    digests = np.array(list(table), np.int64).reshape(-1, 2)
    index = _index_dtype(len(digests))
    with_inputs = "inputs" in wanted
    return RunColumns(
        run_id=rec.run_id,
        label=rec.label,
        status=rec.status,
        kind=rec.kind,
        digest_algorithm=rec.digest_algorithm,
        environment=rec.environment,
        warnings=list(rec.warnings),
        ops=dict(rec.ops),
        op_id=np.array([ev.op_id for ev in rec.events], _op_dtype(rec.ops)),
        seq=np.array([ev.seq for ev in rec.events], np.int64) if "seq" in wanted else None,
        call=np.array([ev.call for ev in rec.events], np.int64) if "call" in wanted else None,
        digests=digests,
        out_offsets=np.cumsum(out_n),
        outputs=np.array(out_rows, index),
        in_offsets=np.cumsum(in_n) if with_inputs else None,
        inputs=np.array(in_rows, index) if with_inputs else None,
        has_inputs=has_inputs if with_inputs else None,
    )


def _shifted(index: np.ndarray, by: int) -> np.ndarray:
    return np.where(index < 0, -1, index + by)


def _columns_of_chunks(con: sqlite3.Connection, header: Recording, wanted: set[str]) -> RunColumns:
    """A format-3 run as arrays, filled chunk by chunk into arrays allocated once."""
    run_id = header.run_id
    stats = con.execute(
        "SELECT COALESCE(SUM(events), 0), COALESCE(SUM(outputs), 0), "
        "COALESCE(SUM(inputs), 0), COALESCE(SUM(entries), 0) FROM chunks WHERE run_id = ?",
        (run_id,),
    ).fetchone()
    if not all(isinstance(v, int) and v >= 0 for v in stats):
        raise RowError(f"its chunks' counts are {stats!r:.80}")
    n, m_out, m_in, k = stats
    with_inputs = "inputs" in wanted
    index = _index_dtype(k)
    op_id = np.empty(n, _op_dtype(header.ops))
    seq = np.empty(n, np.int64) if "seq" in wanted else None
    call = np.empty(n, np.int64) if "call" in wanted else None
    out_offsets = np.zeros(n + 1, np.int64)
    outputs = np.empty(m_out, index)
    digests = np.empty((k, 2), np.int64)
    in_offsets = np.zeros(n + 1, np.int64) if with_inputs else None
    inputs = np.empty(m_in, index) if with_inputs else None
    has_inputs = np.empty(n, bool) if with_inputs else None
    e = o = i = d = 0  # executions, outputs, inputs, dictionary entries filled so far
    for _, c in _read_chunks(con, run_id, header.ops):
        size = len(c.seq)
        if e + size > n:
            raise RowError("its chunks hold more executions than their events columns say")
        op_id[e : e + size] = c.op_id
        if seq is not None:
            seq[e : e + size] = c.seq
        if call is not None:
            call[e : e + size] = c.call
        out_pos = _ragged(c.start[:-1], c.n_out)
        out_index = c.index[out_pos]
        entries = c.entries
        in_index = None
        if with_inputs:
            in_pos = _ragged(c.start[:-1] + c.n_out, np.maximum(c.n_in - 1, 0))
            in_index = c.index[in_pos]
        else:
            # Keep only the entries the outputs use.
            used = np.zeros(len(entries) + 1, bool)
            used[out_index] = True  # -1 marks the spare last slot
            used = used[:-1]
            remap = np.cumsum(used) - 1
            out_index = np.where(out_index < 0, -1, remap[out_index])
            entries = entries[used]
        digests[d : d + len(entries)] = entries
        outputs[o : o + len(out_index)] = _shifted(out_index, d)
        np.cumsum(c.n_out, out=out_offsets[e + 1 : e + size + 1])
        out_offsets[e + 1 : e + size + 1] += o
        o += len(out_index)
        if with_inputs:
            inputs[i : i + len(in_index)] = _shifted(in_index, d)
            np.cumsum(np.maximum(c.n_in - 1, 0), out=in_offsets[e + 1 : e + size + 1])
            in_offsets[e + 1 : e + size + 1] += i
            has_inputs[e : e + size] = c.n_in > 0
            i += len(in_index)
        d += len(entries)
        e += size
    if (e, o) != (n, m_out) or (with_inputs and i != m_in):
        raise RowError("its chunks do not hold what their events columns say")
    if d < k:
        digests.resize((d, 2), refcheck=False)  # in place: no second copy
    return RunColumns(
        run_id=run_id,
        label=header.label,
        status=header.status,
        kind=header.kind,
        digest_algorithm=header.digest_algorithm,
        environment=header.environment,
        warnings=header.warnings,
        ops=header.ops,
        op_id=op_id,
        seq=seq,
        call=call,
        digests=digests,
        out_offsets=out_offsets,
        outputs=outputs,
        in_offsets=in_offsets,
        inputs=inputs,
        has_inputs=has_inputs,
    )


def load_columns(path: str, fields: Iterable[str] = COLUMN_FIELDS) -> list[RunColumns]:
    """Every run in ``path`` as :class:`RunColumns`, in the order they were saved, without a
    Python object per op execution: about 63 bytes of memory per execution with every field,
    32 with ``fields=("outputs",)`` (op ids and output digests only, all that
    :func:`first_difference` needs), for runs whose executions have 1.1 outputs and 1.5 inputs
    each (benchmarks/bench_long_runs.py: two runs of 10M executions in 0.65 GB and 3 s).
    ``fields`` picks among ``seq``, ``call``, ``outputs`` and ``inputs``. Runs of format-1/2
    files are converted from their rows. A damaged run raises RecordingFileError naming it."""
    wanted = _fields(fields)
    with _reading(path) as (con, tables):
        runs = _runs_in_order(con)
        out = []
        for n, (rowid, run_id, label) in enumerate(runs, 1):
            try:
                with _rows_of_one_run():
                    row = _run_row(con, rowid)
                    header = _read_header(con, row)
                    if _has_rows(con, header.run_id, tables):
                        rec = _read_run(con, row, tables)
                        out.append(columns_from_recording(rec, wanted))
                    else:
                        out.append(_columns_of_chunks(con, header, wanted))
            except RowError as exc:
                name = f"run {n} of {len(runs)} (label {label!r}, run_id {run_id[:8]})"
                raise RecordingFileError(
                    f"{path}: damaged: {' '.join(f'{exc}, {name}'.split())}; "
                    "nddebug.storage.salvage(path) returns the runs that read back whole"
                ) from None
        return out


def _key_codes(a: RunColumns, b: RunColumns) -> tuple[Any, Any]:
    """For each run, a function: op ids -> a code of the op's key shared by both runs."""
    codes: dict[str, int] = {}
    for run in (a, b):
        for op in run.ops.values():
            codes.setdefault(op.key, len(codes))

    def lookup(run: RunColumns) -> Any:
        ids = np.array(sorted(run.ops), np.int64)
        keys = np.array([codes[run.ops[i].key] for i in ids.tolist()], np.int64)
        if ids.size and 0 <= ids[0] and ids[-1] < 1 << 24:
            dense = np.full(int(ids[-1]) + 1, -1, np.int64)
            dense[ids] = keys
            return lambda op_id: dense[op_id]
        return lambda op_id: keys[np.clip(np.searchsorted(ids, op_id), 0, max(len(ids) - 1, 0))]

    return lookup(a), lookup(b)


def _rows(run: RunColumns, index: np.ndarray) -> np.ndarray:
    if not len(run.digests):
        return np.zeros((len(index), 2), np.int64)
    return run.digests[np.where(index < 0, 0, index)]


def first_difference(
    a: RunColumns, b: RunColumns, block: int = 1 << 20, *, order: str = "arrival"
) -> int | None:
    """The index of the first op execution at which two runs differ: another op (compared
    by its key: op ids are counters of the recording process) or other output digests (a
    missing digest differs from any digest). If one run is a prefix of the other, the length
    of the shorter; None if they are identical. Vectorised, ``block`` executions at a time.

    ``order="arrival"`` compares the executions in the order they arrived. But the graph ops
    of one tf.function call arrive in whatever order TensorFlow's executor ran them, which
    varies from run to run; ``order="call"`` (needs the ``call`` field) compares each call's
    executions as a multiset: the ops that ran inside one top-level call (consecutive
    executions with the same ``call``) with their output digests. It returns the index of the
    first execution of the first call that differs (another number of executions, or other
    executions), None if none does. It compares a sum of 64-bit hashes of the executions per
    call (no sorting): a call that differs goes unnoticed with probability 2**-64."""
    if order not in ("arrival", "call"):
        raise ValueError(f"order must be 'arrival' or 'call', got {order!r}")
    key_a, key_b = _key_codes(a, b)
    if order == "call":
        return _first_call_difference(a, b, key_a, key_b, block)
    n = min(len(a), len(b))
    for start in range(0, n, block):
        stop = min(n, start + block)
        differs = key_a(a.op_id[start:stop]) != key_b(b.op_id[start:stop])
        offs_a = a.out_offsets[start : stop + 1]
        offs_b = b.out_offsets[start : stop + 1]
        differs |= np.diff(offs_a) != np.diff(offs_b)
        f = int(np.argmax(differs)) if differs.any() else stop - start
        if f:  # executions start .. start + f - 1 have the same op and number of outputs
            slots_a = a.outputs[offs_a[0] : offs_a[f]]
            slots_b = b.outputs[offs_b[0] : offs_b[0] + len(slots_a)]
            j = _first_slot_difference(a, b, slots_a, slots_b)
            if j is not None:
                return start + int(np.searchsorted(offs_a[: f + 1] - offs_a[0], j, "right")) - 1
        if f < stop - start:
            return start + f
    return None if len(a) == len(b) else n


def _first_slot_difference(
    a: RunColumns, b: RunColumns, slots_a: np.ndarray, slots_b: np.ndarray
) -> int | None:
    """The first position at which two lists of digest rows (-1: none) differ."""
    null_a, null_b = slots_a < 0, slots_b < 0
    differs = (null_a != null_b) | (~null_a & (_rows(a, slots_a) != _rows(b, slots_b)).any(axis=1))
    return int(np.argmax(differs)) if differs.any() else None


_MIX = [
    np.uint64(k)
    for k in (
        0x9E3779B97F4A7C15,
        0xC2B2AE3D27D4EB4F,
        0x165667B19E3779F9,
        0x27D4EB2F165667C5,
        0xBF58476D1CE4E5B9,
        0x94D049BB133111EB,
    )
]


def _event_hashes(run: RunColumns, start: int, stop: int) -> np.ndarray:
    """A 64-bit hash of each execution's output digests (in their order; a missing digest
    and the number of outputs count)."""
    offs = run.out_offsets[start : stop + 1] - run.out_offsets[start]
    index = run.outputs[run.out_offsets[start] : run.out_offsets[stop]]
    counts = np.diff(offs)
    rank = (np.arange(len(index)) - np.repeat(offs[:-1], counts) + 1).astype(np.uint64)
    rows = _rows(run, index).view(np.uint64)
    x = rows[:, 0] * _MIX[0] + rows[:, 1] * _MIX[1] + rank * _MIX[2]
    x[index < 0] = rank[index < 0] * _MIX[3]
    x ^= x >> np.uint64(29)
    x *= _MIX[4]
    x ^= x >> np.uint64(32)
    sums = np.zeros(len(x) + 1, np.uint64)
    np.cumsum(x, out=sums[1:])
    return sums[offs[1:]] - sums[offs[:-1]] + counts.astype(np.uint64) * _MIX[5]


def _execution_hashes(run: RunColumns, key: Any, start: int, stop: int) -> np.ndarray:
    """A 64-bit hash of each execution's op key and output digests."""
    x = _event_hashes(run, start, stop) ^ (key(run.op_id[start:stop]).astype(np.uint64) * _MIX[2])
    x ^= x >> np.uint64(30)
    x *= _MIX[4]
    x ^= x >> np.uint64(27)
    x *= _MIX[5]
    x ^= x >> np.uint64(31)
    return x


def call_numbers(run: RunColumns) -> np.ndarray:
    """The 0-based number of the call each execution ran in: a call is a run of consecutive
    executions with the same ``call`` (a top-level op and the graph ops it ran)."""
    if run.call is None:
        raise ValueError("call numbers need the call field (load_columns(..., fields=...))")
    changes = np.zeros(len(run.call), np.int32)
    changes[1:] = run.call[1:] != run.call[:-1]
    return np.cumsum(changes, dtype=np.int32)


def call_differences(
    a: RunColumns,
    b: RunColumns,
    calls_a: np.ndarray | None = None,
    calls_b: np.ndarray | None = None,
    block: int = 1 << 20,
) -> np.ndarray:
    """Per call of ``a``, how many of its executions have no equal one (same op key and
    output digests) in ``b``'s call of the same number (a call ``b`` lacks: all of them).
    (An execution counts as matched if an equal one is there at all: two equal executions
    against one count no difference.) ``calls_a``/``calls_b``: their :func:`call_numbers`, if
    already made. Vectorised, about
    ``block`` executions of ``a`` at a time (whole calls), so memory stays bounded."""
    key_a, key_b = _key_codes(a, b)
    calls_a = call_numbers(a) if calls_a is None else calls_a
    calls_b = call_numbers(b) if calls_b is None else calls_b
    n = int(calls_a[-1]) + 1 if len(calls_a) else 0
    counts = np.zeros(n, np.int64)

    def salted(run: RunColumns, key: Any, calls: np.ndarray, start: int, stop: int) -> Any:
        x = _execution_hashes(run, key, start, stop)
        x ^= (calls[start:stop].astype(np.uint64) + np.uint64(1)) * _MIX[1]
        x *= _MIX[4]
        x ^= x >> np.uint64(29)
        return x

    start = 0
    while start < len(a):
        stop = min(len(a), start + block)
        if stop < len(a):  # to the end of a call
            stop = int(np.searchsorted(calls_a, calls_a[stop - 1], side="right"))
        lo, hi = int(calls_a[start]), int(calls_a[stop - 1])
        b_start = int(np.searchsorted(calls_b, lo, side="left"))
        b_stop = int(np.searchsorted(calls_b, hi, side="right"))
        mine = salted(a, key_a, calls_a, start, stop)
        theirs = np.sort(salted(b, key_b, calls_b, b_start, b_stop))
        at = np.minimum(np.searchsorted(theirs, mine), max(len(theirs) - 1, 0))
        unmatched = theirs[at] != mine if len(theirs) else np.ones(len(mine), bool)
        counts += np.bincount(calls_a[start:stop][unmatched], minlength=n)
        start = stop
    return counts


def seq_range(path: str, run_id: str, start: int, stop: int) -> tuple[int, int]:
    """The smallest and largest seq among the run's executions ``start`` to ``stop - 1`` (in
    seq order, as :func:`load_columns` numbers them), reading only the chunks that hold them."""
    if not 0 <= start < stop:
        raise ValueError(f"an empty or negative range of executions: {start}..{stop}")
    with _reading(path) as (con, tables):
        seqs: list[int] = []
        if "events" in tables:
            seqs += [
                int(r[0])
                for r in con.execute(
                    "SELECT seq FROM events WHERE run_id = ? ORDER BY seq LIMIT ? OFFSET ?",
                    (run_id, stop - start, start),
                )
            ]
        if not seqs and "chunks" in tables:
            at = 0
            for number, n in con.execute(
                "SELECT chunk, events FROM chunks WHERE run_id = ? ORDER BY chunk", (run_id,)
            ).fetchall():
                if at + n > start and at < stop:
                    row = con.execute(
                        f"SELECT {_CHUNK_COLUMNS} FROM chunks WHERE run_id = ? AND chunk = ?",
                        (run_id, number),
                    ).fetchone()
                    try:
                        c = _decode_chunk(tuple(row), None, run_id)
                    except RowError as exc:
                        raise RecordingFileError(
                            f"{path}: damaged: chunk {number}: {exc}"
                        ) from None
                    seqs += c.seq[max(0, start - at) : stop - at].tolist()
                at += n
        if not seqs:
            raise RecordingFileError(f"{path}: run {run_id[:8]} has no executions {start}..{stop}")
        return min(seqs), max(seqs)


def run_index(path: str) -> list[tuple[str, str, str, int]]:
    """Each run of ``path`` as (run_id, label, kind, op executions), in file order, without
    reading its op executions."""
    with _reading(path) as (con, tables):
        sizes: dict[str, int] = defaultdict(int)
        for table, count in (("events", "COUNT(*)"), ("chunks", "SUM(events)")):
            if table in tables:
                for run_id, n in con.execute(
                    f"SELECT run_id, {count} FROM {table} GROUP BY run_id"
                ):
                    sizes[str(run_id)] += int(n or 0)
        kinds = dict(con.execute("SELECT rowid, CAST(kind AS BLOB) FROM runs").fetchall())
        return [
            (
                run_id,
                str(label),
                bytes(kinds[rowid] or b"").decode("utf-8", "replace"),
                sizes[run_id],
            )
            for rowid, run_id, label in _runs_in_order(con)
        ]


def _call_sums(run: RunColumns, key: Any, start: int, stop: int, starts: np.ndarray) -> np.ndarray:
    """Per call (its executions start at ``starts``, relative to ``start``), the sum of a
    64-bit hash of each execution's op key and output digests: the same for the same
    executions in any order."""
    x = _execution_hashes(run, key, start, stop)
    sums = np.zeros(len(x) + 1, np.uint64)
    np.cumsum(x, out=sums[1:])
    ends = np.append(starts[1:], stop - start)
    return sums[ends] - sums[starts]


def _ends_call(run: RunColumns, i: int) -> bool:
    """Whether a call's executions end before execution i (or the run ends there)."""
    assert run.call is not None
    return i >= len(run) or i == 0 or bool(run.call[i] != run.call[i - 1])


def _first_call_difference(
    a: RunColumns, b: RunColumns, key_a: Any, key_b: Any, block: int
) -> int | None:
    if a.call is None or b.call is None:
        raise ValueError("order='call' needs the call field (load_columns(..., fields=...))")
    n = min(len(a), len(b))
    pos = 0
    while pos < n:
        stop = min(n, pos + block)
        while not _ends_call(a, stop) and stop < n:  # to the end of a's call
            ahead = a.call[stop : min(n, stop + block)]
            change = np.flatnonzero(ahead != a.call[stop - 1])
            stop = stop + int(change[0]) if change.size else min(n, stop + block)
        call_a, call_b = a.call[pos:stop], b.call[pos:stop]
        starts_a = np.concatenate([[0], np.flatnonzero(call_a[1:] != call_a[:-1]) + 1])
        starts_b = np.concatenate([[0], np.flatnonzero(call_b[1:] != call_b[:-1]) + 1])
        ends_a = np.concatenate([starts_a[1:], [stop - pos] if _ends_call(a, stop) else []])
        ends_b = np.concatenate([starts_b[1:], [stop - pos] if _ends_call(b, stop) else []])
        m = min(len(ends_a), len(ends_b))
        unequal = np.flatnonzero(ends_a[:m] != ends_b[:m])
        # Calls before call k have the same extent in both runs; call k has not.
        k = int(unequal[0]) if unequal.size else (m if len(ends_a) != len(ends_b) else None)
        if k is None:
            limit = stop - pos
        else:
            limit = int(ends_a[k - 1]) if k else 0
        if limit:  # compare the calls that end where they end in the other run
            starts = starts_a[starts_a < limit]
            sums_a = _call_sums(a, key_a, pos, pos + limit, starts)
            sums_b = _call_sums(b, key_b, pos, pos + limit, starts)
            unequal = np.flatnonzero(sums_a != sums_b)
            if unequal.size:
                return pos + int(starts[unequal[0]])
        if k is not None:
            return pos + int(starts_a[k])
        pos = stop
    return None if len(a) == len(b) else n
