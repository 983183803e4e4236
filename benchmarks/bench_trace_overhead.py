"""What ``nddebug.trace()`` costs on real training steps, next to tfdbg2 CURT_HEALTH.

Run from the repository root::

    .venv/bin/python benchmarks/bench_trace_overhead.py            # full run (~10 min on 2 cores)
    .venv/bin/python benchmarks/bench_trace_overhead.py --quick    # short run (~4 min)

Workloads (each a ``tf.function`` GradientTape step, ``mnist_cnn.make_custom_step(model)``,
on inputs held as ``tf.constant``), on whatever device TensorFlow has:

- ``cnn-b128`` / ``cnn-b1024``: the seed-000 MNIST CNN at batch 128 and 1024;
- ``resnet-b128``: ``benchmarks/_resnet_like.py`` (3 stages of 2 residual blocks, BatchNorm,
  Adam; about 1,900 op executions per step) at batch 128, 32x32x3 inputs.

Per workload, in ONE process, interleaved round by round (the order alternates each round,
so a noisy machine slows every variant alike):

- ``plain``: the step traced outside any instrumentation;
- ``trace()``: a fresh step first called inside ``with nddebug.trace():``, each timed step in
  its own block (enter and exit included). On the CPU this is the native path (C++ digest op
  and record buffer, :mod:`nddebug.native`) when it builds;
- ``trace(), pure-TF``: the same, instrumented with ``NDDEBUG_NATIVE=0``: digests made of TF
  ops and one host callback per op execution (the code before the native ops; the GPU path);
- ``outside trace()`` and ``outside trace(), pure-TF``: those two functions called with no
  block active;
- ``tfdbg2 CURT_HEALTH``: ``enable_dump_debug_info(tmpdir, tensor_debug_mode="CURT_HEALTH",
  circular_buffer_size=-1)``, a fresh step traced while enabled, interleaved with ``plain``
  in its own rounds, then disabled (a function traced under tfdbg2 crashes the process if called
  after ``disable_dump_debug_info()``, so it is only called while enabled).

Reported: median ms/step, the ratio of medians, the *paired* ratio (median over rounds of
variant / plain in the same round: the figure checked against the targets), the process's CPU
time per step, the first call of each (tracing and instrumentation; ``plain`` is a fresh
function's first call after everything is warm; ``plain`` and ``trace()``: the median of three
fresh functions), the recording size of one step, and how
often the host was reached per traced step (host callbacks and buffer drains).

Results: a table on stdout and ``benchmarks/results/trace_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (ROOT, os.path.join(ROOT, "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import _resnet_like  # noqa: E402
import tensorflow as tf  # noqa: E402
from _common import interleave, machine, paired_ratio, source_state  # noqa: E402
from tabulate import tabulate  # noqa: E402

import nddebug  # noqa: E402
from nddebug import native  # noqa: E402
from nddebug.examples import mnist_cnn  # noqa: E402
from nddebug.tracer import transport  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "trace_overhead.json")
# The targets (paired ratios to the plain step).
#: CPU: issue 20 (trace() also no dearer than tfdbg2 CURT_HEALTH, checked where it ran).
#: GPU: issue 22 (the native GPU kernels).
TARGETS = {
    "CPU": {"trace": 1.15, "outside": 1.02, "first_call": 1.5},
    "GPU": {"trace": 1.3, "outside": 1.02, "first_call": 2.0},
}
WORKLOADS: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "cnn-b128": (mnist_cnn.make_model, lambda: mnist_cnn.make_data(128)),
    "cnn-b1024": (mnist_cnn.make_model, lambda: mnist_cnn.make_data(1024)),
    "resnet-b128": (_resnet_like.make_model, lambda: _resnet_like.make_data(128)),
}
TRACE = "trace()"
PURE = "trace(), pure-TF"
OUT = "outside trace()"
OUT_PURE = "outside trace(), pure-TF"
DBG = "tfdbg2 CURT_HEALTH"
FIRST_CALLS = 3  # fresh functions per first-call figure (the pure-TF path: one, it is slow)


#: --sync: every timed step ends with its result on the host, as a training loop that logs
#: its loss each step does. Without it a GPU step is timed until its kernels are queued,
#: while trace() waits for them at the block's end (its drain).
SYNC = False


def _done(result: Any) -> Any:
    return result.numpy() if SYNC and result is not None else result


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _ms(seconds: float) -> float:
    return seconds * 1e3


def _stats(samples: dict[str, list[float]], cpu: dict[str, list[float]], reps: dict) -> dict:
    return {
        "samples_ms": {k: [_ms(v) for v in vs] for k, vs in samples.items()},
        "median_ms": {k: _ms(statistics.median(v)) for k, v in samples.items()},
        "paired_ratio_to_plain": {k: paired_ratio(samples, k, "plain", reps) for k in samples},
        "cpu_median_ms": {k: _ms(statistics.median(v)) for k, v in cpu.items()},
    }


def _first_traced_call(step: Any, x: Any, y: Any, pure: bool) -> tuple[float, Any]:
    previous = os.environ.get(native.ENV)
    if pure:
        os.environ[native.ENV] = "0"
    try:
        t0 = time.perf_counter()
        with nddebug.trace() as rec:
            step(x, y)
        return time.perf_counter() - t0, rec
    finally:
        if previous is None:
            os.environ.pop(native.ENV, None)
        else:
            os.environ[native.ENV] = previous


def measure_nddebug(
    model: Any, x: Any, y: Any, plain: Any, rounds: int, reps: int, with_pure: bool = True
) -> dict:
    """plain vs trace() (both paths unless not ``with_pure``) vs outside trace(), interleaved;
    first calls; sizes."""
    # First calls vary by tens of percent from one to the next on a shared machine: the
    # median of FIRST_CALLS fresh functions each, plain and traced alternating.
    firsts: dict[str, list[float]] = {"plain": [], TRACE: []}
    for _ in range(FIRST_CALLS):
        firsts["plain"].append(_timed(lambda: mnist_cnn.make_custom_step(model)(x, y)))
        fast = mnist_cnn.make_custom_step(model)
        seconds, rec = _first_traced_call(fast, x, y, pure=False)
        firsts[TRACE].append(seconds)
    first = {k: statistics.median(v) for k, v in firsts.items()}
    pure = mnist_cnn.make_custom_step(model)
    if with_pure:
        first[PURE], _ = _first_traced_call(pure, x, y, pure=True)
    if rec.warnings:
        print("warnings while tracing:", *rec.warnings[:5], sep="\n  ")

    def block(step: Any) -> Callable[[], None]:
        def run() -> None:
            with nddebug.trace():
                _done(step(x, y))

        return run

    variants = {
        "plain": (lambda: _done(plain(x, y)), 1, reps),
        TRACE: (block(fast), 1, reps),
        PURE: (block(pure), 1, reps),
        OUT: (lambda: _done(fast(x, y)), 1, reps),
        OUT_PURE: (lambda: _done(pure(x, y)), 1, reps),
    }
    if not with_pure:
        del variants[PURE], variants[OUT_PURE]
    for run, _, _ in variants.values():  # warm up
        run()
    cpu: dict[str, list[float]] = {}
    samples = interleave(variants, rounds, cpu)

    transfers = {}
    for name, step in ((TRACE, fast), (PURE, pure))[: 2 if with_pure else 1]:
        before = dict(transport.COUNTS)
        with nddebug.trace() as one:
            step(x, y)
        transfers[name] = {k: transport.COUNTS[k] - before[k] for k in before}
        transfers[name]["events"] = len(one.events)
    path = os.path.join(tempfile.mkdtemp(prefix="nddebug-bench-"), "one_step.nddebug")
    with nddebug.trace() as one:
        fast(x, y)
    one.save(path)
    size = os.path.getsize(path)
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    empty = min(_timed(block(lambda *_: None)) for _ in range(5))
    return {
        **_stats(samples, cpu, {k: v[2] for k, v in variants.items()}),
        "first_call_s": first,
        "first_call_samples_s": firsts,
        "host_transfers_per_step": transfers,
        "recording_bytes_per_step": size,
        "empty_block_ms": _ms(empty),
    }


def measure_tfdbg(model: Any, x: Any, y: Any, plain: Any, rounds: int, reps: int) -> dict:
    """plain vs tfdbg2 CURT_HEALTH, interleaved, in this process."""
    root = tempfile.mkdtemp(prefix="nddebug-bench-tfdbg-")
    try:
        tf.debugging.experimental.enable_dump_debug_info(
            root, tensor_debug_mode="CURT_HEALTH", circular_buffer_size=-1
        )
        try:
            step = mnist_cnn.make_custom_step(model)
            first_s = _timed(lambda: step(x, y))
            variants = {
                "plain": (lambda: _done(plain(x, y)), 1, reps),
                DBG: (lambda: _done(step(x, y)), 1, reps),
            }
            step(x, y)
            plain(x, y)
            cpu: dict[str, list[float]] = {}
            samples = interleave(variants, rounds, cpu)
        finally:
            tf.debugging.experimental.disable_dump_debug_info()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {**_stats(samples, cpu, {k: v[2] for k, v in variants.items()}), "first_call_s": first_s}


def run_workload(name: str, rounds: int, reps: int, tfdbg: bool, with_pure: bool = True) -> dict:
    make_model, make_data = WORKLOADS[name]
    model = make_model()
    xn, yn = make_data()
    x, y = tf.constant(xn), tf.constant(yn)
    plain = mnist_cnn.make_custom_step(model)
    plain(x, y)
    measured = measure_nddebug(model, x, y, plain, rounds, reps, with_pure)
    result = {"batch": int(xn.shape[0]), "nddebug": measured}
    if tfdbg:
        result["tfdbg2"] = measure_tfdbg(model, x, y, plain, rounds, reps)
    return result


def table(results: dict[str, dict]) -> list[list[str]]:
    rows = []
    for wl, r in results.items():
        a = r["nddebug"]
        entries = [(k, a, a["first_call_s"].get(k)) for k in a["median_ms"]]
        if "tfdbg2" in r:
            entries.append((DBG, r["tfdbg2"], r["tfdbg2"]["first_call_s"]))
        for name, src, first in entries:
            first_ratio = "" if first is None else f"{first / a['first_call_s']['plain']:.2f}"
            rows.append(
                [
                    wl if name == "plain" else "",
                    name,
                    f"{src['median_ms'][name]:.1f}",
                    f"{src['median_ms'][name] / src['median_ms']['plain']:.2f}",
                    f"{src['paired_ratio_to_plain'][name]:.2f}",
                    f"{src['cpu_median_ms'][name] / src['cpu_median_ms']['plain']:.2f}",
                    "" if first is None else f"{first:.2f} ({first_ratio}x)",
                ]
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run")
    parser.add_argument("--no-tfdbg", action="store_true", help="skip tfdbg2")
    parser.add_argument("--no-pure", action="store_true", help="skip the pure-TF path")
    parser.add_argument(
        "--sync", action="store_true", help="each timed step fetches its result to the host"
    )
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument("--out", default=RESULTS, help="JSON results file")
    args = parser.parse_args()
    rounds, reps = (4, 1) if args.quick else (10, 2)
    global SYNC
    SYNC = args.sync
    device = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    lib = native.load()
    print(f"device {device}; native ops: {lib.path if lib else native.problem() or 'off'}")
    results = {}
    for wl in args.workloads.split(","):
        t0 = time.perf_counter()
        results[wl] = run_workload(wl, rounds, reps, not args.no_tfdbg, not args.no_pure)
        print(f"{wl}: {time.perf_counter() - t0:.0f} s")

    print()
    headers = ["workload", "variant", "ms/step", "x plain (medians)", "x plain (paired)"]
    headers += ["CPU x plain", "first call s (x plain)"]
    print(tabulate(table(results), headers=headers, disable_numparse=True))
    targets = TARGETS[device]
    checks = []
    for wl, r in results.items():
        a = r["nddebug"]
        first = a["first_call_s"][TRACE] / a["first_call_s"]["plain"]
        for what, value in (
            ("trace", a["paired_ratio_to_plain"][TRACE]),
            ("outside", a["paired_ratio_to_plain"][OUT]),
            ("first_call", first),
        ):
            ok = value <= targets[what]
            checks.append({"workload": wl, "what": what, "value": value, "ok": ok})
            print(f"[{'OK ' if ok else 'MISS'}] {wl} {what}: {value:.2f}x <= {targets[what]}x")
        if "tfdbg2" in r:
            ours = a["paired_ratio_to_plain"][TRACE]
            theirs = r["tfdbg2"]["paired_ratio_to_plain"][DBG]
            ok = ours <= theirs
            checks.append({"workload": wl, "what": "trace vs tfdbg2", "value": ours, "ok": ok})
            print(f"[{'OK ' if ok else 'MISS'}] {wl} trace: {ours:.2f}x <= tfdbg2 {theirs:.2f}x")
        t = a["host_transfers_per_step"]
        print(
            f"      host transfers per traced step: {t[TRACE]} (pure-TF: {t.get(PURE, '-')}); "
            f"recording {a['recording_bytes_per_step'] / 1e6:.3f} MB/step; "
            f"empty block {a['empty_block_ms']:.2f} ms"
        )
    out = {
        "benchmark": "trace_overhead",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "device": device,
        "native": str(lib.path) if lib else native.problem() or "off",
        "quick": args.quick,
        "sync": args.sync,
        "rounds": rounds,
        "reps_per_round": reps,
        "source": source_state(),
        "workloads": results,
        "targets": targets,
        "checks": checks,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
