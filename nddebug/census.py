"""The op determinism census: measure, on this machine and TF version, which ops are
non-deterministic with and without op determinism, and compare with the knowledge base.

For every case of :mod:`nddebug.census_cases` (an op type, the TF call that creates it, an input
size) the census traces the call into a ``tf.function`` on the chosen device, returns the
measured op's own outputs (found in the traced graph, so the op type is the real one), runs it
``repeats`` times with bitwise-identical inputs and hashes the outputs. Backward cases inject a
fixed upstream gradient (``GradientTape.gradient(output_gradients=...)``).

``enable_op_determinism()`` is process-wide and cannot be switched off, so each setting runs in
its own worker process (``python -m nddebug.census --worker``), which streams one JSON line per
case. The parent shows progress, writes rows to ``path`` as they arrive, turns a crashed or hung
worker into an error row and starts a new worker for the rest, and on Ctrl-C returns what it
has. The parent never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from nddebug import census_cases
from nddebug.errors import CensusError
from nddebug.knowledge import Culprit, device_kind, lookup

if TYPE_CHECKING:
    import pandas

__all__ = ["COLUMNS", "CensusError", "census", "diff", "read", "stable_csv", "to_text"]

#: Columns of the census DataFrame, in order.
COLUMNS = (
    "op_type",
    "pass",
    "size",
    "dtype",
    "api",
    "kind",
    "device",
    "ran_on",
    "kernel",
    "determinism",
    "deterministic",
    "distinct_outputs",
    "runs",
    "max_ulp",
    "max_abs_diff",
    "error",
    "known",
    "agreement",
    "graph_ops",
    "seconds",
)

#: Op types left out of ``graph_ops``: plumbing that every graph has.
_PLUMBING = frozenset(
    {"Placeholder", "Const", "Identity", "IdentityN", "NoOp", "_Arg", "_Retval", "StopGradient"}
)
_SKIPPED = "not measured: "
_UPSTREAM_SEED = 1


# =========================================================================== worker side


def _fingerprint(values: list[Any]) -> str:
    """A hash of the exact bytes (and dtype and shape) of every output."""
    h = hashlib.blake2b(digest_size=16)
    for v in values:
        h.update(f"{v.dtype}{v.shape}".encode())
        if v.dtype == object:  # tf.string
            h.update(b"\0".join(bytes(x) for x in v.ravel()))
        else:
            h.update(v.tobytes())
    return h.hexdigest()


def _short_error(exc: BaseException) -> str:
    """One line: the exception type and TF's own message, without the creation traceback that
    graph execution errors carry ("Detected at node X defined at ... File ...")."""
    lines = [line.strip() for line in str(getattr(exc, "message", exc)).splitlines()]
    kept = [
        line
        for line in lines
        if line
        and not line.startswith(("Graph execution error", "Detected at node", "File ", "[["))
    ]
    text = " ".join(" ".join(kept or lines).split())
    return f"{type(exc).__name__}: {text[:300]}"


def _resolve_device(requested: str | None) -> str:
    """ "GPU:0" for None when there is a GPU, else "CPU:0"; CensusError for a missing device."""
    import tensorflow as tf

    names = [d.name.split("device:")[-1] for d in tf.config.list_logical_devices()]
    if requested is None:
        gpus = [n for n in names if n.startswith("GPU")]
        return gpus[0] if gpus else "CPU:0"
    wanted = requested.strip().split("device:")[-1].upper()
    if ":" not in wanted:
        wanted += ":0"
    if wanted not in names:
        raise CensusError(f"no device {requested!r} here; this machine has {', '.join(names)}")
    return wanted


class _CaseError(Exception):
    """The case did not create the op it is meant to measure."""


def _measure(case: census_cases.Case, device: str, repeats: int) -> dict[str, Any]:
    """Run one case ``repeats`` times and describe how its outputs varied."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.eager import context

    from nddebug.quantify import measure

    row: dict[str, Any] = {"runs": 0, "error": "", "graph_ops": "", "kernel": "", "ran_on": ""}
    targets: list[str] = []
    start = time.perf_counter()
    try:
        rng = np.random.default_rng(int(hashlib.sha256(case.key.encode()).hexdigest()[:8], 16))
        with tf.device(device):
            program = case.build(rng)  # type: ignore[misc]
            args = [
                tf.constant(a) if isinstance(a, np.ndarray | np.generic) else a
                for a in program.args
            ]
            backward = case.pass_ == "backward"
            if backward:
                # The fixed upstream gradient is an input, not a constant in the graph: grappler
                # would fold a gradient that depends on constants only (BiasAddGrad, ...).
                ys = tf.nest.flatten(tf.function(program.fn, autograph=False)(*args))
                up = np.random.default_rng(_UPSTREAM_SEED)
                args += [
                    tf.constant(up.standard_normal(y.shape).astype(y.dtype.as_numpy_dtype))
                    for y in ys
                ]
            n_inputs = len(program.args)

            def body(*tensors: Any) -> list[Any]:
                inputs, upstream = tensors[:n_inputs], list(tensors[n_inputs:])
                if backward:
                    sources = [inputs[i] for i in program.wrt] + list(program.variables)
                    with tf.GradientTape() as tape:
                        for t in sources[: len(program.wrt)]:
                            tape.watch(t)
                        ys = tf.nest.flatten(program.fn(*inputs))
                    for g in tape.gradient(ys, sources, output_gradients=upstream):
                        if isinstance(g, tf.IndexedSlices):
                            tf.convert_to_tensor(g)  # dense, as optimizers without sparse updates
                    result = []
                else:
                    result = [t for t in tf.nest.flatten(program.fn(*inputs)) if t is not None]
                graph = tf.compat.v1.get_default_graph()
                found = [op for op in graph.get_operations() if op.type == case.op_type]
                if not found and case.call_outputs_if_absent:
                    return result  # graph_ops shows the op is absent; _agreement reads that
                if not found:
                    have = sorted({op.type for op in graph.get_operations()} - _PLUMBING)
                    raise _CaseError(
                        f"the TF call did not create a {case.op_type} op here (it created: "
                        f"{', '.join(have) or 'nothing'})"
                    )
                targets[:] = [op.name for op in found]
                outputs = [
                    t
                    for op in found
                    for i, t in enumerate(op.outputs)
                    if (case.outputs is None or i in case.outputs)
                    and t.dtype not in (tf.variant, tf.resource)
                ]
                return outputs or result  # ops without outputs: what the call returned

            fn = tf.function(body, autograph=False)
            concrete = fn.get_concrete_function(*args)
            ops = {op.type for op in concrete.graph.get_operations()} - _PLUMBING
            row["graph_ops"] = " ".join(sorted(ops))

            # The first call, with run metadata: which kernel ran the op, and on which device
            # (soft placement may put an op without a GPU kernel on the CPU).
            ctx = context.context()
            ctx.enable_graph_collection()
            context.enable_run_metadata()
            try:
                first = [t.numpy() for t in fn(*args)]
            finally:
                metadata = context.export_run_metadata()
                context.disable_run_metadata()
                ctx.disable_graph_collection()
            kernels, ran_on = _kernels(metadata, set(targets))
            if not targets:  # the call avoided the op: say where the call's outputs came from
                kernels, ran_on = [], [device_kind(device)]
            if "Const" in kernels:
                raise _CaseError("grappler folded the op into a constant: nothing was measured")
            row["kernel"], row["ran_on"] = " ".join(kernels), " ".join(ran_on)
            row["runs"] = 1
            first_hash = _fingerprint(first)
            hashes = {first_hash}
            max_ulp: int | None = 0
            max_abs: float | None = 0.0
            for _ in range(repeats - 1):
                values = [t.numpy() for t in fn(*args)]
                row["runs"] += 1
                h = _fingerprint(values)
                if h == first_hash:
                    continue
                hashes.add(h)
                if max_ulp is None or max_abs is None:
                    continue
                for a, b in zip(first, values, strict=True):
                    d = measure([a, b])
                    if d is None:  # shapes differ (e.g. a data-dependent output size)
                        max_ulp = max_abs = None
                        break
                    max_ulp, max_abs = max(max_ulp, d.max_ulp), max(max_abs, d.max_abs_diff)
        row.update(
            deterministic=len(hashes) == 1,
            distinct_outputs=len(hashes),
            max_ulp=max_ulp,
            max_abs_diff=max_abs,
        )
    except Exception as exc:  # noqa: BLE001 - any failure of the op becomes the row's error
        row.update(deterministic=None, distinct_outputs=None, max_ulp=None, max_abs_diff=None)
        row["error"] = str(exc) if isinstance(exc, _CaseError) else _short_error(exc)
    row["seconds"] = round(time.perf_counter() - start, 3)
    return row


