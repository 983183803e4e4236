"""Wall time of the full op determinism census on the CPU (both determinism settings).

Run from the repository root::

    .venv/bin/python benchmarks/bench_census.py              # the full catalogue, 10 runs/case
    .venv/bin/python benchmarks/bench_census.py --repeats 3  # quicker

It calls ``nddebug.census.census(device="CPU")`` exactly as a user would (one worker process
per setting, progress on stderr), and reports the wall time, the time per setting, the slowest
cases, and the non-deterministic findings. The target: under 10 minutes on the project's
2-core machines. Results: ``benchmarks/results/census.json`` (every row, with its seconds)
and ``benchmarks/results/census.csv``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (ROOT, os.path.join(ROOT, "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _common import machine, source_state  # noqa: E402
from tabulate import tabulate  # noqa: E402

from nddebug.census import census  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")
TARGET_SECONDS = 600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    os.makedirs(RESULTS, exist_ok=True)
    start = time.perf_counter()
    df = census(device="CPU", repeats=args.repeats, path=os.path.join(RESULTS, "census.csv"))
    wall = time.perf_counter() - start

    per_setting = df.groupby("determinism")["seconds"].sum()
    measured = df[df["error"] == ""]
    print(
        f"\nFull CPU census, {len(df)} rows ({len(df) // 2} cases x 2 settings), "
        f"{args.repeats} runs per case: wall {wall:.0f} s "
        f"({'under' if wall < TARGET_SECONDS else 'OVER'} the {TARGET_SECONDS} s target)"
    )
    print(
        "time inside cases: "
        + ", ".join(f"determinism {k} {v:.0f} s" for k, v in per_setting.items())
        + f"; the rest ({wall - per_setting.sum():.0f} s) is worker start-up (TF import) and "
        "the parent"
    )
    slowest = df.sort_values("seconds", ascending=False).head(15)
    print("\nSlowest cases (build + trace + all runs):")
    print(
        tabulate(
            slowest[["op_type", "pass", "size", "determinism", "seconds"]].values.tolist(),
            headers=["op type", "pass", "size", "determinism", "s"],
        )
    )
    by_op = df.groupby("op_type")["seconds"].sum().sort_values(ascending=False)
    print("\nPer op type (both settings, all sizes), top 15:")
    print(tabulate(list(by_op.head(15).items()), headers=["op type", "s"], floatfmt=".1f"))
    nondet = measured[measured["deterministic"] == False]  # noqa: E712 - a column of objects
    print("\nNon-deterministic (kind numerical):")
    numerical = nondet[nondet["kind"] == "numerical"]
    cols = ["op_type", "size", "determinism", "distinct_outputs", "runs", "max_ulp"]
    table = [[*r[:5], f"{int(r[5]):,}"] for r in numerical[cols].values.tolist()]
    print(
        tabulate(table, headers=["op type", "size", "determinism", "distinct", "runs", "max ULP"])
    )
    result = {
        "wall_seconds": round(wall, 1),
        "repeats": args.repeats,
        "rows": len(df),
        "seconds_in_cases": {k: round(v, 1) for k, v in per_setting.items()},
        "machine": machine(),
        "source": source_state(),
        "census": json.loads(df.to_json(orient="records")),
    }
    with open(os.path.join(RESULTS, "census.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
