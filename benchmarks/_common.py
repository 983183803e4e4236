"""Shared helpers of the benchmark scripts (not part of nddebug)."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, "benchmarks", "results")


def source_state() -> dict:
    """Which nddebug code was measured: HEAD, whether nddebug/ had local edits, and a hash of
    the tracer and digest sources (they change while the project is developed)."""

    def git(*argv: str) -> str:
        try:
            return subprocess.run(
                ["git", *argv], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    h = hashlib.sha256()
    package = os.path.join(ROOT, "nddebug")
    tracer = os.path.join(package, "tracer")
    sources = [os.path.join(tracer, n) for n in sorted(os.listdir(tracer)) if n.endswith(".py")]
    for path in [*sources, os.path.join(package, "digest.py")]:
        with open(path, "rb") as f:
            h.update(f.read())
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "nddebug_dirty": bool(git("status", "--porcelain", "--", "nddebug")),
        "tracer_digest_sha256": h.hexdigest()[:16],
    }


def machine() -> dict:
    import numpy as np
    import tensorflow as tf

    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    from nddebug.environment import onednn_enabled

    return {
        "cpus": os.cpu_count(),
        "cpu": cpu_model(),
        "onednn": onednn_enabled(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "numpy": np.__version__,
        "load_average_1min_at_end": load,
    }


def interleave(
    variants: dict[str, tuple[Callable[[], object], int, int]],
    rounds: int,
    cpu: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Per variant, wall seconds per step. A variant is (run, steps_per_call, calls_per_round):
    each call of ``run`` is timed and divided by ``steps_per_call``. Every round runs every
    variant; the order is reversed every other round, so slow phases of a noisy machine hit all
    alike. With ``cpu``, also collects this process's CPU seconds (all threads) per step, which
    other processes on the machine disturb less than wall time."""
    samples: dict[str, list[float]] = {k: [] for k in variants}
    if cpu is not None:
        cpu.update({k: [] for k in variants})
    names = list(variants)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            run, steps, reps = variants[name]
            for _ in range(reps):
                c0 = time.process_time()
                t0 = time.perf_counter()
                run()
                t1 = time.perf_counter()
                c1 = time.process_time()
                samples[name].append((t1 - t0) / steps)
                if cpu is not None:
                    cpu[name].append((c1 - c0) / steps)
    return samples


def paired_ratio(
    samples: dict[str, list[float]], name: str, base: str, reps: dict[str, int]
) -> float:
    """Median over rounds of (median of ``name`` in the round / median of ``base`` in the same
    round): each variant is compared with the baseline measured next to it in time, which
    cancels slow phases of a shared machine better than a ratio of overall medians."""
    import statistics

    a, b = samples[name], samples[base]
    ra, rb = reps[name], reps[base]
    rounds = min(len(a) // ra, len(b) // rb)
    ratios = [
        statistics.median(a[r * ra : (r + 1) * ra]) / statistics.median(b[r * rb : (r + 1) * rb])
        for r in range(rounds)
    ]
    return statistics.median(ratios)


def cpu_model() -> dict:
    """The CPU's model name and widest vector extension (the digest's speed and oneDNN's
    default depend on them), from /proc/cpuinfo where there is one."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name in ("", platform.machine()):
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    widest = next((ext for ext in ("avx512f", "avx2", "avx", "sse4_2") if ext in flags), "unknown")
    return {
        "model": name,
        "widest_simd": widest,
        "avx512": sorted(f for f in flags if f.startswith("avx512")),
    }