def _kernels(metadata: Any, targets: set[str]) -> tuple[list[str], list[str]]:
    """The kernel op types and device kinds the measured nodes ran with (after grappler)."""
    kernels: dict[str, None] = {}
    devices: dict[str, None] = {}
    for function_graph in getattr(metadata, "function_graphs", []):
        for partition in function_graph.partition_graphs:
            for node in partition.node:
                if node.name in targets:
                    kernels[node.op] = None
                    devices[device_kind(node.device) or node.device] = None
    return list(kernels), list(devices)


def _case_row(case: census_cases.Case) -> dict[str, Any]:
    return {
        "key": case.key,
        "op_type": case.op_type,
        "pass": case.pass_,
        "size": case.size,
        "dtype": case.dtype,
        "api": case.api,
        "kind": case.kind,
    }


def _worker(stream: Any) -> int:
    """Measure the cases named on stdin; one JSON line per event on ``stream``."""

    def emit(event: dict[str, Any]) -> None:
        stream.write(json.dumps(event, default=str) + "\n")
        stream.flush()

    spec = json.loads(sys.stdin.read())
    import tensorflow as tf

    if spec["determinism"]:
        tf.config.experimental.enable_op_determinism()
    try:
        device = _resolve_device(spec["device"])
    except CensusError as exc:
        emit({"event": "fatal", "error": str(exc)})
        return 2
    kind = device_kind(device)
    emit({"event": "device", "device": device, "tensorflow": tf.__version__})
    by_key = {case.key: case for case in census_cases.CASES}
    for key in spec["keys"]:
        case = by_key[key]
        emit({"event": "start", "key": key})
        row = _case_row(case)
        if case.skip or kind not in case.devices:
            reason = case.skip or f"no {kind} case: runs on {', '.join(case.devices)} only"
            row.update(deterministic=None, runs=0, error=_SKIPPED + reason, seconds=0.0)
        else:
            row.update(_measure(case, device, spec["repeats"]))
        emit({"event": "row", "device": device, **row})
    return 0


