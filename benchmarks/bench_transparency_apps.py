"""Observe without disturbing, on real models nobody here wrote: keras.applications models
(random init, synthetic data, batch 4, 32x32 inputs) trained one step with train_on_batch,
plain and inside ``nddebug.trace()``, from the same seed. Reports how many variables differ
between two plain runs (is the plain step deterministic by itself?) and between the plain and
the traced run (did tracing change what the step computes?), and whether tracing raised.

    .venv/bin/python benchmarks/bench_transparency_apps.py [Model:size ...]

Writes ``benchmarks/results/transparency_apps.json`` (a run of some models replaces their rows
and keeps the others' measured with the same TensorFlow and oneDNN setting). Several minutes
per large model on 2 cores; pass model names to run a few.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DEFAULT = [
    "MobileNetV3Small:32",
    "MobileNetV2:32",
    "ResNet50V2:32",
    "EfficientNetB0:32",
    "ConvNeXtTiny:32",
    "DenseNet121:32",
]
HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "transparency_apps.json")


def _make(arch: str, size: int):
    import keras
    import numpy as np

    keras.utils.set_random_seed(7)
    kwargs = {"input_shape": (size, size, 3), "weights": None, "classes": 5}
    model = getattr(keras.applications, arch)(**kwargs)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy())
    x = np.random.RandomState(0).rand(4, size, size, 3).astype("float32")
    y = np.random.RandomState(1).randint(0, 5, 4)
    return model, x, y


def _bits(model) -> list[bytes]:
    return [v.numpy().tobytes() for v in model.variables]


def measure(arch: str, size: int) -> dict:
    import nddebug

    start = time.perf_counter()
    row: dict = {"model": arch, "input": size}
    runs = []
    for traced in (False, False, True):
        model, x, y = _make(arch, size)
        try:
            if traced:
                with nddebug.trace() as rec:
                    model.train_on_batch(x, y)
                row["warnings"] = len(rec.warnings)
            else:
                model.train_on_batch(x, y)
        except Exception as exc:  # noqa: BLE001 - a crash is the finding
            row["error"] = f"{'traced' if traced else 'plain'}: {type(exc).__name__}"
            break
        runs.append(_bits(model))
    if len(runs) == 3:
        row["variables"] = len(runs[0])
        row["plain_vs_plain"] = sum(a != b for a, b in zip(runs[0], runs[1], strict=True))
        row["plain_vs_traced"] = sum(a != b for a, b in zip(runs[0], runs[2], strict=True))
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main() -> None:
    specs = sys.argv[1:] or DEFAULT
    rows = []
    for spec in specs:
        arch, _, size = spec.partition(":")
        row = measure(arch, int(size or 32))
        rows.append(row)
        print(json.dumps(row), flush=True)
    import tensorflow as tf

    from nddebug.environment import onednn_enabled

    out = {"tensorflow": tf.__version__, "onednn": onednn_enabled(), "rows": rows}
    try:
        with open(RESULTS, encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, ValueError):
        old = {}
    if {k: old.get(k) for k in ("tensorflow", "onednn")} == {
        k: out[k] for k in ("tensorflow", "onednn")
    }:
        # A run of a few models replaces their rows and keeps the others' (same TF, oneDNN).
        measured = {(r["model"], r["input"]) for r in rows}
        kept = [r for r in old.get("rows", []) if (r["model"], r["input"]) not in measured]
        out["rows"] = kept + rows
    with open(RESULTS, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
