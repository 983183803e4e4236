"""Rerun mode against repeated steps, on the seed-000 CNN, side by side in one process.

Run from the repository root::

    .venv/bin/python benchmarks/bench_rerun.py            # 3 rounds (~3 min)
    .venv/bin/python benchmarks/bench_rerun.py --rounds 1

Part A, the whole check, as a user runs it: ``nddebug.check(model.train_on_batch, x, y,
state=model)`` with ``mode="rerun", rerun=1`` against ``repeats=2`` (the smallest repeated
check), each on a fresh seed-000 model that has already trained one step, so both pay the same
retrace of Keras' train function. Rounds alternate the order. Reported: median wall and CPU
seconds and their ratio.

Part B, one step once the graphs exist (what each mode costs per step): the custom
GradientTape ``tf.function`` step of the same model, traced inside its mode's block, then timed
per step, interleaved with a plain step:

- ``plain``: the step traced outside any instrumentation;
- ``trace()``: one block per step, digests in the graph (one repeated step of repeat mode;
  a repeated check needs at least two of these plus the warm-up, the restore and the final
  plain step);
- ``trace(rerun=1)``: one block per step, every stateless op run twice and compared on the
  host.

Results: a table on stdout and ``benchmarks/results/rerun.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (ROOT, os.path.join(ROOT, "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from _common import RESULTS_DIR, interleave, machine, source_state  # noqa: E402

import nddebug  # noqa: E402
from nddebug.examples import mnist_cnn  # noqa: E402


def whole_check(rounds: int) -> dict:
    x, y = mnist_cnn.make_data(128)
    wall: dict[str, list[float]] = {"rerun": [], "repeats=2": []}
    cpu: dict[str, list[float]] = {"rerun": [], "repeats=2": []}
    for r in range(rounds):
        order = ["rerun", "repeats=2"] if r % 2 == 0 else ["repeats=2", "rerun"]
        for name in order:
            model = mnist_cnn.make_model(0)
            model.train_on_batch(x, y)
            kwargs = {"mode": "rerun", "rerun": 1} if name == "rerun" else {"repeats": 2}
            c0, t0 = time.process_time(), time.perf_counter()
            report = nddebug.check(model.train_on_batch, x, y, state=model, **kwargs)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            assert report.ok, str(report)
            print(f"  round {r}: {name:10s} {wall[name][-1]:6.1f} s", flush=True)
    return {
        name: {
            "wall_s_median": statistics.median(wall[name]),
            "cpu_s_median": statistics.median(cpu[name]),
            "wall_s": wall[name],
        }
        for name in wall
    }


def per_step(rounds: int) -> dict:
    x, y = (tf.constant(a) for a in mnist_cnn.make_data(128))
    model = mnist_cnn.make_model(0)
    plain = mnist_cnn.make_custom_step(model)
    plain(x, y)
    traced = mnist_cnn.make_custom_step(model)
    with nddebug.trace():
        traced(x, y)
    rerun = mnist_cnn.make_custom_step(model)
    with nddebug.trace(rerun=1):
        rerun(x, y)

    def in_block(fn, **kw):
        def run() -> None:
            with nddebug.trace(**kw):
                fn(x, y)

        return run

    variants = {
        "plain": (lambda: plain(x, y), 1, 3),
        "trace()": (in_block(traced), 1, 3),
        "trace(rerun=1)": (in_block(rerun, rerun=1), 1, 3),
    }
    interleave(variants, 2)  # warm caches
    samples = interleave(variants, rounds * 4)
    base = statistics.median(samples["plain"])
    return {
        name: {
            "ms_median": 1e3 * statistics.median(s),
            "ratio_to_plain": statistics.median(s) / base,
        }
        for name, s in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("A. whole check() on model.train_on_batch, seed-000 CNN, batch 128")
    a = whole_check(args.rounds)
    ratio = a["rerun"]["wall_s_median"] / a["repeats=2"]["wall_s_median"]
    cpu_ratio = a["rerun"]["cpu_s_median"] / a["repeats=2"]["cpu_s_median"]
    for name, v in a.items():
        print(f"  {name:10s} wall {v['wall_s_median']:6.1f} s   cpu {v['cpu_s_median']:6.1f} s")
    print(f"  rerun / repeats=2: wall {ratio:.2f}x, cpu {cpu_ratio:.2f}x")
    print("B. one step once the graphs exist (custom tf.function step)")
    b = per_step(args.rounds)
    for name, v in b.items():
        print(f"  {name:15s} {v['ms_median']:8.1f} ms/step  {v['ratio_to_plain']:.2f}x plain")
    result = {
        "whole_check": a,
        "rerun_over_repeats2_wall": ratio,
        "rerun_over_repeats2_cpu": cpu_ratio,
        "per_step": b,
        "machine": machine(),
        "source": source_state(),
    }
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, "rerun.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
