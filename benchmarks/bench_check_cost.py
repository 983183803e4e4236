"""What a ``DeterminismCheck`` costs per checked step, in time and in the process's memory.

Run from the repository root::

    .venv/bin/python benchmarks/bench_check_cost.py [--steps 12] [--out FILE]

The seed-000 MNIST CNN (``nddebug.examples.mnist_cnn``, batch 128) is trained by ``fit`` for
``--steps`` steps with ``DeterminismCheck(every_n_steps=1, repeats=2)`` after a warm-up fit of
the same length (which makes fit's own functions and the first check's), then for as many steps
without the callback. Reported: seconds per checked step and per plain step, and the growth of
the process's resident memory per check over the timed fit (the garbage collector run before
each reading). A check runs the step ``repeats + 2`` times, so about 4 plain steps' time is
its floor; memory should not grow with the number of checks.

Results: a line on stdout and ``benchmarks/results/check_cost.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (ROOT, os.path.join(ROOT, "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _common import RESULTS_DIR, machine, source_state  # noqa: E402


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="checked steps timed")
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, "check_cost.json"))
    args = parser.parse_args(argv)

    import numpy as np

    from nddebug.examples import mnist_cnn
    from nddebug.keras import DeterminismCheck

    warnings.simplefilter("ignore")  # the callback's reports, if any diverged, are kept
    model = mnist_cnn.make_model()
    x, y = (np.asarray(a) for a in mnist_cnn.make_data(128 * args.steps))
    callback = DeterminismCheck(every_n_steps=1, repeats=2)

    def fit(with_checks: bool) -> float:
        cbs = [callback] if with_checks else []
        t0 = time.perf_counter()
        model.fit(x, y, batch_size=128, epochs=1, shuffle=False, verbose=0, callbacks=cbs)
        return time.perf_counter() - t0

    fit(True)  # fit's functions, the checks' instrumented one
    fit(False)
    callback.reports.clear()
    gc.collect()
    before = _rss_mb()
    checked = fit(True)
    gc.collect()
    grown = _rss_mb() - before
    plain = fit(False)
    result = {
        "benchmark": "check_cost",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "source": source_state(),
        "steps": args.steps,
        "all_ok": all(r.ok for r in callback.reports),
        "s_per_checked_step": checked / args.steps,
        "s_per_plain_step": plain / args.steps,
        "rss_growth_mb_per_check": grown / args.steps,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(
        f"a checked step {result['s_per_checked_step']:.3f} s, a plain step "
        f"{result['s_per_plain_step']:.3f} s; memory {result['rss_growth_mb_per_check']:+.2f} MB "
        f"per check over {args.steps} checks (all ok: {result['all_ok']})"
    )
    return result


if __name__ == "__main__":
    main()