# =========================================================================== parent side


def _agreement(row: dict[str, Any], entry: Culprit | None, kind: str) -> str:
    """How the measurement compares with what the knowledge base says for this device.

    ``entry`` is None for an op the knowledge base does not list, and also where its entry does
    not apply: the case is outside the entry's condition, or the call did not create the op.
    """
    error = row.get("error") or ""
    if error.startswith(_SKIPPED):
        return "not measured"
    raised = bool(error) and "determinis" in error.lower()  # TF's "...when determinism is..."
    if error and entry is not None and entry.under_determinism == "n/a":
        return "agrees"  # the knowledge base says the op cannot run at all
    if error and not raised:
        if "not available in GraphDef version" in error:
            return "op removed from TensorFlow"
        return "error"
    nondet = row.get("deterministic") is False
    on = row.get("determinism") == "on"
    if entry is None:
        if raised:
            return "raised under determinism, not listed"
        return "not listed but non-deterministic" if nondet else "agrees"
    if entry.device not in (kind, "any"):
        if raised:
            return f"raised under determinism; listed for {entry.device} only"
        if nondet:
            return f"listed for {entry.device} only, non-deterministic on {kind}"
        return f"no claim for {kind}"
    expected = entry.under_determinism if on else "non-deterministic"
    if raised:
        return "agrees" if expected == "raises" else f"listed as {expected} but raised"
    if expected == "raises":
        state = "non-deterministic" if nondet else "deterministic"
        return f"listed as raising under determinism, but ran ({state})"
    if expected in ("fixed", "host"):
        return f"listed as {expected} but measured non-deterministic" if nondet else "agrees"
    if entry.deterministic_kernel:  # what varies is the state it reads, fixed in a census
        return "listed deterministic, measured non-deterministic" if nondet else "agrees"
    # "non-deterministic" (off), "unaffected" or "n/a" (on): the op is listed as varying.
    return "agrees" if nondet else "listed non-deterministic, measured deterministic here"


