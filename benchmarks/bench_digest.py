"""Digest throughput (GB/s) of nddebug's digests against a plain read of the same bytes.

Run from the repository root::

    .venv/bin/python benchmarks/bench_digest.py            # full run (~1-2 min)
    .venv/bin/python benchmarks/bench_digest.py --quick    # short run

All methods run side by side in one process, interleaved round by round (a noisy machine
slows every method of a round alike), and the median per method is reported. GB/s is always
*bytes of the input tensor / time* (1 GB = 1e9 bytes), so a digest and a copy of the same
tensor compare directly (a copy moves 2x those bytes: one read, one write).

Methods, all on the same bytes:

- ``native op``: the C++ op the tracer adds on the CPU (``NddebugDigest``, what
  ``NddebugDigestRecord`` runs per output) in a ``tf.function``, sharded over TF's intra-op
  threads, with the widest loop the CPU runs (AVX-512 or AVX2 where it has them).
- ``native op, portable loop``: the same op with the one-word-at-a-time loop
  (``Native.set_loop("portable")``), to show what the SIMD loop buys; ``native op, AVX2
  loop`` on a CPU with AVX-512: the loop an AVX2-only CPU runs.
- ``native, 1 thread``: the same C++ code on the host array through ctypes, on one thread
  (the eager path's digest of host tensors).
- ``plain read: numpy max``: ``host.max()``, one vectorised read pass on one thread.
- ``digest matmul``: ``build_digest(x, use_matmul=True)`` in a ``tf.function`` (CPU path).
- ``digest portable``: ``build_digest(x, use_matmul=False)`` (multiply + reduce, the GPU path).
- ``numpy copyto``: ``np.copyto(dst, src)`` into a preallocated array (memcpy, 1 thread).
- ``tf x*s``: ``x * s`` in a ``tf.function`` with ``s`` a runtime scalar input (so grappler
  cannot fold a multiply-by-one away): reads and writes every byte, TF's intra-op threads.
- ``tf reduce_sum``: ``reduce_sum(bitcast(x, int32))``: one read pass, no write, TF's
  intra-op threads: the plain memory read the native op is held against (the issue's target:
  the digest at >= 50% of it).
- ``diag: lo half`` / ``diag: hi half``: the two streams of the matmul digest alone (the hi
  stream materialises ``words >> 32`` before its MatMul).
- ``ref: tf.fingerprint``: TF's one-pass FarmHash kernel over the bytes (CPU only), for scale.
- ``digest_numpy``: the numpy reference, which the tracer uses for *eager* CPU tensors.

"vs plain read" is GB/s over ``tf reduce_sum``'s (same bytes, same threads); for ``native,
1 thread`` over ``plain read: numpy max``'s (one thread each).

It also reports the fixed cost of digesting a tiny tensor inside a graph, and the op count
of the static plan for each size. Results: ``benchmarks/results/digest.json``.
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

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _common import interleave, machine, source_state  # noqa: E402
from tabulate import tabulate  # noqa: E402

from nddebug import digest as dg  # noqa: E402
from nddebug import native  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "digest.json")
SIZES = {
    # the largest activation of the seed-000 MNIST CNN at batch 128: conv2 output 128x24x24x64
    "cnn_conv2_out (4.72M f32, 18.9 MB)": 128 * 24 * 24 * 64,
    "64 MB (16.8M f32)": 64 * 2**20 // 4,
}


def _graph_op_count(fn, spec) -> int:
    """Ops in the traced graph, excluding the function's placeholders and return identities."""
    graph = fn.get_concrete_function(*spec).graph
    return sum(1 for op in graph.get_operations() if op.type not in ("Placeholder", "Identity"))


