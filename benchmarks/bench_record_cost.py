"""What one recorded graph op costs ``trace()``, apart from a block's fixed cost.

Run from the repository root::

    .venv/bin/python benchmarks/bench_record_cost.py [--out FILE]

Two ``tf.function`` chains of ``tf.matmul`` on small matrices (32 x 32 float32; a chain of
element-wise ops would be fused by grappler, and its intermediates not recorded), one of
``--short`` ops and one of ``--long`` ops, each timed plain and inside
``with nddebug.trace():`` (one block per call), interleaved round by round in one process.
A chain's ops are each one executor step and one tiny kernel, so the time is the host's: what
an op costs the executor, and what its record adds. The slope between the two lengths
cancels what every call pays once (the call, entering and leaving a block, the drain):

- ``plain_us_per_op``: (long − short) / (long − short ops), plain;
- ``traced_us_per_op``: the same, traced;
- ``record_us_per_op``: their difference, what one recorded op adds;
- ``inert_record_us_per_op``: the same with the native records switched off inside the block
  (their ops run, allocate their outputs and return: no digest kernel, no row): what the
  executor's extra step per op costs;
- ``python_us_per_row``: the Python work of turning one drained row into an event
  (``Recorder.drain``: the buffer handed over, its rows made events). What is left of
  ``record_us_per_op`` is the native op's own work (digest kernel, its launch on a GPU, the
  row).

On a GPU this tells whether ``trace()``'s cost on small steps is the records' host work (one
more executor step per op) or something paid per call. Results: a line on stdout and
``benchmarks/results/record_cost[_gpu].json``.
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

from _common import RESULTS_DIR, interleave, machine, source_state  # noqa: E402


def _chain(n_ops: int):
    import tensorflow as tf

    w = tf.constant(0.03, shape=[32, 32])

    @tf.function(autograph=False)
    def chain(x):
        for _ in range(n_ops):
            x = tf.matmul(x, w)
        return x

    return chain


def _python_us_per_row(run_traced, calls: int) -> float:
    """The Python time per drained row: ``Recorder.drain`` wrapped (the native buffer
    handed to Python, its rows made events and added to the block's pending ones), over
    the rows it added."""
    from nddebug.tracer.recorder import Recorder

    spent, rows, original = [0.0], [0], Recorder.drain

    def timed(self):
        before = len(self.pending)
        t0 = time.perf_counter()
        original(self)
        spent[0] += time.perf_counter() - t0
        rows[0] += len(self.pending) - before

    Recorder.drain = timed
    try:
        for _ in range(calls):
            run_traced()
    finally:
        Recorder.drain = original
    return spent[0] / max(rows[0], 1) * 1e6


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=50, help="ops in the short chain")
    parser.add_argument("--long", type=int, default=450, help="ops in the long chain")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reps", type=int, default=20, help="calls per variant and round")
    parser.add_argument("--out", default=None, help="JSON results file")
    args = parser.parse_args(argv)

    import tensorflow as tf

    import nddebug
    from nddebug import native

    gpu = bool(tf.config.list_logical_devices("GPU"))
    lib = native.load() if native.enabled() else None
    x = tf.random.stateless_uniform([32, 32], seed=[1, 2])
    fns = {}
    for n in (args.short, args.long):
        plain, traced = _chain(n), _chain(n)
        plain(x).numpy()
        with nddebug.trace():
            traced(x).numpy()  # instrumented on its first call inside a block

        def run_plain(f=plain):
            f(x).numpy()

        def run_traced(f=traced):
            with nddebug.trace():
                f(x).numpy()

        def run_inert(f=traced):
            with nddebug.trace():
                lib.set_active(False)  # the records' kernels return at once, no row
                try:
                    f(x).numpy()
                finally:
                    lib.set_active(True)

        fns[f"plain {n}"] = (run_plain, 1, args.reps)
        fns[f"trace() {n}"] = (run_traced, 1, args.reps)
        if lib is not None:
            fns[f"inert {n}"] = (run_inert, 1, args.reps)
    samples = interleave(fns, args.rounds)
    med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}  # µs per call
    span = args.long - args.short
    plain_us = (med[f"plain {args.long}"] - med[f"plain {args.short}"]) / span
    traced_us = (med[f"trace() {args.long}"] - med[f"trace() {args.short}"]) / span
    inert_us = (
        (med[f"inert {args.long}"] - med[f"inert {args.short}"]) / span if lib is not None else None
    )
    row_us = _python_us_per_row(fns[f"trace() {args.long}"][0], args.reps)
    result = {
        "benchmark": "record_cost",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "device": "GPU" if gpu else "CPU",
        "native": str(lib.path) if lib is not None else None,
        "native_gpu": bool(lib is not None and lib.gpu),
        "source": source_state(),
        "ops": [args.short, args.long],
        "median_us_per_call": med,
        "plain_us_per_op": plain_us,
        "traced_us_per_op": traced_us,
        "record_us_per_op": traced_us - plain_us,
        "inert_record_us_per_op": inert_us - plain_us if inert_us is not None else None,
        "python_us_per_row": row_us,
        "fixed_us_per_traced_call": med[f"trace() {args.short}"]
        - med[f"plain {args.short}"]
        - args.short * (traced_us - plain_us),
    }
    out = args.out or os.path.join(RESULTS_DIR, f"record_cost{'_gpu' if gpu else ''}.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(
        f"{result['device']}: an op costs {plain_us:.1f} µs plain, {traced_us:.1f} µs traced "
        f"(+{traced_us - plain_us:.1f} µs per record); a traced call's fixed cost "
        f"{result['fixed_us_per_traced_call']:.0f} µs"
    )
    if inert_us is not None:
        print(
            f"  a record: executor step {inert_us - plain_us:.1f} µs, Python row {row_us:.1f} µs, "
            f"native op {traced_us - inert_us - row_us:.1f} µs"
        )
    return result


if __name__ == "__main__":
    main()
