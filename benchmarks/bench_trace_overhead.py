"""What ``nddebug.trace()`` costs on a real training step, next to tfdbg2.

Run from the repository root::

    .venv/bin/python benchmarks/bench_trace_overhead.py            # full run (~3-4 min)
    .venv/bin/python benchmarks/bench_trace_overhead.py --quick    # short run (~1-2 min)

The step: the seed-000 MNIST CNN (``nddebug.examples.mnist_cnn.make_model()``) trained by
``make_custom_step(model)`` (a ``tf.function`` GradientTape step) on one batch of 128 from
``make_data(128)``, held as ``tf.constant`` so no host conversion is timed. CPU only.

Everything is measured in ONE process, side by side:

Phase A, interleaved round by round (the order of the variants alternates each round, so a
noisy machine slows every variant alike). Reported per variant: the median and the minimum
ms/step, the ratio of medians to the plain step, and the *paired* ratio: the median over
rounds of (variant / plain step timed in the same round), the figure checked against the
target because it cancels slow phases of a shared machine best:

- ``plain``: a step function traced outside any instrumentation;
- ``trace(): one block per step``: a fresh step function whose first call (tracing) happened
  inside ``with nddebug.trace():``, then each timed step in its own block (enter and exit,
  i.e. ``environment.capture()`` and the final sort, are included);
- ``trace(): one long block``: the same function, ``--steps`` steps inside one block; per step
  = block time / steps;
- ``instrumented, outside trace()``: the same function called with no block active (its digest
  ops still run; only the host callbacks return at once);
- ``trace() enter+exit, empty block``: the fixed cost of a block.

Phase B, after phase A (tfdbg2 instrumentation cannot be removed from a function traced while it
was enabled, and calling such a function after ``disable_dump_debug_info()`` crashes the
process, so each mode gets a fresh step function, used only while its mode is enabled):
for CURT_HEALTH, FULL_HEALTH, FULL_TENSOR (cheapest dump first),
``enable_dump_debug_info(tmpdir, tensor_debug_mode=M, circular_buffer_size=-1)``, trace a fresh
step, then interleave it with the plain step (whose one eager call op is then also seen by
tfdbg2's eager hook: a scalar output, negligible), disable, and size the dump. The dump per
step is the ``.execution`` + ``.graph_execution_traces`` files divided by the steps run; the
one-time graph, source-file and stack-frame files are reported separately.

Recording size: the Recording of one step (one block) saved with ``rec.save()`` to a fresh
file, and the recording of the long block (per step).

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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (ROOT, os.path.join(ROOT, "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from _common import interleave, machine, paired_ratio, source_state  # noqa: E402
from tabulate import tabulate  # noqa: E402

import nddebug  # noqa: E402
from nddebug.examples import mnist_cnn  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "trace_overhead.json")
TARGET_RATIO = 2.5
TARGET_MB_PER_STEP = 1.0
TFDBG_MODES = ("CURT_HEALTH", "FULL_HEALTH", "FULL_TENSOR")
PER_STEP_FILES = (".execution", ".graph_execution_traces")


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _dir_bytes(root: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            out[f] = out.get(f, 0) + os.path.getsize(os.path.join(dirpath, f))
    return out


def _file_bytes(path: str) -> int:
    return os.path.getsize(path)


def _ms(seconds: float) -> float:
    return seconds * 1e3


def _stats(samples: dict[str, list[float]], cpu: dict[str, list[float]], reps: dict) -> dict:
    return {
        "samples_ms": {k: [_ms(v) for v in vs] for k, vs in samples.items()},
        "median_ms": {k: _ms(statistics.median(v)) for k, v in samples.items()},
        "min_ms": {k: _ms(min(v)) for k, v in samples.items()},
        "paired_ratio_to_plain": {k: paired_ratio(samples, k, "plain", reps) for k in samples},
        "cpu_samples_ms": {k: [_ms(v) for v in vs] for k, vs in cpu.items()},
        "cpu_median_ms": {k: _ms(statistics.median(v)) for k, v in cpu.items()},
    }


def phase_a(model, x, y, plain, rounds: int, reps: int, steps: int, tmp: str) -> dict:
    """plain vs nddebug.trace(), interleaved."""
    traced = mnist_cnn.make_custom_step(model)
    t0 = time.perf_counter()
    with nddebug.trace() as first_rec:
        traced(x, y)
    first_call_s = time.perf_counter() - t0
    if first_rec.warnings:
        print("warnings while tracing:", *first_rec.warnings[:5], sep="\n  ")

    def one_block() -> None:
        with nddebug.trace():
            traced(x, y)

    def long_block() -> None:
        with nddebug.trace():
            for _ in range(steps):
                traced(x, y)

    def empty_block() -> None:
        with nddebug.trace():
            pass

    variants = {
        "plain": (lambda: plain(x, y), 1, reps),
        "trace(): one block per step": (one_block, 1, reps),
        f"trace(): one long block ({steps} steps)": (long_block, steps, 1),
        "instrumented, outside trace()": (lambda: traced(x, y), 1, reps),
        "trace() enter+exit, empty block": (empty_block, 1, reps),
    }
    for run, _, _ in variants.values():  # warm up
        run()
    cpu: dict[str, list[float]] = {}
    samples = interleave(variants, rounds, cpu)

    # Recording sizes, on fresh files.
    with nddebug.trace() as rec1:
        traced(x, y)
    one_path = os.path.join(tmp, "one_step.nddebug")
    rec1.save(one_path)
    with nddebug.trace() as recn:
        for _ in range(steps):
            traced(x, y)
    many_path = os.path.join(tmp, "many_steps.nddebug")
    recn.save(many_path)
    one_bytes = _file_bytes(one_path)
    many_bytes = _file_bytes(many_path)
    recording = {
        "one_step_file_bytes": one_bytes,
        "one_step_events": len(rec1.events),
        "ops": len(rec1.ops),
        "one_step_bytes_per_event": one_bytes / max(1, len(rec1.events)),
        "long_block_steps": steps,
        "long_block_file_bytes": many_bytes,
        "long_block_events": len(recn.events),
        "long_block_bytes_per_step": many_bytes / steps,
        "incremental_bytes_per_step": (many_bytes - one_bytes) / max(1, steps - 1),
        "warnings": rec1.warnings,
    }
    return {
        "first_call_s": first_call_s,
        **_stats(samples, cpu, {k: v[2] for k, v in variants.items()}),
        "recording": recording,
    }


def phase_b_mode(model, x, y, plain, mode: str, rounds: int, reps: int) -> dict:
    """plain vs one tfdbg2 mode, interleaved, in this process."""
    root = tempfile.mkdtemp(prefix=f"nddebug-bench-tfdbg-{mode}-")
    steps_run = 0
    try:
        tf.debugging.experimental.enable_dump_debug_info(
            root, tensor_debug_mode=mode, circular_buffer_size=-1
        )
        try:
            step = mnist_cnn.make_custom_step(model)
            t0 = time.perf_counter()
            step(x, y)
            first_call_s = time.perf_counter() - t0
            steps_run += 1

            def dbg() -> None:
                nonlocal steps_run
                step(x, y)
                steps_run += 1

            variants = {"plain": (lambda: plain(x, y), 1, reps), mode: (dbg, 1, reps)}
            dbg()
            plain(x, y)
            cpu: dict[str, list[float]] = {}
            samples = interleave(variants, rounds, cpu)
        finally:
            tf.debugging.experimental.disable_dump_debug_info()
        files = _dir_bytes(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per_step_bytes = sum(v for k, v in files.items() if k.endswith(PER_STEP_FILES))
    one_time = sum(v for k, v in files.items() if not k.endswith(PER_STEP_FILES))
    return {
        "first_call_s": first_call_s,
        **_stats(samples, cpu, {k: v[2] for k, v in variants.items()}),
        "steps_dumped": steps_run,
        "dump_bytes_per_step": per_step_bytes / steps_run,
        "dump_one_time_bytes": one_time,
        "dump_files": {k.rsplit(".", 1)[-1]: v for k, v in files.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run")
    parser.add_argument("--no-tfdbg", action="store_true", help="skip phase B (tfdbg2)")
    parser.add_argument("--out", default=RESULTS, help="JSON results file")
    args = parser.parse_args()
    if args.quick:
        rounds, reps, steps, b_rounds, ft_rounds = 3, 2, 3, 2, 2
    else:
        rounds, reps, steps, b_rounds, ft_rounds = 12, 3, 5, 6, 3

    model = mnist_cnn.make_model()
    xn, yn = mnist_cnn.make_data(128)
    x, y = tf.constant(xn), tf.constant(yn)
    plain = mnist_cnn.make_custom_step(model)
    t0 = time.perf_counter()
    plain(x, y)
    plain_first_s = time.perf_counter() - t0

    tmp = tempfile.mkdtemp(prefix="nddebug-bench-")
    try:
        a = phase_a(model, x, y, plain, rounds, reps, steps, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    b: dict[str, dict] = {}
    if not args.no_tfdbg:
        for mode in TFDBG_MODES:
            n = ft_rounds if mode == "FULL_TENSOR" else b_rounds
            b[mode] = phase_b_mode(model, x, y, plain, mode, n, 1 if mode == "FULL_TENSOR" else 2)
    final_loss = float(plain(x, y))

    plain_ms = a["median_ms"]["plain"]
    cpu_plain = a["cpu_median_ms"]["plain"]
    rec = a["recording"]
    rows = []
    for name, ms in a["median_ms"].items():
        extra = ""
        if name.startswith("trace(): one block"):
            extra = f"recording {rec['one_step_file_bytes'] / 1e6:.3f} MB/step"
        elif name.startswith("trace(): one long"):
            extra = f"recording {rec['long_block_bytes_per_step'] / 1e6:.3f} MB/step"
        rows.append(
            [
                name,
                f"{ms:.1f}",
                f"{a['min_ms'][name]:.1f}",
                f"{ms / plain_ms:.2f}",
                f"{a['paired_ratio_to_plain'][name]:.2f}",
                f"{a['cpu_median_ms'][name]:.0f} ({a['cpu_median_ms'][name] / cpu_plain:.2f}x)",
                extra,
            ]
        )
    for mode, r in b.items():
        rows.append(
            [
                f"tfdbg2 {mode}",
                f"{r['median_ms'][mode]:.1f}",
                f"{r['min_ms'][mode]:.1f}",
                f"{r['median_ms'][mode] / plain_ms:.2f}",
                f"{r['paired_ratio_to_plain'][mode]:.2f}",
                f"{r['cpu_median_ms'][mode]:.0f} "
                f"({r['cpu_median_ms'][mode] / r['cpu_median_ms']['plain']:.2f}x)",
                f"dump {r['dump_bytes_per_step'] / 1e6:.3f} MB/step",
            ]
        )
    print()
    print(
        tabulate(
            rows,
            headers=[
                "variant",
                "median ms/step",
                "min ms",
                "x plain (medians)",
                "x plain (paired)",
                "CPU ms/step (x plain)",
                "size",
            ],
            disable_numparse=True,
        )
    )
    print(
        "x plain (medians): median / phase-A plain median. x plain (paired): median over rounds "
        "of the ratio to the plain step timed in the same round (tfdbg2: its own rounds). CPU: "
        "this process's CPU time per step (all threads), median, and its ratio to plain."
    )
    one_name = "trace(): one block per step"
    long_name = next(k for k in a["median_ms"] if k.startswith("trace(): one long"))
    trace_ratio = a["paired_ratio_to_plain"][one_name]
    long_ratio = a["paired_ratio_to_plain"][long_name]
    mb = rec["one_step_file_bytes"] / 1e6
    print(
        f"\nrecording of one step: {rec['one_step_file_bytes']} bytes, "
        f"{rec['one_step_events']} op executions, {rec['one_step_bytes_per_event']:.0f} B per "
        f"op execution ({rec['ops']} ops); long block: {rec['long_block_bytes_per_step']:.0f} "
        f"B/step, {rec['incremental_bytes_per_step']:.0f} B per additional step"
    )
    print(
        f"first call (trace + instrument): plain {plain_first_s:.2f} s, nddebug "
        f"{a['first_call_s']:.2f} s"
        + "".join(f", tfdbg2 {m} {r['first_call_s']:.2f} s" for m, r in b.items())
    )
    ok = "OK " if trace_ratio <= TARGET_RATIO else "MISS"
    print(
        f"[{ok}] trace() one block per step {trace_ratio:.2f}x plain, paired "
        f"({a['median_ms'][one_name] / plain_ms:.2f}x by medians; long block {long_ratio:.2f}x); "
        f"target <= {TARGET_RATIO}x"
    )
    ok = "OK " if mb <= TARGET_MB_PER_STEP else "MISS"
    print(f"[{ok}] recording {mb:.3f} MB/step; target <= {TARGET_MB_PER_STEP} MB/step")
    print(f"(loss after the run: {final_loss:.4f})")

    results = {
        "benchmark": "trace_overhead",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "quick": args.quick,
        "source": source_state(),
        "config": {
            "model": "mnist_cnn.make_model(seed=0)",
            "step": "mnist_cnn.make_custom_step(model) (tf.function)",
            "batch": 128,
            "phase_a_rounds": rounds,
            "reps_per_round": reps,
            "long_block_steps": steps,
        },
        "plain_first_call_s": plain_first_s,
        "plain_median_ms": plain_ms,
        "nddebug": a,
        "ratios_to_plain_by_medians": {k: v / plain_ms for k, v in a["median_ms"].items()},
        "ratios_to_plain_paired": a["paired_ratio_to_plain"],
        "tfdbg2": b,
        "targets": {
            "trace_ratio_max": TARGET_RATIO,
            "trace_ratio": trace_ratio,
            "trace_ratio_ok": trace_ratio <= TARGET_RATIO,
            "recording_mb_per_step_max": TARGET_MB_PER_STEP,
            "recording_mb_per_step": mb,
            "recording_ok": mb <= TARGET_MB_PER_STEP,
        },
        "final_loss": final_loss,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
