"""Where an instrumented step's time goes, op by op, from TensorFlow's own profiler.

Run from the repository root (on whatever device TensorFlow has; on a GPU the kernels too)::

    .venv/bin/python benchmarks/profile_ops.py [--workloads cnn-b128] [--steps 5]

For each workload (those of ``bench_trace_overhead.py``) three variants of one step function
are profiled with ``tf.profiler.experimental`` for ``--steps`` steps each, after warm-up:

- ``plain``: traced outside any instrumentation;
- ``outside trace()``: first called inside ``nddebug.trace()``, then called with no block;
- ``trace()``: that function, each step in its own block.

From the profile (the XSpace protobuf TensorFlow writes) it reports per variant and step:
the host time of each op type the executor ran (TraceMe events named ``name:type``), the
number of op executions, and on a GPU the number and total time of the device's kernels by
name. Differences between variants say what instrumenting adds: the host time of the record
ops themselves, other ops that ran more often (copies, transposes the layout optimizer
inserted around a consumer), and extra kernels.

Results: a summary on stdout and ``benchmarks/results/profile_ops[_gpu].json``.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tensorflow as tf
from _common import RESULTS_DIR, machine, source_state
from bench_trace_overhead import WORKLOADS

import nddebug
from nddebug.examples import mnist_cnn


def _xspace(logdir: str) -> Any:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise RuntimeError(f"the profiler wrote no .xplane.pb under {logdir}")
    space = xplane_pb2.XSpace()
    with open(paths[0], "rb") as f:
        space.ParseFromString(f.read())
    return space


def summarize(space: Any, steps: int) -> dict:
    """Per step: host time and count by op type (executor TraceMe events "name:type"), and
    device kernels by name (GPU planes)."""
    host_ops: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    host_other: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    kernels: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    planes = []
    for plane in space.planes:
        planes.append(plane.name)
        meta = plane.event_metadata
        gpu = plane.name.startswith("/device:GPU")
        if not (gpu or plane.name.startswith("/host:CPU")):
            continue
        for line in plane.lines:
            for ev in line.events:
                m = meta[ev.metadata_id]
                ms = ev.duration_ps / 1e9
                if gpu:
                    table, key = kernels, (m.display_name or m.name)[:120]
                elif m.display_name:  # an op the executor ran: "name:type", type shown
                    table, key = host_ops, m.display_name
                else:
                    table, key = host_other, m.name.split("#")[0][:80]
                table[key][0] += ms
                table[key][1] += 1

    def per_step(table: dict[str, list[float]], top: int) -> dict[str, dict[str, float]]:
        rows = sorted(table.items(), key=lambda kv: -kv[1][0])[:top]
        return {k: {"ms": round(v[0] / steps, 4), "count": v[1] / steps} for k, v in rows}

    return {
        "planes": planes,
        "op_executions_per_step": sum(v[1] for v in host_ops.values()) / steps,
        "op_host_ms_per_step": round(sum(v[0] for v in host_ops.values()) / steps, 3),
        "kernels_per_step": sum(v[1] for v in kernels.values()) / steps,
        "kernel_ms_per_step": round(sum(v[0] for v in kernels.values()) / steps, 3),
        "host_ops": per_step(host_ops, 40),
        "host_other": per_step(host_other, 25),
        "kernels": per_step(kernels, 40),
    }


def profile(run: Any, steps: int) -> dict:
    logdir = tempfile.mkdtemp(prefix="nddebug-profile-")
    try:
        t0 = time.perf_counter()
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(steps):
                run()
        finally:
            tf.profiler.experimental.stop()
        wall = (time.perf_counter() - t0) / steps
        out = summarize(_xspace(logdir), steps)
        out["wall_ms_per_step_profiled"] = round(wall * 1e3, 3)
        return out
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def run_workload(name: str, steps: int) -> dict:
    make_model, make_data = WORKLOADS[name]
    model = make_model()
    xn, yn = make_data()
    x, y = tf.constant(xn), tf.constant(yn)
    plain = mnist_cnn.make_custom_step(model)
    fast = mnist_cnn.make_custom_step(model)
    with nddebug.trace():
        fast(x, y)

    def traced() -> None:
        with nddebug.trace():
            fast(x, y)

    variants = {
        "plain": lambda: plain(x, y).numpy(),
        "outside trace()": lambda: fast(x, y).numpy(),
        "trace()": traced,
    }
    for run in variants.values():  # warm up
        for _ in range(3):
            run()
    out = {k: profile(run, steps) for k, run in variants.items()}
    out["trace() phases"] = _phases(lambda: fast(x, y), max(steps, 10))
    return out


def _phases(call: Any, steps: int) -> dict[str, float]:
    """Median ms of a trace() step's parts, unprofiled: entering the block, the call, leaving
    the block (the drain, which waits for the device), and an empty block."""
    parts: dict[str, list[float]] = {"enter": [], "call": [], "exit": [], "empty block": []}
    for _ in range(steps):
        block = nddebug.trace()
        t0 = time.perf_counter()
        block.__enter__()
        t1 = time.perf_counter()
        call()
        t2 = time.perf_counter()
        block.__exit__(None, None, None)
        t3 = time.perf_counter()
        with nddebug.trace():
            pass
        t4 = time.perf_counter()
        for k, d in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            parts[k].append(d)
    return {k: round(statistics.median(v) * 1e3, 3) for k, v in parts.items()}


def _diff(result: dict, key: str) -> list[str]:
    base = result["plain"][key]
    lines = []
    for variant in ("outside trace()", "trace()"):
        other = result[variant][key]
        rows = []
        for k in set(base) | set(other):
            a, b = base.get(k, {"ms": 0, "count": 0}), other.get(k, {"ms": 0, "count": 0})
            rows.append((b["ms"] - a["ms"], b["count"] - a["count"], k))
        rows.sort(reverse=True)
        lines.append(f"  {variant} minus plain ({key}), per step:")
        lines += [f"    {d_ms:+9.3f} ms {d_n:+7.1f}x  {k}" for d_ms, d_n, k in rows[:12]]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="cnn-b128")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    gpu = bool(tf.config.list_physical_devices("GPU"))
    results = {w: run_workload(w, args.steps) for w in args.workloads.split(",")}
    for w, r in results.items():
        print(f"== {w}")
        print("  trace() phases (ms):", r["trace() phases"])
        for v, s in r.items():
            if v == "trace() phases":
                continue
            print(
                f"  {v:16s} wall {s['wall_ms_per_step_profiled']:8.2f} ms  "
                f"ops {s['op_executions_per_step']:7.1f} ({s['op_host_ms_per_step']:.2f} ms)  "
                f"kernels {s['kernels_per_step']:7.1f} ({s['kernel_ms_per_step']:.2f} ms)"
            )
        for key in ("host_ops", "kernels") if gpu else ("host_ops",):
            print(*_diff(r, key), sep="\n")
    out = args.out or os.path.join(RESULTS_DIR, f"profile_ops{'_gpu' if gpu else ''}.json")
    with open(out, "w") as f:
        json.dump(
            {
                "machine": machine(),
                "source": source_state(),
                "steps": args.steps,
                "results": results,
            },
            f,
            indent=1,
        )
    print("wrote", out)


if __name__ == "__main__":
    main()
