"""How often a real CPU race shows, plain and traced: does nddebug's recording change the
scheduling that makes a race visible?

Run from the repository root::

    .venv/bin/python benchmarks/bench_race_rate.py            # 20 groups per variant
    .venv/bin/python benchmarks/bench_race_rate.py --groups 8 # quicker

Workloads (real races of TensorFlow's CPU kernels, op determinism off):

- ``scatter``: a sparse SGD update of a 50,000 x 32 embedding table with Zipf-distributed ids
  (``ResourceScatterAdd`` applies duplicate ids on several threads);
- ``crop``: the detection step's ``CropAndResizeGradImage`` with 1,024 overlapping boxes.

A *group* is 5 executions of the step from the same restored state; it "shows the race" when
the 5 results are not all bitwise equal. Plain and traced groups alternate (a busy machine
slows both alike). Traced groups run the step inside ``nddebug.trace()`` (instrumented). The
figure: the fraction of groups that showed the race, per variant.

Results: a table on stdout and ``benchmarks/results/race_rate.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (ROOT, os.path.join(ROOT, "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import nddebug  # noqa: E402
from nddebug.examples import detection  # noqa: E402

GROUP = 5


def scatter_workload() -> tuple[Callable[[], Any], list[tf.Variable]]:
    rng = np.random.default_rng(0)
    table = tf.Variable(rng.standard_normal((50_000, 32)).astype(np.float32))
    ids = tf.constant(np.minimum(rng.zipf(1.3, 65_536), 50_000) - 1, tf.int64)
    updates = tf.constant(rng.standard_normal((65_536, 32)).astype(np.float32) * 1e-3)

    def make() -> Callable[[], Any]:
        @tf.function
        def step():
            table.scatter_add(tf.IndexedSlices(updates, ids))
            return table.read_value()

        return step

    return make, [table]


def crop_workload() -> tuple[Callable[[], Any], list[tf.Variable]]:
    step, args, state = detection.make_step(boxes=1024)
    variables = [v for v in state if isinstance(v, tf.Variable)]
    python_fn = step.python_function

    def make() -> Callable[[], Any]:
        fresh = tf.function(python_fn)
        return lambda: (fresh(*args), [v.read_value() for v in variables])[1]

    return make, variables


def _hash(value: Any) -> str:
    h = hashlib.sha1()
    for t in tf.nest.flatten(value):
        h.update(np.asarray(t).tobytes())
    return h.hexdigest()


def group_shows(step: Callable[[], Any], variables: list[tf.Variable], init: list[Any]) -> bool:
    seen = set()
    for _ in range(GROUP):
        for v, value in zip(variables, init, strict=True):
            v.assign(value)
        seen.add(_hash(step()))
    return len(seen) > 1


def measure(name: str, workload: Any, groups: int) -> dict[str, Any]:
    make, variables = workload()
    init = [v.numpy() for v in variables]
    plain_step = make()
    plain_step()  # traced outside any block: plain
    with nddebug.trace():
        traced_step = make()
        traced_step()  # first traced inside the block: instrumented
    shown = {"plain": 0, "traced": 0}
    t0 = time.time()
    for g in range(groups):
        order = ("plain", "traced") if g % 2 == 0 else ("traced", "plain")
        for variant in order:
            if variant == "plain":
                shown["plain"] += group_shows(plain_step, variables, init)
            else:
                with nddebug.trace():
                    shown["traced"] += group_shows(traced_step, variables, init)
    return {
        "workload": name,
        "groups": groups,
        "plain": shown["plain"] / groups,
        "traced": shown["traced"] / groups,
        "seconds": round(time.time() - t0, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=20)
    args = parser.parse_args()
    rows = [
        measure("scatter", scatter_workload, args.groups),
        measure("crop", crop_workload, args.groups),
    ]
    from tabulate import tabulate

    print(
        tabulate(
            [[r["workload"], r["groups"], f"{r['plain']:.0%}", f"{r['traced']:.0%}"] for r in rows],
            headers=["workload", "groups of 5", "race shown plain", "race shown traced"],
        )
    )
    from _common import RESULTS_DIR, machine

    out = {"machine": machine(), "group_size": GROUP, "rows": rows}
    with open(os.path.join(RESULTS_DIR, "race_rate.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
