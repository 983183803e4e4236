"""Recordings of whole training runs: bytes per op execution on disk (format 3, columns, against
format 2, one JSON row per execution), save and load times, and, on synthetic runs of 10M op
executions, what storage.load_columns and storage.first_difference cost in time and memory.

    .venv/bin/python benchmarks/bench_long_runs.py            # ~7 min on 2 cores
    .venv/bin/python benchmarks/bench_long_runs.py --quick    # ~1 min: 1M synthetic executions

Writes benchmarks/results/long_runs.json.

Real runs are traced on the CPU with nddebug.trace(): the seed-000 MNIST CNN's custom
tf.function step (batch 32) and a small tf.function loop (8x8 matmul, tanh, gradient, update),
enough steps for about 1k and 100k op executions, plus a Keras ``model.fit`` of the CNN for
1,500 steps (the run the issue measured at 137 MB in format 2). Each recording is saved alone
in a fresh file in both formats; "file" bytes per execution count the whole file (schema, ops,
environment included), "events" only the per-execution data (format 3: the chunks' blobs and
directories; format 2: the events rows' JSON text).

Synthetic runs are written with storage.RunWriter, a chunk per append: a 600-op training step
repeated (op ids repeating per step, one eager call per step, 1-2 outputs per op, 5% without a
digest, 0-3 inputs that are earlier outputs of the step or the previous step's variable
writes, random 64-bit digests). Run B equals run A up to execution 9/10 of the way, then one
output differs and every later new output with it. Memory is measured in a fresh process
(no TensorFlow) as the peak resident set size (ru_maxrss) minus the same after imports.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import RESULTS_DIR, ROOT, machine, source_state
from nddebug import digest as dg
from nddebug import storage
from nddebug.recording import Event, OpInfo, Recording

# ------------------------------------------------------------------ real traced runs


def _payload_bytes(path: str) -> int:
    with sqlite3.connect(path) as con:
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master")}
        total = con.execute(
            "SELECT COALESCE(SUM(LENGTH(digests) + COALESCE(LENGTH(inputs), 0) "
            "+ COALESCE(LENGTH(shapes), 0) + 24), 0) FROM events"
        ).fetchone()[0]  # 24: seq, op_id, call as 8-byte integers
        if "chunks" in tables:
            total += con.execute(
                "SELECT COALESCE(SUM(LENGTH(data) + LENGTH(arrays)), 0) FROM chunks"
            ).fetchone()[0]
        return int(total)


def _measure_file(rec: Recording, folder: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"executions": len(rec.events), "ops": len(rec.ops)}
    for version in (2, 3):
        path = os.path.join(folder, f"{name}-v{version}.nddebug")
        t0 = time.perf_counter()
        storage.save([rec], path, format_version=version)
        t1 = time.perf_counter()
        (loaded,) = storage.load(path)
        t2 = time.perf_counter()
        assert loaded.events == rec.events and loaded.ops == rec.ops
        (columns,) = storage.load_columns(path)
        t3 = time.perf_counter()
        size = os.path.getsize(path)
        out[f"v{version}"] = {
            "file_bytes": size,
            "file_bytes_per_execution": round(size / max(len(rec.events), 1), 2),
            "events_bytes_per_execution": round(_payload_bytes(path) / max(len(rec.events), 1), 2),
            "save_s": round(t1 - t0, 3),
            "load_s": round(t2 - t1, 3),
            "load_columns_s": round(t3 - t2, 3),
        }
        assert len(columns) == len(rec.events)
        os.remove(path)
    out["size_ratio_v2_over_v3"] = round(out["v2"]["file_bytes"] / out["v3"]["file_bytes"], 1)
    return out


def _trace_steps(step: Any, steps: int, label: str) -> Recording:
    import nddebug

    with nddebug.trace(label=label) as rec:
        for _ in range(steps):
            step()
    return rec


def real_runs(folder: str, quick: bool) -> dict[str, Any]:
    import tensorflow as tf

    from nddebug.examples import mnist_cnn

    results: dict[str, Any] = {}
    model = mnist_cnn.make_model()
    train_step = mnist_cnn.make_custom_step(model)
    x, y = (tf.constant(a) for a in mnist_cnn.make_data(32))

    w = tf.Variable(tf.ones([8, 8]) * 0.1)
    inputs = tf.constant(np.full([4, 8], 0.5, np.float32))

    @tf.function
    def small_step(a: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.tanh(tf.matmul(a, w)))
        w.assign_sub(0.05 * tape.gradient(loss, w))
        return loss

    workloads = {
        "mnist_cnn custom step, batch 32": lambda: train_step(x, y),
        "small tf.function loop": lambda: small_step(inputs),
    }
    for name, step in workloads.items():
        per_step = len(_trace_steps(step, 3, "probe")) / 3  # after the first call's tracing
        for target in (1_000, 100_000):
            if quick and target > 1_000:
                target = 20_000
            steps = max(1, round(target / per_step))
            t0 = time.perf_counter()
            rec = _trace_steps(step, steps, f"{name} x{steps}")
            traced = time.perf_counter() - t0
            m = _measure_file(rec, folder, "real")
            m.update(steps=steps, trace_s=round(traced, 1))
            results[f"{name}, {m['executions']} executions"] = m
            print(
                f"{name}: {steps} steps, {m['executions']} executions: "
                f"v3 {m['v3']['file_bytes_per_execution']} B/exec "
                f"(events {m['v3']['events_bytes_per_execution']}), "
                f"v2 {m['v2']['file_bytes_per_execution']} B/exec",
                flush=True,
            )
    if not quick:
        import nddebug

        steps = 1_500
        data = mnist_cnn.make_data(32 * 50)
        t0 = time.perf_counter()
        with nddebug.trace(label="keras fit") as rec:
            model.fit(*data, batch_size=32, epochs=30, verbose=0)
        traced = time.perf_counter() - t0
        m = _measure_file(rec, folder, "fit")
        m.update(steps=steps, trace_s=round(traced, 1))
        results[f"keras model.fit, {steps} steps, {m['executions']} executions"] = m
        print(f"keras fit: {m['executions']} executions: v3 {m['v3']} v2 {m['v2']}", flush=True)
    return results


# ------------------------------------------------------------------ synthetic long runs

STEP_OPS = 600


def _template(seed: int = 7) -> dict[str, np.ndarray]:
    """One training step: per op its number of outputs, which output slots have no digest,
    and its inputs (slot indices of earlier outputs in the step; -1 - k: variable k as the
    previous step left it). The last 20 ops write the variables the first 20 read."""
    rng = np.random.default_rng(seed)
    n_out = np.where(rng.random(STEP_OPS) < 0.1, 2, 1)
    n_out[0] = 1  # the eager call
    starts = np.concatenate([[0], np.cumsum(n_out)])
    none = rng.random(int(starts[-1])) < 0.05
    inputs = []
    for i in range(STEP_OPS):
        if i == 0:
            inputs.append([])
        elif i <= 20:
            inputs.append([-i])  # a variable read: its value after last step's write
        else:
            k = int(rng.integers(0, 4))
            back = rng.integers(1, min(i, 30) + 1, size=k)
            inputs.append([int(starts[i - b]) for b in back])
    return {"n_out": n_out, "starts": starts, "none": none, "inputs": inputs}


def _synthetic_ops() -> dict[int, OpInfo]:
    ops = {}
    for i in range(STEP_OPS):
        graph = "" if i == 0 else "train_step"
        ops[i] = OpInfo(
            i,
            f"train_step/op{i}" if i else "eager:call",
            "Op",
            f"op{i}",
            graph,
            "CPU",
            "",
            ["float32"],
            [[None]],
            [True],
        )
    return ops


def write_synthetic(path: str, n: int, differ_at: int | None, label: str) -> dict[str, Any]:
    """A run of ``n`` executions through RunWriter, a chunk per append."""
    t = _template()
    rng = np.random.default_rng(1)  # the same digests in every run
    rec = Recording(label=label, digest_algorithm=dg.ALGORITHM)
    variables: list[tuple[int, int]] = [(k, 0) for k in range(21)]
    seq = 0
    t0 = time.perf_counter()
    with storage.RunWriter(path, rec) as writer:
        writer.append([], _synthetic_ops())
        batch: list[Event] = []
        while seq < n:
            fresh = rng.integers(-(2**63), 2**63 - 1, size=(int(t["starts"][-1]), 2))
            if differ_at is not None and seq + STEP_OPS > differ_at:
                first = max(0, differ_at - seq)
                fresh[int(t["starts"][first]) :, 0] ^= 1  # this output differs, and all later
            outs: list[Any] = list(map(tuple, fresh.tolist()))
            for j in np.flatnonzero(t["none"]).tolist():
                outs[j] = None
            call = seq
            for i in range(STEP_OPS):
                if seq >= n:
                    break
                s = int(t["starts"][i])
                if 1 <= i <= 20:
                    digests = [variables[i]]  # a read gives what the last write left
                else:
                    digests = outs[s : s + int(t["n_out"][i])]
                inputs = [variables[-r] if r < 0 else outs[r] for r in t["inputs"][i]]
                inputs = [d for d in inputs if d is not None]
                batch.append(Event(seq, i, call, digests, inputs, [[4]] if i == 0 else None))
                if i >= STEP_OPS - 20 and digests[0] is not None:
                    variables[i - (STEP_OPS - 20) + 1] = digests[0]
                seq += 1
                if len(batch) == storage.CHUNK_EVENTS:
                    writer.append(batch)
                    batch = []
        writer.append(batch)
    return {"executions": n, "write_s": round(time.perf_counter() - t0, 1)}


_PROBE = textwrap.dedent(
    """
    import json, resource, sys, time
    sys.path.insert(0, sys.argv[1])
    sys.modules["tensorflow"] = None  # loading and comparing need no TensorFlow
    from nddebug import storage

    path, fields = sys.argv[2], sys.argv[3].split(",")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    a, b = storage.load_columns(path, fields=fields)
    t1 = time.perf_counter()
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    arrays = sum(
        x.nbytes for run in (a, b) for x in vars(run).values() if hasattr(x, "nbytes")
    )
    out = {"load_columns_s": t1 - t0, "arrays_bytes": arrays}
    if "outputs" in fields:
        t2 = time.perf_counter()
        where = storage.first_difference(a, b)
        t3 = time.perf_counter()
        same = storage.first_difference(a, a)
        t4 = time.perf_counter()
        out.update(first_difference=where, first_difference_s=t3 - t2, identical_s=t4 - t3,
                   identical_result=same)
    if "call" in fields:
        t5 = time.perf_counter()
        out["by_call"] = storage.first_difference(a, b, order="call")
        out["by_call_s"] = time.perf_counter() - t5
    out["rss_after_imports_mb"] = base / 1024
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["peak_rss_loading_mb"] = loaded / 1024
    print(json.dumps(out))
    """
)


_COMPARE_PROBE = textwrap.dedent(
    """
    import json, resource, sys, time
    sys.path.insert(0, sys.argv[1])
    sys.modules["tensorflow"] = None  # comparing needs no TensorFlow
    from nddebug.longruns import compare_file

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    report = compare_file(sys.argv[2], long_run=1)
    t1 = time.perf_counter()
    fd = report.first_divergence
    print(json.dumps({
        "compare_file_s": t1 - t0,
        "first_index": fd.index if fd else None,
        "ok": report.ok,
        "window_executions": [len(r.events) for r in report.recordings],
        "rss_after_imports_mb": base / 1024,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))
    """
)


def synthetic(folder: str, n: int) -> dict[str, Any]:
    path = os.path.join(folder, "synthetic.nddebug")
    t = _template()
    differ_at = n * 9 // 10  # moved to an op whose first output has a digest of its own
    while differ_at % STEP_OPS <= 20 or t["none"][int(t["starts"][differ_at % STEP_OPS])]:
        differ_at += 1
    written = {
        "A": write_synthetic(path, n, None, "A"),
        "B": write_synthetic(path, n, differ_at, "B"),
    }
    size = os.path.getsize(path)
    print(
        f"synthetic: 2 x {n} executions written ({written}); {size / (2 * n):.1f} B/exec",
        flush=True,
    )
    out: dict[str, Any] = {
        "executions_per_run": n,
        "differ_at": differ_at,
        "written": written,
        "file_bytes": size,
        "file_bytes_per_execution": round(size / (2 * n), 2),
    }
    for fields in ("outputs", "seq,call,outputs,inputs"):
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, ROOT, path, fields],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(done.stdout.strip().splitlines()[-1])
        r["load_columns_executions_per_s"] = round(2 * n / r["load_columns_s"])
        r["memory_mb"] = round(r["peak_rss_mb"] - r["rss_after_imports_mb"], 1)
        if "first_difference_s" in r:
            assert r["first_difference"] == differ_at and r["identical_result"] is None, r
            r["first_difference_executions_per_s"] = round(differ_at / r["first_difference_s"])
            r["identical_executions_per_s"] = round(n / r["identical_s"])
        if "by_call_s" in r:  # the step (a call of 600 executions) that holds differ_at
            assert r["by_call"] == differ_at - differ_at % STEP_OPS, r
            r["by_call_executions_per_s"] = round(differ_at / r["by_call_s"])
        out[f"fields={fields}"] = {
            k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()
        }
        print(f"  load_columns(fields={fields}): {out[f'fields={fields}']}", flush=True)
    # What `nddebug report` does with long runs: arrays, then the first divergent call in full.
    done = subprocess.run(
        [sys.executable, "-c", _COMPARE_PROBE, ROOT, path], capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    r = json.loads(done.stdout.strip().splitlines()[-1])
    r["memory_mb"] = round(r["peak_rss_mb"] - r["rss_after_imports_mb"], 1)
    r["executions_per_s"] = round(2 * n / r["compare_file_s"])
    out["compare_file"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
    print(f"  compare_file: {out['compare_file']}", flush=True)
    os.remove(path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1M synthetic, no 100k/fit runs")
    parser.add_argument("--synthetic", type=int, default=None, help="executions per run")
    parser.add_argument("--no-real", action="store_true", help="skip the traced runs")
    args = parser.parse_args()
    n = args.synthetic or (1_000_000 if args.quick else 10_000_000)
    results: dict[str, Any] = {"quick": args.quick}
    with tempfile.TemporaryDirectory(prefix="nddebug-long-") as folder:
        results["synthetic"] = synthetic(folder, n)
        if not args.no_real:
            results["real"] = real_runs(folder, args.quick)
    results["machine"] = machine()
    results["source"] = source_state()
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, "long_runs.json"), "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
