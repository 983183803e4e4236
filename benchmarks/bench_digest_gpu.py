"""GPU digest throughput: the native kernel (nddebug_digest.cu) against a plain read of the same
bytes (``tf.reduce_sum``) and the pure-TF digest, on one tensor in GPU memory.

    python benchmarks/bench_digest_gpu.py [--gib 1] [--out benchmarks/results/digest_gpu.json]

Issue 22's target: the digest at >= 50% of reduce_sum's read bandwidth on a 1 GiB tensor.
Needs a GPU (exits 2 without one). Each figure is the median of paired rounds; every call is
finished (a 16-byte result fetched) before the clock stops.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).with_name("results") / "digest_gpu.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()

    import tensorflow as tf

    from nddebug import digest as dg
    from nddebug import native
    from nddebug.tracer import transport

    if not tf.config.list_logical_devices("GPU"):
        print("no GPU")
        return 2
    lib = native.load()
    assert lib is not None and lib.gpu, native.problem()
    n = int(args.gib * 2**30) // 4
    with tf.device("/GPU:0"):
        x = tf.random.stateless_uniform([n], seed=[1, 2])
    pure = dg.eager_digest_fn(tf.float32, (n,), False)

    def kernel() -> None:
        transport.set_active(True)
        (d,) = lib.digest_record(1, [x], [])
        d.numpy()
        transport.set_active(False)
        transport.drain_flat()

    def read() -> None:
        tf.reduce_sum(x).numpy()

    def pure_tf() -> None:
        pure(x).numpy()

    cases = {"native kernel": kernel, "reduce_sum": read, "pure-TF digest": pure_tf}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for f in cases.values():
        f()  # warm up
    for _ in range(args.rounds):
        for name, f in cases.items():
            t = time.perf_counter()
            for _ in range(5):
                f()
            times[name].append((time.perf_counter() - t) / 5)
    nbytes = 4 * n
    out = {
        "device": tf.config.experimental.get_device_details(
            tf.config.list_physical_devices("GPU")[0]
        ),
        "bytes": nbytes,
        "gb_per_s": {k: nbytes / statistics.median(v) / 1e9 for k, v in times.items()},
    }
    out["kernel_vs_read"] = out["gb_per_s"]["native kernel"] / out["gb_per_s"]["reduce_sum"]
    print(json.dumps(out, indent=1, default=str))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
