"""The `nddebug` command: run a script in fresh processes, re-render, diff, look up culprits.

Exit codes a CI job can use: 0 reproducible, 1 culprits found, 2 usage or input error,
130 interrupted (Ctrl-C), 143 stopped by SIGTERM (`census`: 0 measured, 2 usage error, 130
interrupted or stopped).
Every command is a thin layer over recordings, analysis and renderers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from nddebug.errors import NddebugError, NotComparableError

OK, FOUND, ERROR = 0, 1, 2
INTERRUPTED = 130  # Ctrl-C, as a shell reports it
TERMINATED = 143  # SIGTERM, as a shell reports it


class UsageError(NddebugError):
    """Bad arguments or input: exit code 2."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a job scheduler's or CI runner's stop, `kill`): handled as Ctrl-C is. It
    reaches nddebug's process alone, not its children: with no handler, the script's
    process went on running with nothing to wait for it, and what was recorded was lost."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated


def _stopped(exc: KeyboardInterrupt) -> tuple[str, int]:
    """What stopped the command, in words, and its exit code."""
    if isinstance(exc, Terminated):
        return "stopped (SIGTERM)", TERMINATED
    return "interrupted", INTERRUPTED


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nddebug",
        description="Find the TensorFlow op that makes training non-reproducible.",
        epilog="Exit codes: 0 reproducible, 1 culprits found, 2 usage or input error, "
        "130 interrupted, 143 stopped by SIGTERM.",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run a script N times, each in a fresh process, and compare its trace blocks",
        description=(
            "Runs SCRIPT N times, each in a fresh Python process, records the nddebug.trace() "
            "blocks in it (or, with --all, every op of the script), and compares the runs. "
            "This sees what repeats inside one process cannot: autotuning, hash "
            "randomisation, thread scheduling, data-loader order."
        ),
    )
    run.add_argument("-n", "--runs", type=int, default=3, help="number of runs (default 3)")
    run.add_argument("--all", action="store_true", help="trace the whole script")
    run.add_argument(
        "--hashseed",
        default="inherit",
        help="PYTHONHASHSEED for the runs: a number (fixed), 'random' (a different one per "
        "run) or 'inherit' (default: as in this shell)",
    )
    run.add_argument(
        "--deterministic",
        action="store_true",
        help="set TF_DETERMINISTIC_OPS=1 in the runs (test whether op determinism fixes it)",
    )
    run.add_argument(
        "--emulate-gpu",
        action="store_true",
        help="run the script's trace() blocks under nddebug.emulate_gpu() (rehearse a GPU)",
    )
    run.add_argument(
        "--verify",
        action="store_true",
        help="then re-run the script with each source's fix applied (op determinism, seeds) "
        "and say per source: fixed, still divergent, or the fix raises here",
    )
    run.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra variables"
    )
    run.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="run each run as an N-worker MultiWorkerMirroredStrategy job on this machine "
        "(TF_CONFIG on localhost ports, a process per worker); compare each worker's runs and "
        "the workers with each other",
    )
    run.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="stop a run whose processes have not all finished after this long",
    )
    run.add_argument(
        "-o",
        "--output",
        help="also save every run's recordings to this file, each run as soon as it ends",
    )
    run.add_argument(
        "--show-output",
        action="store_true",
        help="show the runs' standard output and error (on standard error) as they come; "
        "otherwise only the last lines of a failed run's standard error are shown",
    )
    detail = run.add_mutually_exclusive_group()
    detail.add_argument(
        "--steps",
        action="store_true",
        help="keep one digest per step instead of every op execution (very long runs): "
        "says at which step the runs first part, not which op",
    )
    detail.add_argument(
        "--bisect",
        action="store_true",
        help="--steps, then run the script twice more recording only the first divergent "
        "step in full, to name the op (the script must replay deterministically up to it)",
    )
    run.add_argument("--format", choices=["text", "html", "csv", "json"], default="text")
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")

    report = sub.add_parser("report", help="re-render a saved recording file")
    report.add_argument("file")
    report.add_argument("--format", choices=["text", "html", "csv", "json"], default="text")
    report.add_argument("-o", "--output", help="write here instead of standard output")

    diff = sub.add_parser(
        "diff",
        help="compare two recordings from different environments",
        description=(
            "Compares the first run of A with the first run of B (e.g. two machines, TF "
            "versions or devices): first the environment differences, then the first op "
            "where the computations part, and the ops after it. Files `nddebug run -o` "
            "wrote are compared block by block."
        ),
    )
    diff.add_argument("a")
    diff.add_argument("b")

    ops = sub.add_parser("ops", help="search the knowledge base of known culprits")
    ops.add_argument("filter", nargs="?", default="", help="text to look for (any column)")

    census = sub.add_parser(
        "census",
        help="measure which ops are deterministic here, with and without op determinism",
        description=(
            "Runs every op of the census catalogue (the knowledge base's ops and the common "
            "training ops, forward and backward, at a few sizes) repeatedly with "
            "bitwise-identical inputs on one device, with and without op determinism (each "
            "in a fresh worker process), and compares the result with the knowledge base. "
            "The full CPU census takes a few minutes; progress goes to standard error."
        ),
    )
    census.add_argument("--device", help="CPU, GPU or GPU:1 (default: the first GPU, else CPU)")
    census.add_argument(
        "--ops", default="", help="comma-separated op types to measure (default: all; see --list)"
    )
    census.add_argument("--repeats", type=int, default=10, help="runs per case (default 10)")
    census.add_argument("--determinism", choices=["off", "on", "both"], default="both")
    census.add_argument("--format", choices=["text", "html", "csv", "json"], default="text")
    census.add_argument("-o", "--output", help="write the table here instead of standard output")
    census.add_argument(
        "--save",
        metavar="FILE",
        help="write every row as soon as it is measured (FILE.csv: CSV, else JSON lines); "
        "survives an interrupted census",
    )
    census.add_argument(
        "--timeout", type=float, default=300.0, help="seconds one case may take (default 300)"
    )
    census.add_argument("--list", action="store_true", help="list the catalogue and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    streams = sys.stdout, sys.stderr
    # A reader that stops reading (`| head`, `2>&1 | head`) is not an error of the command:
    # what is left to write is dropped, the runs go on, and the exit code gives the verdict.
    sys.stdout, sys.stderr = _Unbroken(sys.stdout), _Unbroken(sys.stderr)
    import signal
    import threading

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        sys.stdout.flush()  # what print() left buffered meets a gone reader here, not at exit
        sys.stderr.flush()
        sys.stdout, sys.stderr = streams


def _main(args: argparse.Namespace) -> int:
    try:
        commands = {"run": _run, "report": _report, "diff": _diff, "ops": _ops, "census": _census}
        return commands[args.command](args)
    except (NddebugError, OSError) as exc:
        if args.debug:
            raise
        print(f"nddebug: error: {exc}", file=sys.stderr)
        return ERROR
    except KeyboardInterrupt as exc:
        if args.debug:
            raise
        how, code = _stopped(exc)
        print(f"nddebug: {how}", file=sys.stderr)
        return code


def _emit(text: str, output: str | None) -> None:
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        _say(text[:-1] if text.endswith("\n") else text)


def _say(text: str = "") -> None:
    """Print a line of the result to standard output, now (see :class:`_Unbroken`)."""
    print(text, flush=True)


def _reader_gone(stream: Any) -> None:
    """Point a stream whose pipe's reader is gone at /dev/null, so that nothing written or
    buffered later fails."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)


class _Unbroken:
    """A text stream whose reader may be gone: the first write or flush that meets a closed
    pipe points the file descriptor at /dev/null (so nothing buffered fails later, at exit)
    and the command goes on. It said "nddebug: error: [Errno 32] Broken pipe" and exited 2
    (1 where the error message itself met the closed pipe) over a verdict of 0 or 1."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:
        _reader_gone(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def render(report: Any, fmt: str) -> str:
    """The report in one of the CLI's formats."""
    if fmt == "html":
        return "<!doctype html><meta charset='utf-8'><title>nddebug report</title>\n" + (
            report._repr_html_()
        )
    if fmt == "csv":
        return report.culprits.to_csv(index=False)
    if fmt == "json":
        return json.dumps(_as_json(report), indent=2, default=str)
    return str(report)


def _as_json(report: Any) -> dict[str, Any]:
    """What ``--format json`` holds for one comparison."""
    return {
        "summary": report.summary,
        "warnings": report.warnings,
        "culprits": json.loads(report.culprits.to_json(orient="records")),
    }


def _as_runs(recordings: Sequence[Any]) -> list[list[list[Any]]] | None:
    """The recordings of a file written by `nddebug run -o` as ``per_run[i][k][b]`` (run,
    worker, block), read from their labels (see _run_label); None for other files. A file
    that `run` appended to more than once holds each session's runs one after the other."""
    where: dict[tuple[int, int, int], Any] = {}
    offset, top = 0, -1
    for rec in recordings:
        m = _RUN_LABEL.fullmatch(rec.label)
        if m is None or rec.kind == "capture":
            return None
        i, k, b = int(m[1]), int(m[2] or 0), int(m[3] or 1) - 1
        if (offset + i, k, b) in where:  # the same process again: the next session's
            offset = top + 1
        top = max(top, offset + i)
        where[(offset + i, k, b)] = rec
    per_run: list[list[list[Any]]] = []
    for i in sorted({i for i, _, _ in where}):
        workers = 1 + max(k for j, k, _ in where if j == i)
        run = []
        for k in range(workers):
            blocks = sorted(b for j, kk, b in where if (j, kk) == (i, k))
            if blocks != list(range(len(blocks))):
                return None  # a gap: not as `run` writes them
            run.append([where[(i, k, b)] for b in blocks])
        per_run.append(run)
    return per_run


def _report(args: argparse.Namespace) -> int:
    from nddebug import storage
    from nddebug.check import compare, load
    from nddebug.longruns import compare_file, long_run_threshold
    from nddebug.recording import Recording

    _check_output(args.output, "the report file")
    index = storage.run_index(args.file)
    checks = _by_check([label for _, label, _, _ in index])
    if not checks and len(index) >= 2 and max(n for *_, n in index) >= long_run_threshold():
        headers = [Recording(run_id=r, label=label, kind=kind) for r, label, kind, _ in index]
        grouped = _as_runs(headers)  # `nddebug run -o` files: one block, one worker each?
        if grouped is None or all(len(run) == 1 and len(run[0]) == 1 for run in grouped):
            # Long runs of one block: compared as arrays, the first divergent call in full.
            report = compare_file(args.file)
            _emit(render(report, args.format), args.output)
            return OK if report.ok else FOUND
    recordings = load(args.file)
    if not recordings:
        raise UsageError(f"{args.file}: the file holds no runs")
    if checks and len(recordings) == len(index):
        # check(path=) called several times, or for an XLA step: each check (each program)
        # compared apart.
        collected: list[str] = []
        pieces = _Pieces(args.format, collected.append, several=True)
        status = OK
        for title, where in checks:
            recs = [recordings[i] for i in where]
            pieces.text(f"\n=== {title} ===")
            try:
                report = compare(recs)
            except NotComparableError as exc:
                raise UsageError(f"{args.file}: {exc}") from None
            pieces.report(report, {"block": None, "label": title, "worker": None})
            status = max(status, OK if report.ok else FOUND)
        pieces.finish()
        _emit("\n".join(collected).lstrip("\n"), args.output)
        return status
    per_run = _as_runs(recordings)
    if per_run is not None and max(len(blocks) for run in per_run for blocks in run) == 1:
        if max(len(run) for run in per_run) == 1:
            per_run = None  # one block, one worker: every recording is one run of it
    if per_run is None:
        try:
            report = compare(recordings)
        except NotComparableError as exc:
            raise UsageError(f"{args.file}: {exc}") from None  # which file could not be
        _emit(render(report, args.format), args.output)
        return OK if report.ok else FOUND
    # Several blocks or workers, as `nddebug run -o` saves them: compared as `run` did.
    pieces: list[str] = []
    status = _compare_blocks(per_run, args.format, pieces.append)
    _emit("\n".join(pieces).lstrip("\n"), args.output)
    return status


def _by_check(labels: list[str]) -> list[tuple[str, list[int]]]:
    """The runs of each check() call in a file `check(path=)` wrote, as (title, positions);
    [] for any other file, and for one check of a step without XLA.

    Each call appends its runs ("repeat 0", "repeat 1", captures; "rerun" in rerun mode): a
    file written by a check every few steps holds runs that started from other weights by
    design, and compared as one set they "differed" (state carried over) where every check
    had said reproducible (probe round 48, F3). A new check starts at its first run, "repeat
    0" or "rerun". A check of a step compiled with XLA holds two programs: the step as
    compiled (labels beginning ``as compiled: ``) and, where that was not shown
    reproducible, the step with XLA off; they are compared apart too (probe round 47,
    F7)."""
    from nddebug.check import AS_COMPILED

    starts = ("repeat 0", "rerun")
    checks: list[list[int]] = []
    for i, label in enumerate(labels):
        label = label or ""
        compiled = label.startswith(AS_COMPILED)
        plain = label.removeprefix(AS_COMPILED)
        after_compiled = bool(checks) and (labels[i - 1] or "").startswith(AS_COMPILED)
        if not checks or (plain in starts and (compiled or not after_compiled)):
            checks.append([])
        checks[-1].append(i)
    if len(checks) == 1 and not any((x or "").startswith(AS_COMPILED) for x in labels):
        return []
    if any((labels[c[0]] or "").removeprefix(AS_COMPILED) not in starts for c in checks):
        return []  # not (only) check()'s runs
    groups: list[tuple[str, list[int]]] = []
    for n, positions in enumerate(checks, 1):
        head = f"check {n} of {len(checks)}" if len(checks) > 1 else ""
        compiled = [i for i in positions if (labels[i] or "").startswith(AS_COMPILED)]
        rest = [i for i in positions if i not in compiled]
        parts = [("the step as compiled (XLA on)", compiled)] if compiled else []
        if rest:
            parts.append(("the step with XLA off (to name the op)" if compiled else "", rest))
        for title, where in parts:
            groups.append((": ".join(t for t in (head, title) if t), where))
    return groups


def _hashseed(option: str, run: int) -> str | None:
    if option == "inherit":
        return None
    if option == "random":
        return str(random.SystemRandom().randrange(1, 2**32 - 1))
    if not option.isdigit():
        raise UsageError(f"--hashseed takes a number, 'random' or 'inherit', not {option!r}")
    return option


def _check_output(output: str | None, what: str = "the recording file") -> None:
    """Fail before any run (or any report is computed) if ``-o``'s folder is missing or
    cannot be written."""
    if not output:
        return
    path = os.path.abspath(output)
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        raise UsageError(f"-o {output}: {path} is a folder; give {what}'s name")
    if not os.path.isdir(folder):
        raise UsageError(f"-o {output}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (
        os.path.exists(path) and not os.access(path, os.W_OK)
    ):
        raise UsageError(f"-o {output}: cannot write in the folder {folder}")
    if what != "the recording file":
        return
    from nddebug import storage

    appendable = getattr(storage, "check_appendable", None)  # (newer storage modules)
    if appendable is not None:
        try:
            appendable(output)
        except NddebugError as exc:
            raise UsageError(f"-o {exc}") from None
    elif os.path.isfile(path) and os.path.getsize(path):
        with open(path, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise UsageError(f"-o {output}: exists and is not a recording")


def _options_env(args: argparse.Namespace, extra: dict[str, str]) -> dict[str, str]:
    """What the options and --env set in every run's environment (the runs of --verify's
    fixes too: with --all they trace the whole script as the runs did)."""
    from nddebug.tracer import DETAIL_ENV, EMULATE_ENV

    env = dict(extra)
    if args.deterministic:
        env["TF_DETERMINISTIC_OPS"] = "1"
    if args.all:
        env["NDDEBUG_TRACE_ALL"] = "1"
    if args.emulate_gpu:
        env[EMULATE_ENV] = "1"
    if args.steps or args.bisect:
        env[DETAIL_ENV] = "steps"
    return env


def _run_env(args: argparse.Namespace, extra: dict[str, str], i: int) -> dict[str, str]:
    """The environment of run ``i``: the user's, the options', and what nddebug sets."""
    env = {**os.environ, **_options_env(args, extra)}
    seed = _hashseed(args.hashseed, i)
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    if args.show_output:
        env.setdefault("PYTHONUNBUFFERED", "1")  # its output as it comes
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _run(args: argparse.Namespace) -> int:
    from nddebug.storage import save

    workers = args.workers
    if workers < 1:
        raise UsageError(f"--workers must be at least 1, got {workers}")
    if args.runs < (1 if workers > 1 else 2):
        raise UsageError(f"-n must be at least 2 to compare runs, got {args.runs}")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if os.path.isdir(args.script):
        raise UsageError(f"{args.script} is a folder: name the script to run in it")
    if not os.path.isfile(args.script):
        raise UsageError(f"{args.script}: no such script")
    extra = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env takes NAME=VALUE, not {item!r}")
        extra[name] = value
    _check_output(args.output)
    # per_run[i][k]: the trace blocks of run i, worker k (one worker without --workers).
    per_run: list[list[list[Any]]] = []
    i = 0
    with tempfile.TemporaryDirectory(prefix="nddebug-run-") as tmp:
        try:
            for i in range(args.runs):
                per_run.append(_one_run(args, _run_env(args, extra, i), i, tmp))
                if args.output:
                    # Saved as each run ends: a later run's failure or Ctrl-C loses none.
                    try:
                        save([rec for blocks in per_run[-1] for rec in blocks], args.output)
                    except (NddebugError, OSError) as exc:
                        raise UsageError(f"could not save run {i + 1}: {exc}") from None
        except UsageError as exc:
            kept = _keep_partial(per_run, tmp, i, args, "before it")
            raise UsageError(f"{exc}\n{kept}" if kept else str(exc)) from None
        except KeyboardInterrupt as exc:
            kept = _keep_partial(per_run, tmp, i, args, "so far")
            how, code = _stopped(exc)
            print(
                f"nddebug: {how} in run {i + 1}/{args.runs}, its processes stopped: "
                + (kept[:1].lower() + kept[1:] if kept else "nothing was recorded, none saved."),
                file=sys.stderr,
                flush=True,
            )
            return code
    counts = {len(blocks) for run in per_run for blocks in run}
    if len(counts) != 1:
        saved = f" (the runs are saved in {args.output})" if args.output else ""
        raise UsageError(
            f"the runs recorded different numbers of trace blocks ({sorted(counts)}): "
            f"the script's path through its trace blocks differs between runs{saved}"
        )

    def verify(report: Any) -> None:
        env = _options_env(args, extra)
        table = report.verify(script=args.script, args=args.args, runs=args.runs, **env)
        _say("\nFixes, verified in fresh runs:")
        _say(table.to_string(index=False))

    status = _compare_blocks(
        per_run, args.format, print, mode="processes", verify=verify if args.verify else None
    )
    if args.bisect and status == FOUND and workers == 1:
        status = max(status, _bisect(args, extra, per_run))
    return status


def _bisect(args: argparse.Namespace, extra: dict[str, str], per_run: list[Any]) -> int:
    """Second pass of --bisect: for each block whose runs part at a step, run the script
    twice more recording that step in full (the steps before it as digests, to check that the
    replay reproduced them) and print the op-level report of that step."""
    import copy

    from nddebug.check import compare
    from nddebug.tracer import DETAIL_ENV
    from nddebug.tracer.steps import STEP_OP

    status = OK
    blocks = min(len(run[0]) for run in per_run)
    for b in range(blocks):
        first = compare([run[0][b] for run in per_run]).first_divergence
        if first is None or first.step is None:
            continue
        counts = first.steps_per_run or []
        made = sum(1 for n in counts if n >= first.step)
        if counts and made < len(counts):
            # A step that some runs made and others did not: nothing to record in full in a
            # run that never gets there, and two runs that part this way part every time.
            _say(
                f"\n=== --bisect: trace block {b + 1} ===\nThe runs made different numbers of "
                f"steps: {', '.join(f'run {i + 1}: {n}' for i, n in enumerate(counts))}. "
                f"They agree up to step {first.step - 1} "
                f"and part at step {first.step}, which only {made} of {len(per_run)} runs "
                "made: what decided when to stop (an early-stopping condition, a time or "
                "step budget, a data loader's length) differed between the runs, not the "
                "ops of a step. Nothing is recorded in full: compare what the loop's "
                "condition reads."
            )
            status = max(status, FOUND)
            continue
        # The step to record in full is the folded step that diverged first, counted as the
        # recorder folds them (one per top-level call) in the run that made it; the report's
        # step counts only the calls of the function called most often.
        ref = per_run[first.run][0][b]
        k = sum(1 for ev in ref.events[: first.index + 1] if ref.ops[ev.op_id].op_type == STEP_OP)
        k2 = _through_step(ref, k)
        _say(
            f"\n=== --bisect: step {first.step} of trace block {b + 1}, recorded in full in 2 "
            "fresh runs ==="
        )
        again = copy.copy(args)
        again.runs = 2
        second = []
        with tempfile.TemporaryDirectory(prefix="nddebug-bisect-") as tmp:
            for i in range(2):
                env = {**_run_env(args, extra, i), DETAIL_ENV: f"step:{k}-{k2}"}
                second.append(_one_run(again, env, i, tmp))
        recs = [run[0][b] for run in second if b < len(run[0])]
        if len(recs) < 2:
            _say("(the second pass did not record this block: nothing to compare)")
            continue
        replayed = _replayed(ref, recs[0], k)
        if replayed:
            _say(f"warning: {replayed}")
        report = compare(recs)
        report.mode = "processes"
        _say(render(report, args.format))
        if report.ok and not replayed:
            _say(
                f"note: the first pass's runs parted at step {first.step}, but in these two "
                "the step computed the same bits: that divergence does not happen in every "
                "run (a race between threads, a timing-dependent choice, or a value from "
                "outside TensorFlow such as the clock). It is still a divergence: run "
                "--bisect again, with more runs (-n), to catch it in full."
            )
        status = max(status, OK if report.ok else FOUND)
    return status


def _through_step(rec: Any, k: int) -> int:
    """The folded step (one per top-level call) that ends the report's step holding folded
    step ``k``: the report counts only the calls of the function called most often, and the
    other calls (an evaluation every few steps) belong to the step they lead into. Recording
    folded step ``k`` alone recorded an evaluation call without the training step it leads
    into, and the second report numbered it as the step before ("step 4 of 4", where the
    first said 5 of 12)."""
    from collections import Counter

    from nddebug.tracer.steps import STEP_OP

    callees = [
        rec.ops[ev.op_id].attrs.get("callee", "")
        for ev in rec.events
        if rec.ops[ev.op_id].op_type == STEP_OP
    ]
    if not callees:
        return k
    main = Counter(callees).most_common(1)[0][0]
    for j in range(k, len(callees) + 1):
        if callees[j - 1] == main:
            return j
    return k


def _replayed(first_pass: Any, second_pass: Any, k: int) -> str:
    """ "" when the second pass reproduced the first pass's steps before ``k`` bit for bit,
    else what to do about it."""
    from nddebug.tracer.steps import STEP_OP

    def folded(rec: Any) -> list[Any]:
        return [ev.digests for ev in rec.events if rec.ops[ev.op_id].op_type == STEP_OP]

    before = folded(first_pass)[: k - 1]
    if folded(second_pass)[: k - 1] == before:
        return ""
    return (
        f"the second pass did not replay steps 1 to {k - 1} as the first did: the script "
        "must be deterministic up to that step (seeds, data order, no clock or PYTHONHASHSEED "
        "in the inputs), or the op named below may belong to another divergence"
    )


def _own_label(rec: Any) -> str:
    """The label a trace block gave itself (``trace(label=...)``, a child process's), without
    the ``process 1 block 2`` part `nddebug run` puts before it (see _run_label)."""
    return (rec.label or "").partition(": ")[2] if _RUN_LABEL.fullmatch(rec.label or "") else ""


def _aligned(per_run: list[list[list[Any]]]) -> tuple[list[list[list[Any]]], list[str], bool]:
    """The runs' blocks lined up by label: block ``b`` of every run is the same block of the
    script (its own label and how many blocks of that label came before it), None where a
    run has none. Also each position's label, and whether the runs took different paths
    through their blocks (one run's blocks are not the first blocks of another's, as a
    stopped run's are). Blocks without labels line up in order, as before.

    A file two `run -o` sessions appended to, the second with the script's evaluation
    block switched off, had its "eval" block compared with the other session's second
    "train" block: "NOT reproducible" for a deterministic script (probe round 46, F8)."""
    keyed: list[list[list[tuple[str, int]]]] = []
    order: list[tuple[str, int]] = []
    for run in per_run:
        keyed.append([])
        for blocks in run:
            seen: dict[str, int] = {}
            keys = []
            for rec in blocks:
                label = _own_label(rec)
                keys.append((label, seen.get(label, 0)))
                seen[label] = seen.get(label, 0) + 1
            keyed[-1].append(keys)
            for key in keys:
                if key not in order:
                    order.append(key)
    sequences = [keys for run in keyed for keys in run]
    longest = max(sequences, key=len, default=[])
    parted = any(keys != longest[: len(keys)] for keys in sequences)
    if not parted:
        return per_run, [label for label, _ in longest], False
    place = {key: j for j, key in enumerate(order)}
    lined: list[list[list[Any]]] = []
    for run, run_keys in zip(per_run, keyed, strict=True):
        lined.append([])
        for blocks, keys in zip(run, run_keys, strict=True):
            row: list[Any] = [None] * len(order)
            for rec, key in zip(blocks, keys, strict=True):
                row[place[key]] = rec
            lined[-1].append(row)
    return lined, [label for label, _ in order], True


class _Pieces:
    """Where _compare_blocks puts its results: text goes to ``out`` as it comes; for
    ``--format json`` and ``csv`` every comparison is kept and written once, as one
    document (a JSON object with a ``blocks`` list; one CSV table with ``block``, ``label``
    and ``worker`` columns), which a program can parse (probe round 46, F9)."""

    def __init__(self, fmt: str, out: Any, several: bool) -> None:
        self.fmt, self.out = fmt, out
        self.whole = several and fmt in ("json", "csv")
        self.entries: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def text(self, line: str) -> None:
        """A line of the text report (kept as a note in a JSON document)."""
        if not self.whole:
            self.out(line)
        else:
            self.notes.append(re.sub(r"^=== (.*) ===$", r"\1", line.strip(), flags=re.M))

    def report(self, report: Any, where: dict[str, Any]) -> None:
        if not self.whole:
            self.out(render(report, self.fmt))
            return
        self.entries.append({**where, "report": report})

    def finish(self) -> None:
        if not self.whole:
            return
        if self.fmt == "json":
            blocks = [
                {**{k: v for k, v in e.items() if k != "report"}, **_as_json(e["report"])}
                for e in self.entries
            ]
            self.out(json.dumps({"blocks": blocks, "notes": self.notes}, indent=2, default=str))
            return
        import pandas as pd

        tables = []
        for e in self.entries:
            table = e["report"].culprits.copy()
            for j, name in enumerate(("block", "label", "worker")):
                table.insert(j, name, e.get(name))
            tables.append(table)
        self.out(pd.concat(tables, ignore_index=True).to_csv(index=False) if tables else "")


def _compare_blocks(
    per_run: list[list[list[Any]]],
    fmt: str,
    out: Any,
    mode: str | None = None,
    verify: Any = None,
) -> int:
    """Compare the runs block by block (and worker by worker); ``out`` gets each piece of
    text. ``per_run[i][k][b]``: block b of worker k in run i (a run may lack trailing blocks,
    or a worker, when it was stopped). Blocks are matched by their labels (see _aligned).
    The exit code: the worst of the comparisons."""
    from nddebug.check import compare

    per_run, labels, parted = _aligned(per_run)
    workers = max((len(run) for run in per_run), default=0)
    blocks = max((len(w) for run in per_run for w in run), default=0)
    pieces = _Pieces(fmt, out, blocks > 1 or workers > 1)
    status = OK
    for b in range(blocks):
        label = labels[b] if b < len(labels) else ""
        if blocks > 1:
            pieces.text(f"\n=== trace block {b + 1} of {blocks}{': ' + label if label else ''} ===")
        for k in range(workers):
            held = [i for i, run in enumerate(per_run) if k < len(run) and b < len(run[k])]
            recs = [per_run[i][k][b] for i in held if per_run[i][k][b] is not None]
            if workers > 1:
                pieces.text(f"\n=== worker {k}: its {len(recs)} runs compared ===")
            if parted and len(recs) < len(per_run):
                ran = [i + 1 for i in held if per_run[i][k][b] is not None]
                pieces.text(
                    f"The runs took different paths through their trace blocks: this block "
                    f"was recorded in run(s) {', '.join(map(str, ran)) or 'none'} only, of "
                    f"{len(per_run)}; it is compared among those."
                )
                status = max(status, FOUND)
            if any(r.kind == "rerun" for r in recs):
                status = max(status, _each_rerun(recs, pieces, b + 1, label))
                continue
            if len(recs) < 2:
                pieces.text("(one run: nothing to compare across runs)")
                continue
            report = compare(recs)
            if mode is not None:
                report.mode = mode
            pieces.report(
                report, {"block": b + 1, "label": label, "worker": k if workers > 1 else None}
            )
            status = max(status, OK if report.ok else FOUND)
            if verify is not None and not report.ok and workers == 1:
                verify(report)
        if workers > 1:
            status = max(status, _workers_agree(per_run, b, workers, pieces.text))
    pieces.finish()
    return status


def _each_rerun(recs: list[Any], pieces: Any, block: int, label: str) -> int:
    """A block the script recorded with trace(rerun=k): each run is compared with its own
    re-executions. The runs are not compared with each other: on the CPU a rerun recording
    holds its ops' outputs only, not their inputs, so nothing could tell a source from an op
    that only propagated. `nddebug run` ended with an error once every run had finished, and
    kept nothing without -o (probe round 48, F9)."""
    from nddebug.check import compare

    pieces.text(
        "Recorded with trace(rerun=k): each run is compared with its own re-executions, and "
        "the runs are not compared with each other (trace() without rerun= compares them)."
    )
    status = OK
    for i, rec in enumerate(recs):
        pieces.text(f"\n=== run {i + 1}: its re-executions ===")
        report = compare([rec])
        pieces.report(report, {"block": block, "label": label, "worker": None})
        status = max(status, OK if report.ok else FOUND)
    return status


def _one_run(args: argparse.Namespace, env: dict[str, str], i: int, tmp: str) -> list[list[Any]]:
    """Run the script once (as ``--workers`` processes of one job); each worker's blocks.

    Prints the run's progress line. Each process writes its standard output and error to
    files in ``tmp`` (a pipe that nobody reads would stop a chatty script for good); with
    ``--show-output`` they are also copied to standard error as they come."""
    import time

    from nddebug.tracer import LABEL_ENV, RECORD_ENV
    from nddebug.tracer.block import ENTERED_SUFFIX

    n = args.workers
    what = f" with {n} workers" if n > 1 else ""
    head = f"nddebug: run {i + 1}/{args.runs}{what}: {args.script}"
    # One line per run, its second half when the run ends; with --show-output the runs' own
    # lines come in between, so the run's outcome repeats the head.
    if args.show_output:
        print(head, file=sys.stderr, flush=True)
    else:
        print(f"{head} … ", end="", file=sys.stderr, flush=True)
    start = time.monotonic()
    cluster = [f"localhost:{port}" for port in _free_ports(n)] if n > 1 else []
    procs: list[subprocess.Popen] = []
    paths, errs, tails = [], [], []
    outcome = "failed"
    try:
        try:
            for k in range(n):
                base = os.path.join(tmp, f"run{i}-worker{k}")
                label = _run_label(i, k if n > 1 else None)
                wenv = {**env, RECORD_ENV: f"{base}.nddebug", LABEL_ENV: label}
                if n > 1:
                    task = {"type": "worker", "index": k}
                    wenv["TF_CONFIG"] = json.dumps({"cluster": {"worker": cluster}, "task": task})
                cmd = [sys.executable, "-m", "nddebug.runner", args.script, *args.args]
                with open(f"{base}.stdout", "wb") as so, open(f"{base}.stderr", "wb") as se:
                    # No standard input: a script that asks for some would wait unseen (its
                    # prompt goes to a file) for what a second run could not be given alike.
                    procs.append(
                        subprocess.Popen(
                            cmd, env=wenv, stdin=subprocess.DEVNULL, stdout=so, stderr=se
                        )
                    )
                paths.append(f"{base}.nddebug")
                errs.append(f"{base}.stderr")
                if args.show_output:
                    tails += [_Tail(f"{base}.stdout"), _Tail(f"{base}.stderr")]
            who = (lambda k: f"run {i + 1}, worker {k}") if n > 1 else (lambda k: f"run {i + 1}")
            _wait_all(procs, args.timeout, who, errs, tails)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            for tail in tails:
                tail.pump(final=True)
        out = []
        for k, path in enumerate(paths):
            if not os.path.exists(path):
                worker = f" in worker {k}" if n > 1 else ""
                if os.path.exists(path + ENTERED_SUFFIX):
                    raise UsageError(
                        f"{args.script} entered a nddebug.trace() block{worker}, but its "
                        "process ended inside it, before the block finished (os._exit(), or "
                        "killed by something that was not a signal): nothing of it was saved"
                    )
                raise UsageError(
                    f"{args.script} ran no nddebug.trace() block{worker}: wrap the training "
                    "step in `with nddebug.trace():`, or pass --all to trace the whole script"
                )
            out.append(_load_run_file(path, i, k if n > 1 else None, procs[k].pid))
        outcome = "done"
    except KeyboardInterrupt:
        outcome = "interrupted"
        raise
    finally:
        if outcome != "done":
            print(f"{head}: {outcome}" if args.show_output else outcome, file=sys.stderr)
    counts = sorted({len(blocks) for blocks in out})
    if n == 1:
        blocks = f"{counts[0]} block(s)"
    else:
        blocks = "/".join(str(len(w)) for w in out) if len(counts) > 1 else str(counts[0])
        blocks += " block(s) per worker"
    events = sum(len(rec) for w in out for rec in w)
    done = f"done in {time.monotonic() - start:.1f} s, {blocks}, {events} op executions"
    if args.show_output and _Tail.open_line:
        print(file=sys.stderr)  # not glued onto the script's unfinished last line
        _Tail.open_line = False
    print(f"{head}: {done}" if args.show_output else done, file=sys.stderr, flush=True)
    return out


def _run_label(i: int, k: int | None, b: int | None = None, own: str = "") -> str:
    """How `nddebug run` labels a recording: ``process 1``, ``process 1 worker 0``,
    ``process 1 block 2`` (only for scripts with several blocks), then ``: <label>`` for a
    block that has its own label. `nddebug report` groups a file's recordings by them."""
    worker = "" if k is None else f" worker {k}"
    block = "" if b is None else f" block {b + 1}"
    return f"process {i}{worker}{block}" + (f": {own}" if own else "")


_RUN_LABEL = re.compile(r"process (\d+)(?: worker (\d+))?(?: block (\d+))?(?:: .*)?", re.S)


def _load_run_file(path: str, i: int, k: int | None, root: int | None = None) -> list[Any]:
    """One process's recordings, labelled with their block (see _run_label); with ``root``,
    the pid of the process `nddebug run` started, its blocks first and then those of the
    processes it started (see _by_origin)."""
    from nddebug.storage import load

    recs = load(path)
    default = _run_label(i, k)
    recs, children = _by_origin(recs, root)
    for b, rec in enumerate(recs):
        own = "" if rec.label == default else rec.label
        if id(rec) in children:  # a block of another process: say which program made it
            program = rec.environment.get("program") or "python"
            own = f"{own} (in a child process, {program})" if own else f"a child process, {program}"
        rec.label = _run_label(i, k, b if len(recs) > 1 else None, own)
    return recs


def _by_origin(recs: list[Any], root: int | None) -> tuple[list[Any], set[int]]:
    """The blocks of one run in an order that is the same in every run, and the ids of
    those another process recorded. A script's child processes (a launcher's train.py, a
    multiprocessing pool's tasks) save their blocks into the same file, in the order they
    finish: run 1 had the child's block first, run 2 the parent's, and two programs'
    blocks were compared with each other (probe round 45, F5). The started process's own
    blocks come first, in their order; then the others, by program, label and place
    among that process's blocks of that program and label. Blocks of several processes of
    one program with no label to tell them apart are still in the order they finished."""
    pids = {rec.environment.get("pid") for rec in recs}
    if root is None or len(pids) < 2:
        return recs, set()
    own = [rec for rec in recs if rec.environment.get("pid") == root]
    others = [rec for rec in recs if rec.environment.get("pid") != root]
    seen: dict[tuple[Any, str, str], int] = {}

    def key(rec: Any) -> tuple[str, str, int]:
        program, label = str(rec.environment.get("program") or ""), rec.label
        place = seen.get((rec.environment.get("pid"), program, label), 0)
        seen[(rec.environment.get("pid"), program, label)] = place + 1
        return program, label, place

    keyed = [(key(rec), n, rec) for n, rec in enumerate(others)]
    ordered = [rec for _, _, rec in sorted(keyed, key=lambda x: (x[0], x[1]))]
    return own + ordered, {id(rec) for rec in others}


class _Tail:
    """Copies what a run writes to its output file onto this process's standard error, whole
    lines at a time (a run's standard output and error are copied in turns)."""

    #: Whether the last bytes copied left a line open (a script's last line without its end):
    #: nddebug's own next line starts on a new one.
    open_line = False

    def __init__(self, path: str) -> None:
        self.path, self.offset, self.pending = path, 0, b""

    def pump(self, final: bool = False) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        data = self.pending + data
        cut = len(data)
        if not final:
            cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            if cut == 0 and len(data) >= 65536:
                cut = len(data)  # a line without an end is shown once it is long
        data, self.pending = data[:cut], data[cut:]
        if not data:
            return
        _Tail.open_line = not data.endswith((b"\n", b"\r"))
        try:
            sys.stderr.flush()
            buffer = getattr(sys.stderr, "buffer", None)
            if buffer is not None:  # the bytes as they are (past the _Unbroken wrapper)
                buffer.write(data)
                buffer.flush()
            else:
                sys.stderr.write(data.decode("utf-8", "replace"))
                sys.stderr.flush()
        except BrokenPipeError:  # the reader stopped reading: the run and its verdict go on
            _reader_gone(sys.stderr)


def _last_lines(path: str, n: int = 15) -> str:
    """The last n lines of a run's standard error (read from its end: it may be huge)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line[:1000] for line in text.strip().splitlines()[-n:]]
    return "\n".join(lines)


def _wait_all(
    procs: list[Any],
    timeout: float | None,
    who: Any,
    errs: list[str],
    tails: Sequence[_Tail] = (),
) -> None:
    """Wait for every process; the first that fails, or the timeout, stops them all.

    A process killed by SIGINT (Ctrl-C reaches the whole process group) is an interruption."""
    import signal
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    pending = set(range(len(procs)))
    while pending:
        for tail in tails:
            tail.pump()
        for k in sorted(pending):
            code = procs[k].poll()
            if code is None:
                continue
            pending.discard(k)
            if code != 0:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                if code == -signal.SIGINT and _interrupted_here():
                    raise KeyboardInterrupt
                tail = _last_lines(errs[k])
                others = " (the other workers were stopped)" if len(procs) > 1 else ""
                said = f":\n{tail}" if tail else " (it wrote nothing to standard error)"
                raise UsageError(f"{who(k)} failed ({_exit_status(code)}){others}{said}")
        if pending and deadline is not None and time.monotonic() > deadline:
            names = ", ".join(str(k) for k in sorted(pending))
            stuck = f"worker(s) {names} still running" if len(procs) > 1 else "still running"
            why = (
                " (a worker that waits for a missing or stuck peer never returns)"
                if len(procs) > 1
                else " (raise --timeout if the script needs longer)"
            )
            raise UsageError(
                f"{who(min(pending))} timed out after {timeout:g} s: {stuck}, all stopped{why}"
            )
        if pending:
            time.sleep(0.05)


def _interrupted_here() -> bool:
    """Whether a run that SIGINT killed was stopped by a Ctrl-C (which reaches nddebug too:
    the terminal sends it to the whole process group), not by its own doing: a script that
    raises KeyboardInterrupt (Python then ends with SIGINT) or signals itself failed, and was
    reported as "interrupted" with no word of where. The signal reaches this process at
    the same moment as the run's, and the run takes longer to die than this process takes to
    raise it: waiting a moment lets a pending one arrive (time.sleep returns early for it)."""
    import time

    try:
        time.sleep(0.5)
    except KeyboardInterrupt:
        return True
    return False


def _exit_status(code: int) -> str:
    """A run's exit code as a person reads it: a negative code is the signal that killed it,
    and SIGKILL from nobody in the session is most often the kernel's out-of-memory killer."""
    import signal

    if code >= 0:
        return f"exit {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    why = {
        signal.SIGKILL: " (the system may have run out of memory)",
        signal.SIGINT: " (not a Ctrl-C given to nddebug: the script raised KeyboardInterrupt "
        "or signalled its own process)",
    }.get(-code, "")
    return f"exit {code}: killed by {name}{why}"


def _free_ports(n: int) -> list[int]:
    """n ports free on localhost now (the OS picks them; the workers bind them next)."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _keep_partial(
    per_run: list[list[list[Any]]], tmp: str, i: int, args: argparse.Namespace, when: str
) -> str:
    """Keep what was recorded before run i failed or was stopped: the finished runs and the
    blocks run i finished, in -o if given, else in a new temporary folder (never the working
    directory, which may be read-only or not yours to litter). Says where ("" if nothing)."""
    from nddebug.storage import save

    output, script, workers = args.output, args.script, args.workers
    finished = [rec for run in per_run for blocks in run for rec in blocks]
    partial: list[Any] = []
    for name in sorted(os.listdir(tmp)):
        if name.startswith(f"run{i}-") and name.endswith(".nddebug"):
            k = int(name[len(f"run{i}-worker") : -len(".nddebug")])
            try:
                partial += _load_run_file(os.path.join(tmp, name), i, k if workers > 1 else None)
            except NddebugError:
                continue  # a process killed while writing: its file may be unreadable
    known = {rec.run_id for rec in finished}
    # Run i may have finished a block; a block it was cut in before any op ran holds nothing
    # to read back (a SyntaxError under --all: "1 recording(s) saved" named an empty file).
    partial = [
        rec
        for rec in partial
        if rec.run_id not in known and (rec.events or rec.status != "interrupted")
    ]
    if not finished and not partial:
        return ""
    count = len(finished) + len(partial)
    failed = ""
    if output:
        try:
            save(finished + partial, output)  # those already there are skipped (run_id)
            return f"The {count} recording(s) made {when} are saved in {output}."
        except (NddebugError, OSError) as exc:
            failed = f" (not in {output}: {exc})"
    stem = os.path.splitext(os.path.basename(script))[0] or "run"
    path = os.path.join(tempfile.mkdtemp(prefix="nddebug-partial-"), f"{stem}.nddebug")
    try:
        save(finished + partial, path)
    except (NddebugError, OSError) as exc:
        return f"The {count} recording(s) made {when} could not be saved: {exc}"
    return f"The {count} recording(s) made {when} are saved in {path}{failed}."


def _workers_agree(per_run: list[list[list[Any]]], b: int, workers: int, out: Any) -> int:
    """Print, per run, whether the workers ended the step with the same variables."""
    from nddebug.replicas import worker_consistency

    status = OK
    for i, run in enumerate(per_run):
        if len(run) < workers or any(len(blocks) <= b or blocks[b] is None for blocks in run):
            continue  # a run stopped (or went another way) before all its workers got here
        result = worker_consistency([blocks[b] for blocks in run])
        out(f"\n=== the workers of run {i + 1} compared with each other ===\n{result}")
        status = max(status, OK if result.consistent else FOUND)
    return status


def _diff(args: argparse.Namespace) -> int:
    from nddebug.check import load

    a_runs, b_runs = load(args.a), load(args.b)
    if not a_runs or not b_runs:
        raise UsageError("both files must hold at least one run")
    # A file `nddebug run -o` wrote holds each run's trace blocks: every block of the first
    # run is compared, not block 1 alone ("agree bit for bit" while block 2 differed; probe
    # round 46, F5).
    a_blocks, b_blocks = _first_run_blocks(a_runs), _first_run_blocks(b_runs)
    n = min(len(a_blocks), len(b_blocks))
    pieces, status = [], OK
    if len(a_blocks) != len(b_blocks):
        pieces.append(
            f"nddebug: {args.a} holds {len(a_blocks)} trace block(s) per run and {args.b} "
            f"{len(b_blocks)}: the first {n} are compared, in order."
        )
        status = FOUND
    for k in range(n):
        if n > 1:
            pieces.append(f"\n=== trace block {k + 1} of {n} ===")
        text, ok = _diff_pair(a_blocks[k], b_blocks[k])
        pieces.append(text)
        status = max(status, OK if ok else FOUND)
    _say("\n".join(pieces).lstrip("\n"))
    return status


def _first_run_blocks(recordings: list[Any]) -> list[Any]:
    """The trace blocks of a file's first run (worker 0) for a file `nddebug run -o` wrote,
    else its first recording alone."""
    per_run = _as_runs(recordings)
    return list(per_run[0][0]) if per_run else recordings[:1]


def _diff_pair(a: Any, b: Any) -> tuple[str, bool]:
    """The environment differences and the comparison of two runs, and whether they agree."""
    from nddebug.analysis import flat_environment
    from nddebug.check import compare

    ea, eb = flat_environment(a.environment), flat_environment(b.environment)
    lines = ["Environment differences:"]
    skip = ("machine", "seeds.python_random_state_hash", "pid")
    changed = [k for k in sorted(set(ea) | set(eb)) if k not in skip and ea.get(k) != eb.get(k)]
    lines += [f"  {k}: {ea.get(k, '(absent)')!s}  ->  {eb.get(k, '(absent)')!s}" for k in changed]
    if not changed:
        lines.append("  (none)")
    report = compare([a, b])
    report.mode = "diff"
    first = next(iter(report.comparison.findings), None)
    lines.append("")
    if report.ok:
        lines.append("The computations agree bit for bit.")
    elif first is not None:
        op = first.op
        lines.append(
            f"The computations first part at {op.op_type} ({op.op_name or 'eager'}), created at "
            f"{op.location or '?'}: {first.explanation}."
        )
    lines += ["", str(report)]
    return "\n".join(lines), report.ok


def _ops(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from nddebug.knowledge import known_ops

    df = known_ops()
    if args.filter:
        text = df.astype(str).agg(" ".join, axis=1).str.lower()
        df = df[text.str.contains(args.filter.lower(), regex=False)]
    if df.empty:
        _say(f"No known culprit matches {args.filter!r}.")
        return OK
    cols = ["op_type", "device", "pass", "kind", "under_determinism", "fix"]
    rows = [[str(r[c])[:70] if c == "fix" else r[c] for c in cols] for _, r in df.iterrows()]
    _say(tabulate(rows, headers=cols, tablefmt="simple"))
    return OK


def _census(args: argparse.Namespace) -> int:
    import warnings

    from tabulate import tabulate

    from nddebug.census import census, to_text
    from nddebug.census_cases import CASES, cases

    ops = [name.strip() for name in args.ops.split(",") if name.strip()] or None
    _check_output(args.output, "the table file")
    if args.list:
        try:
            chosen = cases(ops) if ops else CASES
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        rows = [[c.op_type, c.pass_, c.api, c.size, c.skip or ""] for c in chosen]
        _say(tabulate(rows, headers=["op type", "pass", "TF call", "size", "not measured"]))
        return OK
    settings = {"off": (False,), "on": (True,), "both": (False, True)}[args.determinism]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # said below, in the CLI's words
        df = census(
            device=args.device,
            ops=ops,
            repeats=args.repeats,
            determinism=settings,
            path=args.save,
            timeout=args.timeout,
        )
    interrupted = bool(df.attrs.get("interrupted"))
    if interrupted:
        kept = f"{len(df)} measurement(s) kept" + (f", also in {args.save}" if args.save else "")
        print(f"nddebug: census interrupted: {kept}", file=sys.stderr)
    if args.format == "csv":
        text = df.to_csv(index=False)
    elif args.format == "json":
        text = json.dumps(
            {"interrupted": interrupted, "rows": json.loads(df.to_json(orient="records"))},
            indent=2,
        )
    elif args.format == "html":
        text = "<!doctype html><meta charset='utf-8'><title>nddebug census</title>\n" + df.to_html(
            index=False, na_rep=""
        )
    else:
        text = to_text(df) if len(df) else "Nothing was measured."
    _emit(text, args.output)
    return INTERRUPTED if interrupted else OK


if __name__ == "__main__":
    sys.exit(main())
