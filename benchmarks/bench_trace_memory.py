"""What recording costs in memory: a long traced loop kept in memory against the same loop
written to its file as it runs (``trace(path=...)``), and one eager op with a 512 MiB output
traced against plain. Each case in a fresh process; peak RSS above the RSS before the block.

    .venv/bin/python benchmarks/bench_trace_memory.py          # ~1.5 min on 2 cores
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "trace_memory.json")

_LOOP = textwrap.dedent(
    """
    import json, os, resource, sys, tempfile, time
    import numpy as np, tensorflow as tf, nddebug
    w = tf.Variable(tf.ones([8, 8]) * 0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.tanh(tf.matmul(x, w)))
        w.assign_sub(0.05 * tape.gradient(loss, w))
        return loss

    x = tf.constant(np.full([4, 8], 0.5, np.float32))
    path = os.path.join(tempfile.mkdtemp(), "r.nddebug") if sys.argv[1] == "path" else None
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    with nddebug.trace(path=path) as rec:
        for _ in range(int(sys.argv[2])):
            step(x)
    seconds = time.perf_counter() - t0
    extra = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    from nddebug import storage

    written = sum(n for *_, n in storage.run_index(path)) if path else 0
    print(json.dumps({
        "executions": len(rec.events) + written,
        "held_after_block": len(rec.events),
        "extra_peak_mib": extra,
        "seconds": seconds,
    }))
    """
)

_EAGER = textwrap.dedent(
    """
    import json, resource, sys, time
    import tensorflow as tf, nddebug
    x = tf.ones([128 * 1024, 1024])  # 512 MiB of float32
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    if sys.argv[1] == "traced":
        with nddebug.trace():
            y = x * 2.0
    else:
        y = x * 2.0
    print(json.dumps({
        "extra_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base,
        "seconds": time.perf_counter() - t0,
    }))
    """
)


def _run(code: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=True
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


def main() -> None:
    steps = "30000"  # 300,000 op executions: between 4 and 5 chunks
    results = {
        "loop_in_memory": _run(_LOOP, "memory", steps),
        "loop_written_as_it_runs": _run(_LOOP, "path", steps),
        "eager_512mib_plain": _run(_EAGER, "plain"),
        "eager_512mib_traced": _run(_EAGER, "traced"),
    }
    for name, r in results.items():
        print(f"{name}: {r}")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=2)
    print(f"saved {RESULTS}")


if __name__ == "__main__":
    main()
