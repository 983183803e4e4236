"""The `nddebug` command: run a script in fresh processes, re-render, diff, look up culprits.

Exit codes a CI job can use: 0 reproducible, 1 culprits found, 2 usage or input error
(`census`: 0 measured, 2 usage error, 130 interrupted).
Every command is a thin layer over recordings, analysis and renderers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from nddebug.errors import NddebugError

OK, FOUND, ERROR = 0, 1, 2


class UsageError(NddebugError):
    """Bad arguments or input: exit code 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nddebug",
        description="Find the TensorFlow op that makes training non-reproducible.",
        epilog="Exit codes: 0 reproducible, 1 culprits found, 2 usage or input error.",
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
    run.add_argument("-o", "--output", help="also save every run's recording to this file")
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
            "where the computations part, and the ops after it."
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
    try:
        commands = {"run": _run, "report": _report, "diff": _diff, "ops": _ops, "census": _census}
        return commands[args.command](args)
    except (NddebugError, OSError) as exc:
        if args.debug:
            raise
        print(f"nddebug: error: {exc}", file=sys.stderr)
        return ERROR


def _emit(text: str, output: str | None) -> None:
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def render(report: Any, fmt: str) -> str:
    """The report in one of the CLI's formats."""
    if fmt == "html":
        return "<!doctype html><meta charset='utf-8'><title>nddebug report</title>\n" + (
            report._repr_html_()
        )
    if fmt == "csv":
        return report.culprits.to_csv(index=False)
    if fmt == "json":
        return json.dumps(
            {
                "summary": report.summary,
                "warnings": report.warnings,
                "culprits": json.loads(report.culprits.to_json(orient="records")),
            },
            indent=2,
            default=str,
        )
    return str(report)


def _load_report(path: str) -> Any:
    from nddebug.check import compare, load

    recordings = load(path)
    if not recordings:
        raise UsageError(f"{path}: the file holds no runs")
    return compare(recordings)


def _report(args: argparse.Namespace) -> int:
    report = _load_report(args.file)
    _emit(render(report, args.format), args.output)
    return OK if report.ok else FOUND


def _hashseed(option: str, run: int) -> str | None:
    if option == "inherit":
        return None
    if option == "random":
        return str(random.SystemRandom().randrange(1, 2**32 - 1))
    if not option.isdigit():
        raise UsageError(f"--hashseed takes a number, 'random' or 'inherit', not {option!r}")
    return option


def _run(args: argparse.Namespace) -> int:
    from nddebug.check import compare
    from nddebug.storage import save
    from nddebug.tracer import EMULATE_ENV

    workers = args.workers
    if workers < 1:
        raise UsageError(f"--workers must be at least 1, got {workers}")
    if args.runs < (1 if workers > 1 else 2):
        raise UsageError(f"-n must be at least 2 to compare runs, got {args.runs}")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if not os.path.isfile(args.script):
        raise UsageError(f"{args.script}: no such script")
    extra = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env takes NAME=VALUE, not {item!r}")
        extra[name] = value
    # per_run[i][k]: the trace blocks of run i, worker k (one worker without --workers).
    per_run: list[list[list[Any]]] = []
    with tempfile.TemporaryDirectory(prefix="nddebug-run-") as tmp:
        for i in range(args.runs):
            env = {**os.environ, **extra}
            seed = _hashseed(args.hashseed, i)
            if seed is not None:
                env["PYTHONHASHSEED"] = seed
            if args.deterministic:
                env["TF_DETERMINISTIC_OPS"] = "1"
            if args.all:
                env["NDDEBUG_TRACE_ALL"] = "1"
            if args.emulate_gpu:
                env[EMULATE_ENV] = "1"
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            what = f" with {workers} workers" if workers > 1 else ""
            print(
                f"nddebug: run {i + 1}/{args.runs}{what}: {args.script}",
                file=sys.stderr,
                flush=True,
            )
            try:
                per_run.append(_one_run(args, env, i, tmp))
            except UsageError as exc:
                kept = _keep_partial(per_run, tmp, i, args.output)
                raise UsageError(f"{exc}{kept}") from None
        counts = {len(blocks) for run in per_run for blocks in run}
        if len(counts) != 1:
            raise UsageError(
                f"the runs recorded different numbers of trace blocks ({sorted(counts)}): "
                "the script's path through its trace blocks differs between runs"
            )
        if args.output:
            save([rec for run in per_run for blocks in run for rec in blocks], args.output)
    status = OK
    blocks = counts.pop()
    for b in range(blocks):
        if blocks > 1:
            print(f"\n=== trace block {b + 1} of {blocks} ===")
        for k in range(workers):
            if workers > 1:
                print(f"\n=== worker {k}: its {args.runs} runs compared ===")
            if args.runs < 2:
                print("(one run: nothing to compare across runs)")
                continue
            report = compare([run[k][b] for run in per_run])
            report.mode = "processes"
            print(render(report, args.format))
            status = max(status, OK if report.ok else FOUND)
            if args.verify and not report.ok and workers == 1:
                env = {**extra, **({EMULATE_ENV: "1"} if args.emulate_gpu else {})}
                table = report.verify(script=args.script, args=args.args, runs=args.runs, **env)
                print("\nFixes, verified in fresh runs:")
                print(table.to_string(index=False))
        if workers > 1:
            status = max(status, _workers_agree(per_run, b))
    return status