def bench_size(n: int, rounds: int, reps: int) -> dict:
    rng = np.random.default_rng(0)
    host = rng.standard_normal(n, dtype=np.float32)
    nbytes = host.nbytes
    x = tf.constant(host)
    dst = np.empty_like(host)
    s = tf.constant(1.0, tf.float32)
    spec = (tf.TensorSpec([n], tf.float32),)

    digest_mm = tf.function(lambda t: dg.build_digest(t, True), input_signature=spec)
    digest_pt = tf.function(lambda t: dg.build_digest(t, False), input_signature=spec)
    scale = tf.function(lambda t, k: t * k)
    rsum = tf.function(lambda t: tf.reduce_sum(tf.bitcast(t, tf.int32)), input_signature=spec)

    # Correctness: both TF paths match the numpy reference bit for bit.
    ref = dg.digest_numpy(host)
    for name, fn in (("matmul", digest_mm), ("portable", digest_pt)):
        got = tuple(int(v) for v in fn(x).numpy())
        if got != ref:
            raise SystemExit(f"digest {name} mismatch: {got} != {ref}")

    # Diagnostics: the two halves of the matmul digest, and a one-pass hash kernel.
    rows = nbytes // 8 // dg.BLOCK
    w_lo = tf.constant(dg._block_weights(0).reshape(-1, 1))
    w_hi = tf.constant(dg._block_weights(1).reshape(-1, 1))

    def words(t):
        return tf.reshape(
            tf.bitcast(tf.reshape(tf.bitcast(t, tf.uint8), [-1, 8]), tf.int64), [rows, -1]
        )

    lo_only = tf.function(lambda t: tf.reduce_sum(tf.matmul(words(t), w_lo)), input_signature=spec)
    hi_only = tf.function(
        lambda t: tf.reduce_sum(tf.matmul(tf.bitwise.right_shift(words(t), 32), w_hi)),
        input_signature=spec,
    )
    fingerprint = tf.function(
        lambda t: tf.fingerprint(tf.reshape(tf.bitcast(t, tf.uint8), [1, -1])),
        input_signature=spec,
    )

    methods = {}
    lib = native.load()
    if lib is not None:
        one = tf.constant(1)
        native_op = tf.function(lambda t: lib.digest(one, [t]), input_signature=spec)
        if tuple(int(v) for v in native_op(x).numpy()[0]) != ref:
            raise SystemExit("native op digest mismatch")

        def with_loop(loop: str):
            def run() -> None:
                lib.set_loop(loop)
                try:
                    native_op(x).numpy()
                finally:
                    lib.set_simd(True)

            return run

        methods["native op"] = lambda: native_op(x).numpy()
        methods["native op, portable loop"] = with_loop("portable")
        if lib.set_loop("avx512") and lib.set_loop("avx2"):
            methods["native op, AVX2 loop"] = with_loop("avx2")  # what AVX2-only CPUs run
        lib.set_simd(True)
        methods["native, 1 thread"] = lambda: lib.digest_array(host)
    methods.update(
        {
            "plain read: numpy max": lambda: host.max(),
            "digest matmul": lambda: digest_mm(x).numpy(),
            "digest portable": lambda: digest_pt(x).numpy(),
            "numpy copyto": lambda: np.copyto(dst, host),
            "tf x*s": lambda: scale(x, s),
            "tf reduce_sum": lambda: rsum(x).numpy(),
            "diag: lo half (MatMul)": lambda: lo_only(x).numpy(),
            "diag: hi half (shift+MatMul)": lambda: hi_only(x).numpy(),
            "ref: tf.fingerprint": lambda: fingerprint(x).numpy(),
            "digest_numpy (eager CPU path)": lambda: dg.digest_numpy(host),
        }
    )
    for fn in methods.values():  # warm up: trace, allocate, fault in pages
        for _ in range(3):
            fn()
    slow = {"digest_numpy (eager CPU path)"}  # ~20x slower: one call per round
    times = interleave({k: (fn, 1, 1 if k in slow else reps) for k, fn in methods.items()}, rounds)
    med = {k: statistics.median(v) for k, v in times.items()}
    gbs = {k: nbytes / v / 1e9 for k, v in med.items()}
    return {
        "elements": n,
        "bytes": nbytes,
        "samples_per_method": rounds * reps,
        "median_ms": {k: v * 1e3 for k, v in med.items()},
        "gb_per_s": gbs,
        "ratio_to_numpy_copyto": {k: gbs[k] / gbs["numpy copyto"] for k in gbs},
        "ratio_to_tf_x_times_s": {k: gbs[k] / gbs["tf x*s"] for k in gbs},
        # The figure: the digest against a plain read of the same bytes.
        "ratio_to_plain_read": {
            **{k: gbs[k] / gbs["tf reduce_sum"] for k in gbs if k != "native, 1 thread"},
            **(
                {"native, 1 thread": gbs["native, 1 thread"] / gbs["plain read: numpy max"]}
                if "native, 1 thread" in gbs
                else {}
            ),
        },
        "simd": lib.set_simd(True) if lib is not None else None,
        "plan_ops": {
            "matmul": _graph_op_count(digest_mm, spec),
            "portable": _graph_op_count(digest_pt, spec),
        },
    }