def _complete(row: dict[str, Any], determinism: bool) -> dict[str, Any]:
    """Add the knowledge-base columns; return the row with exactly COLUMNS."""
    row = dict(row)
    row["determinism"] = "on" if determinism else "off"
    where = (row.get("ran_on") or "").split(" ")[0] or row.get("device") or ""
    kind = device_kind(where) or device_kind(row.get("device"))
    entry = lookup(row["op_type"], kind)
    row["known"] = f"{entry.device}: {entry.under_determinism}" if entry else ""
    row["agreement"] = _agreement(row, _applicable(row, entry), kind)
    return {c: row.get(c) for c in COLUMNS}


def _applicable(row: dict[str, Any], entry: Culprit | None) -> Culprit | None:
    """The entry, unless this measurement is outside what it describes: the case does not meet
    the entry's condition (training-mode batch norm), or the call did not create the op."""
    if entry is None:
        return None
    graph_ops = (row.get("graph_ops") or "").split()
    if graph_ops and row["op_type"] not in graph_ops:
        return None
    case = _CASES_BY_KEY.get(_key(row))
    if case is not None and case.outside_condition and entry.condition:
        return None
    return entry


def _key(row: dict[str, Any]) -> str:
    """The catalogue key of a row (also of a row read back from a census file)."""
    return f"{row['op_type']} | {row['api']} | {row['size']}"


_CASES_BY_KEY = {case.key: case for case in census_cases.CASES}


class _Sink:
    """Rows written as they arrive (CSV or JSON lines), so a partial census survives."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self._file = None
        self._csv: csv.DictWriter[str] | None = None
        if path is None:
            return
        path = os.fspath(path)
        self._file = open(path, "w", encoding="utf-8", newline="")
        if path.lower().endswith(".csv"):
            self._csv = csv.DictWriter(self._file, fieldnames=list(COLUMNS))
            self._csv.writeheader()
            self._file.flush()

    def write(self, row: dict[str, Any]) -> None:
        if self._file is None:
            return
        if self._csv is not None:
            self._csv.writerow(row)
        else:
            self._file.write(json.dumps(row, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _status(row: dict[str, Any]) -> str:
    if row["error"]:
        return row["error"][:100]
    if row["deterministic"]:
        return f"deterministic ({row['runs']} runs)"
    ulp = "" if row["max_ulp"] is None else f", max ULP {row['max_ulp']}"
    return f"NON-DETERMINISTIC: {row['distinct_outputs']} of {row['runs']} distinct{ulp}"


class _Worker:
    """One worker process and the lines it has sent."""

    def __init__(self, spec: dict[str, Any], env: dict[str, str]) -> None:
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nddebug.census", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the parent only; it stops the worker
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(spec).encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            # The worker died before it read its spec (killed, out of memory): its output
            # ends at once and its exit code becomes the rows' error, as for a later death.
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self._buffer = b""
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)

    def events(self, timeout: float) -> Iterable[dict[str, Any] | None]:
        """Yield events; None once when ``timeout`` seconds pass without one; stop at EOF."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                if line.strip():
                    yield json.loads(line)
            if not self._selector.select(timeout):
                yield None
                return
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            self._buffer += chunk

    def stop(self) -> int:
        """Kill the worker if it still runs; its exit code (negative: the signal)."""
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        self._selector.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code

    def stderr_tail(self, lines: int = 3) -> str:
        self.log.seek(0)
        text = self.log.read().decode("utf-8", errors="replace").strip().splitlines()
        self.log.close()
        return " | ".join(line.strip() for line in text[-lines:])