def _one_run(args: argparse.Namespace, env: dict[str, str], i: int, tmp: str) -> list[list[Any]]:
    """Run the script once (as ``--workers`` processes of one job); each worker's blocks."""
    from nddebug.storage import load
    from nddebug.tracer import LABEL_ENV, RECORD_ENV

    n = args.workers
    cluster = [f"localhost:{port}" for port in _free_ports(n)]
    procs, paths = [], []
    for k in range(n):
        path = os.path.join(tmp, f"run{i}-worker{k}.nddebug")
        label = f"process {i}" + (f" worker {k}" if n > 1 else "")
        wenv = {**env, RECORD_ENV: path, LABEL_ENV: label}
        if n > 1:
            task = {"type": "worker", "index": k}
            wenv["TF_CONFIG"] = json.dumps({"cluster": {"worker": cluster}, "task": task})
        cmd = [sys.executable, "-m", "nddebug.runner", args.script, *args.args]
        procs.append(
            subprocess.Popen(
                cmd, env=wenv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
        paths.append(path)
    who = (lambda k: f"run {i + 1}, worker {k}") if n > 1 else (lambda k: f"run {i + 1}")
    try:
        _wait_all(procs, args.timeout, who)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    out = []
    for k, path in enumerate(paths):
        if not os.path.exists(path):
            raise UsageError(
                f"{args.script} ran no nddebug.trace() block"
                f"{' in worker ' + str(k) if n > 1 else ''}: wrap the training step in "
                "`with nddebug.trace():`, or pass --all to trace the whole script"
            )
        out.append(load(path))
    return out


def _wait_all(procs: list[Any], timeout: float | None, who: Any) -> None:
    """Wait for every process; the first that fails, or the timeout, stops them all."""
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    pending = set(range(len(procs)))
    while pending:
        for k in sorted(pending):
            code = procs[k].poll()
            if code is None:
                continue
            pending.discard(k)
            if code != 0:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                _, err = procs[k].communicate()
                tail = "\n".join((err or "").strip().splitlines()[-15:])
                others = " (the other workers were stopped)" if len(procs) > 1 else ""
                raise UsageError(f"{who(k)} failed (exit {code}){others}:\n{tail}")
        if pending and deadline is not None and time.monotonic() > deadline:
            names = ", ".join(str(k) for k in sorted(pending))
            stuck = f"worker(s) {names} still running" if len(procs) > 1 else "still running"
            raise UsageError(
                f"{who(min(pending))} timed out after {timeout:g} s: {stuck}, all stopped "
                "(a worker that waits for a missing or stuck peer never returns)"
            )
        if pending:
            time.sleep(0.05)


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


def _keep_partial(per_run: list[list[list[Any]]], tmp: str, i: int, output: str | None) -> str:
    """Save what was recorded before a run failed; say where (or "" if nothing was)."""
    from nddebug.storage import load, save

    recs = [rec for run in per_run for blocks in run for rec in blocks]
    for name in sorted(os.listdir(tmp)):
        if name.startswith(f"run{i}-"):
            try:
                recs += load(os.path.join(tmp, name))
            except NddebugError:
                continue  # a worker killed while writing: its file may be unreadable
    if not recs:
        return ""
    path = output or os.path.abspath("nddebug-partial.nddebug")
    save(recs, path)
    return f"\nThe {len(recs)} recording(s) made before it are saved in {path}."


def _workers_agree(per_run: list[list[list[Any]]], b: int) -> int:
    """Print, per run, whether the workers ended the step with the same variables."""
    from nddebug.replicas import worker_consistency

    status = OK
    for i, run in enumerate(per_run):
        result = worker_consistency([blocks[b] for blocks in run])
        print(f"\n=== the workers of run {i + 1} compared with each other ===\n{result}")
        status = max(status, OK if result.consistent else FOUND)
    return status


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _diff(args: argparse.Namespace) -> int:
    from nddebug.check import compare, load

    a_runs, b_runs = load(args.a), load(args.b)
    if not a_runs or not b_runs:
        raise UsageError("both files must hold at least one run")
    a, b = a_runs[0], b_runs[0]
    ea, eb = _flatten(a.environment), _flatten(b.environment)
    lines = ["Environment differences:"]
    skip = ("machine", "seeds.python_random_state_hash")
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
    print("\n".join(lines))
    return OK if report.ok else FOUND


def _ops(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from nddebug.knowledge import known_ops

    df = known_ops()
    if args.filter:
        text = df.astype(str).agg(" ".join, axis=1).str.lower()
        df = df[text.str.contains(args.filter.lower(), regex=False)]
    if df.empty:
        print(f"No known culprit matches {args.filter!r}.")
        return OK
    cols = ["op_type", "device", "pass", "kind", "under_determinism", "fix"]
    rows = [[str(r[c])[:70] if c == "fix" else r[c] for c in cols] for _, r in df.iterrows()]
    print(tabulate(rows, headers=cols, tablefmt="simple"))
    return OK


INTERRUPTED = 130


def _census(args: argparse.Namespace) -> int:
    import warnings

    from tabulate import tabulate

    from nddebug.census import census, to_text
    from nddebug.census_cases import CASES, cases

    ops = [name.strip() for name in args.ops.split(",") if name.strip()] or None
    if args.list:
        try:
            chosen = cases(ops) if ops else CASES
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        rows = [[c.op_type, c.pass_, c.api, c.size, c.skip or ""] for c in chosen]
        print(tabulate(rows, headers=["op type", "pass", "TF call", "size", "not measured"]))
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