def bench_tiny(k: int, rounds: int, reps: int) -> dict:
    """Fixed cost of one digest of a tiny tensor in a graph: a function that splits a [k, 10]
    input into k float32[10] tensors and digests each, against one that splits and adds them;
    the difference divided by k."""
    spec = [tf.TensorSpec([k, 10], tf.float32)]
    batch = tf.constant(np.arange(k * 10, dtype=np.float32).reshape(k, 10))

    @tf.function(input_signature=spec)
    def with_digests(xs):
        return tf.add_n([dg.build_digest(t, True) for t in tf.unstack(xs)])

    @tf.function(input_signature=spec)
    def baseline(xs):
        return tf.add_n(tf.unstack(xs))

    tiny_spec = (tf.TensorSpec([10], tf.float32),)
    one = tf.function(lambda t: dg.build_digest(t, True), input_signature=tiny_spec)
    ops_per_digest = _graph_op_count(one, tiny_spec)
    variants = {
        "digests": (lambda: with_digests(batch).numpy(), 1, reps),
        "baseline": (lambda: baseline(batch).numpy(), 1, reps),
    }
    for fn, _, _ in variants.values():
        for _ in range(3):
            fn()
    times = interleave(variants, rounds)
    med = {n: statistics.median(v) for n, v in times.items()}
    diffs = [
        (
            statistics.median(times["digests"][r * reps : (r + 1) * reps])
            - statistics.median(times["baseline"][r * reps : (r + 1) * reps])
        )
        for r in range(rounds)
    ]
    return {
        "tensors": k,
        "tensor": "float32[10]",
        "ops_per_digest": ops_per_digest,
        "median_ms": {n: v * 1e3 for n, v in med.items()},
        "us_per_digest": statistics.median(diffs) / k * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (fewer rounds)")
    parser.add_argument("--out", default=RESULTS, help="JSON results file")
    args = parser.parse_args()
    rounds, reps = (3, 3) if args.quick else (10, 5)

    results = {
        "benchmark": "digest",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "source": source_state(),
        "quick": args.quick,
        "gb": "1e9 bytes of the input tensor per second",
        "sizes": {},
    }
    rows = []
    for label, n in SIZES.items():
        r = bench_size(n, rounds, reps)
        results["sizes"][label] = r
        for method in r["gb_per_s"]:
            rows.append(
                [
                    label,
                    method,
                    f"{r['median_ms'][method]:.2f}",
                    f"{r['gb_per_s'][method]:.2f}",
                    f"{r['ratio_to_plain_read'][method]:.2f}",
                    f"{r['ratio_to_numpy_copyto'][method]:.2f}",
                ]
            )
    print(
        tabulate(
            rows,
            headers=["tensor", "method", "median ms", "GB/s", "vs plain read", "vs np.copyto"],
            disable_numparse=True,
        )
    )
    print()
    plan_rows = [
        [label, r["plan_ops"]["matmul"], r["plan_ops"]["portable"]]
        for label, r in results["sizes"].items()
    ]
    tiny = bench_tiny(400, rounds, reps)
    results["tiny"] = tiny
    plan_rows.append(["float32[10]", tiny["ops_per_digest"], "-"])
    print(tabulate(plan_rows, headers=["tensor", "plan ops (matmul)", "plan ops (portable)"]))
    print(
        f"\ntiny tensor (float32[10]) digested in a graph: {tiny['us_per_digest']:.1f} us per "
        f"digest, {tiny['ops_per_digest']} ops each ({tiny['tensors']} digests per call: "
        f"{tiny['median_ms']['digests']:.2f} ms vs {tiny['median_ms']['baseline']:.2f} ms "
        "without; per digest: median over rounds of the paired difference / count)"
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