def _worker_env(determinism: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TF_DETERMINISTIC_OPS", None)  # "off" must be off; "on" calls the API itself
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    here = os.path.dirname(os.path.dirname(os.path.abspath(census_cases.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env


def _run_setting(
    cases: list[census_cases.Case],
    determinism: bool,
    device: str | None,
    repeats: int,
    timeout: float,
    on_row: Any,
    say: Any,
) -> None:
    """Measure every case under one setting, restarting the worker after a crash or hang."""
    remaining = [case.key for case in cases]
    by_key = {case.key: case for case in cases}
    resolved = device
    failed_starts = 0
    while remaining:
        spec = {
            "determinism": determinism,
            "device": resolved,
            "repeats": repeats,
            "keys": remaining,
        }
        worker = _Worker(spec, _worker_env(determinism))
        current: str | None = None
        timed_out = False
        try:
            for event in worker.events(timeout):
                if event is None:
                    timed_out = True
                    break
                if event["event"] == "fatal":
                    raise CensusError(event["error"])
                if event["event"] == "device":
                    if resolved is None:
                        say(f"device {event['device']} (TensorFlow {event['tensorflow']})")
                    resolved = event["device"]
                elif event["event"] == "start":
                    current = event["key"]
                    failed_starts = 0
                elif event["event"] == "row":
                    remaining.remove(event["key"])
                    current = None
                    on_row(event)
        finally:
            code = worker.stop()
        if not remaining:
            return
        # The worker died or hung. Blame the case it was measuring (or, if it died before
        # measuring anything, the next one), then carry on with a new worker.
        tail = worker.stderr_tail()
        when = "while measuring this op" if current else "before it measured anything"
        if current is None:
            failed_starts += 1
            if failed_starts >= 2:
                raise CensusError(f"the census worker cannot start (exit code {code}): {tail}")
            current = remaining[0]
        if timed_out:
            why = f"timed out after {timeout:g} s (worker killed)"
        else:
            why = f"the worker process died (exit code {code}) {when}: {tail}"
        row = _case_row(by_key[current])
        row.update(device=resolved or device or "", deterministic=None, runs=0, error=why)
        remaining.remove(current)
        on_row(row)


def census(
    device: str | None = None,
    ops: Sequence[str] | None = None,
    repeats: int = 10,
    determinism: Sequence[bool] = (False, True),
    *,
    path: str | os.PathLike[str] | None = None,
    progress: bool = True,
    timeout: float = 300.0,
) -> pandas.DataFrame:
    """Measure which ops are deterministic on this machine, with and without op determinism.

    Runs every case of the census catalogue (or those of the op types in ``ops``) ``repeats``
    times with bitwise-identical inputs on ``device`` (None: the first GPU, else the CPU), once
    per ``determinism`` setting, each setting in a fresh worker process. Returns one row per
    case and setting (columns :data:`COLUMNS`), compared with the knowledge base in
    ``agreement``. ``path`` (``.csv``, else JSON lines) receives each row as it arrives.
    Progress goes to stderr. A case that crashes its worker or runs longer than ``timeout``
    seconds becomes an error row. On Ctrl-C the workers are stopped and the rows so far are
    returned, with a warning and ``df.attrs["interrupted"] = True``.
    """
    import pandas

    if repeats < 2:
        raise CensusError(f"repeats must be at least 2 to compare runs, got {repeats}")
    settings = [bool(d) for d in determinism]
    if not settings:
        raise CensusError("determinism must name at least one setting (False and/or True)")
    try:
        chosen = census_cases.cases(list(ops) if ops is not None else None)
    except ValueError as exc:
        raise CensusError(str(exc)) from None
    order = {case.key: i for i, case in enumerate(chosen)}

    rows: list[dict[str, Any]] = []
    sink = _Sink(path)
    total = len(chosen) * len(settings)

    def say(text: str) -> None:
        if progress:
            print(f"nddebug census: {text}", file=sys.stderr, flush=True)

    interrupted = False
    started = time.perf_counter()
    try:
        for setting in settings:
            label = "on" if setting else "off"
            say(f"op determinism {label}: {len(chosen)} cases, {repeats} runs each")

            def on_row(raw: dict[str, Any], setting: bool = setting, label: str = label) -> None:
                row = _complete(raw, setting)
                row["_order"] = (order[raw["key"]], settings.index(setting))
                rows.append(row)
                sink.write({c: row[c] for c in COLUMNS})
                say(
                    f"[{len(rows)}/{total}] determinism {label}: {row['op_type']} "
                    f"({row['pass']}, {row['size']}): {_status(row)} ({row['seconds'] or 0:.1f} s)"
                )

            _run_setting(chosen, setting, device, repeats, timeout, on_row, say)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sink.close()
    say(f"{len(rows)} of {total} measurements in {time.perf_counter() - started:.0f} s")
    rows.sort(key=lambda r: r.pop("_order"))
    df = pandas.DataFrame(rows, columns=list(COLUMNS))
    df.attrs["interrupted"] = interrupted
    if interrupted:
        warnings.warn(
            f"census interrupted: returning {len(rows)} of {total} measurements",
            RuntimeWarning,
            stacklevel=2,
        )
    return df


# =========================================================================== rendering


def _cell(row: Any) -> str:
    if isinstance(row.get("error"), str) and row["error"]:
        if row["error"].startswith(_SKIPPED):
            return "-"
        return "raised" if "determinis" in row["error"].lower() else "error"
    if row.get("deterministic") is True:
        return "deterministic"
    ulp = row.get("max_ulp")
    ulp_text = "" if ulp is None or ulp != ulp else f", {int(ulp)} ULP"
    return f"NON-DET {int(row['distinct_outputs'])}/{int(row['runs'])}{ulp_text}"


def to_text(df: pandas.DataFrame, width: int = 48) -> str:
    """The census as a terminal table: one line per case, the settings side by side."""
    from tabulate import tabulate

    settings = [s for s in ("off", "on") if s in set(df["determinism"])]
    lines: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for _, row in df.iterrows():
        key = (row["op_type"], row["pass"], row["api"], row["size"])
        line = lines.setdefault(key, {"known": row["known"], "agreement": {}, "error": ""})
        line[row["determinism"]] = _cell(row)
        line["agreement"][row["determinism"]] = row["agreement"]
        if isinstance(row["error"], str) and row["error"] and not line["error"]:
            line["error"] = row["error"]
    table = []
    for (op_type, pass_, api, size), line in lines.items():
        verdicts = dict.fromkeys(line["agreement"].values())
        if len(verdicts) == 1:
            agreement = next(iter(verdicts))
        else:
            agreement = "; ".join(f"{s}: {a}" for s, a in line["agreement"].items())
        api_text = api if len(api) <= width else api[: width - 1] + "…"
        table.append(
            [
                op_type,
                pass_,
                api_text,
                size,
                *(line.get(s, "") for s in settings),
                line["known"] or "-",
                agreement,
            ]
        )
    headers = [
        "op type",
        "pass",
        "TF call",
        "size",
        *(f"determinism {s}" for s in settings),
        "known",
        "agreement",
    ]
    text = tabulate(table, headers=headers, tablefmt="simple")
    errors = [
        f"  {op_type} ({size}): {line['error']}"
        for (op_type, _, _, size), line in lines.items()
        if line["error"]
    ]
    if errors:
        text += "\n\nNot measured or failed:\n" + "\n".join(errors)
    return text


# =========================================================================== keeping and diffing

#: What identifies a measurement across census files, and what a diff compares.
_ID = ("op_type", "pass", "api", "size", "determinism")


def read(path: str | os.PathLike[str]) -> pandas.DataFrame:
    """A census written by ``census(path=...)``, ``--save``, ``--format csv/json`` or
    :func:`stable_csv`, as a DataFrame with :data:`COLUMNS` (missing ones empty)."""
    import pandas

    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise CensusError(f"cannot read census file {path!r}: {exc}") from None
    if path.lower().endswith(".csv"):
        import io

        df = pandas.read_csv(io.StringIO(text), dtype={"size": str, "api": str})
    else:
        stripped = text.lstrip()
        if stripped.startswith("{") and '"rows"' in stripped[:200]:
            records = json.loads(text)["rows"]  # nddebug census --format json
        else:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        df = pandas.DataFrame(records)
    missing = [c for c in _ID if c not in df.columns]
    if missing:
        raise CensusError(f"{path}: not a census table (no column(s) {missing})")
    for column in COLUMNS:
        if column not in df.columns:
            df[column] = None
    return df[list(COLUMNS)]


def stable_csv(df: pandas.DataFrame) -> str:
    """The census as CSV that diffs cleanly between machines and runs: sorted by op type, pass,
    TF call, size and setting, without the timing column."""
    columns = [c for c in COLUMNS if c != "seconds"]
    ordered = df.sort_values(list(_ID), kind="stable")
    return ordered[columns].to_csv(index=False, lineterminator="\n")


def diff(a: pandas.DataFrame, b: pandas.DataFrame) -> pandas.DataFrame:
    """Measurements whose result or agreement differ between two censuses (e.g. two GPUs, two
    TF versions): one row per (case, setting), with each side's result ("-": not in that
    census). Timing and the exact ULP count are not compared; "NON-DET" against
    "deterministic", a raise, an error or a changed agreement are."""
    import pandas

    def cells(df: pandas.DataFrame) -> dict[tuple[str, ...], tuple[str, str]]:
        out = {}
        for _, row in df.iterrows():
            verdict = _cell(row)
            verdict = verdict.split(" ", 1)[0] if verdict.startswith("NON-DET") else verdict
            out[tuple(str(row[c]) for c in _ID)] = (verdict, str(row["agreement"] or ""))
        return out

    left, right = cells(a), cells(b)
    rows = []
    for key in sorted(set(left) | set(right)):
        was, now = left.get(key, ("-", "")), right.get(key, ("-", ""))
        if was != now:
            rows.append(
                {
                    **dict(zip(_ID, key, strict=True)),
                    "a": was[0],
                    "b": now[0],
                    "agreement_a": was[1],
                    "agreement_b": now[1],
                }
            )
    columns = [*_ID, "a", "b", "agreement_a", "agreement_b"]
    return pandas.DataFrame(rows, columns=columns)


def _main(argv: list[str]) -> int:
    """``python -m nddebug.census --diff A B`` and ``--stable-csv IN``."""
    if len(argv) == 3 and argv[0] == "--diff":
        changes = diff(read(argv[1]), read(argv[2]))
        if changes.empty:
            print(f"No measurement differs between {argv[1]} and {argv[2]}.")
            return 0
        from tabulate import tabulate

        print(tabulate(changes.values.tolist(), headers=list(changes.columns)))
        return 1
    if len(argv) == 2 and argv[0] == "--stable-csv":
        sys.stdout.write(stable_csv(read(argv[1])))
        return 0
    print(
        "usage: python -m nddebug.census --diff A B | --stable-csv FILE "
        "(A, B, FILE: census tables, .csv or JSON lines)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        # Results go to a private copy of stdout; anything else printed goes to stderr.
        results = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.exit(_worker(results))
    try:
        sys.exit(_main(sys.argv[1:]))
    except CensusError as exc:
        sys.exit(f"nddebug census: {exc}")
