"""Where a transparency workload's traced bits part from the plain ones, and which grappler
optimizer it depends on: a diagnostic for a machine where ``tests/test_transparency.py``'s
bitwise check fails (the GPU tier's ``conv_batch_norm_inference`` on the native GPU kernels,
2026-11-27; see benchmarks/README.md).

For each grappler setting (default; remapper off; layout optimizer off; arithmetic optimizer
off) it builds the workload fresh, plain and traced, and says whether the traced call, and
the call after the block (the plain twin), give the plain bits. Run it once as is and once
with ``NDDEBUG_NATIVE_GPU=0`` (the pure-TF path) to compare:

    python benchmarks/diagnose_transparency.py conv_batch_norm_inference [--determinism]

A setting where traced differs by default but not with an optimizer off names the rewrite
that nddebug's readers block (or allow) only on one path. ``--graphs FILE`` also writes, for
the default setting, the user's nodes (not nddebug's) of the optimized partition graphs of the
first plain and the first traced call, with their op types and devices, and how far the
traced values are from the plain ones (elements that differ, max |delta|).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SETTINGS = {
    "default": {},
    "remapping off": {"remapping": False},
    "layout off": {"layout_optimizer": False},
    "arithmetic off": {"arithmetic_optimization": False},
}


def _user_nodes(metadata_list: list) -> list[dict]:
    """The nodes of the optimized partition graphs that are not nddebug's: name, op, device
    and data inputs (the graphs a RunMetadata collected while graph collection was on)."""
    from nddebug.tracer.unneeded import is_ours_name

    nodes = []
    for metadata in metadata_list:
        for fg in metadata.function_graphs:
            for graph in fg.partition_graphs:
                for n in graph.node:
                    if n.op.startswith("Nddebug") or is_ours_name(n.name):
                        continue
                    inputs = [x for x in n.input if not x.startswith("^")]
                    nodes.append({"name": n.name, "op": n.op, "device": n.device, "in": inputs})
    return nodes


def _distance(plain: list, traced: list) -> list[dict]:
    """Per value, how many elements differ between the plain and the traced call, and by how
    much at most."""
    import numpy as np

    out = []
    for a, b in zip(plain, traced, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype.kind != "f":
            out.append({"equal": bool(np.array_equal(a, b))})
            continue
        differ = a != b
        out.append(
            {
                "differ": int(differ.sum()),
                "of": int(a.size),
                "max_abs": float(np.max(np.abs(a - b))) if differ.any() else 0.0,
            }
        )
    return out


def graphs(name: str) -> dict:
    """The first plain and first traced call's optimized graphs (the user's nodes) and values."""
    import collections

    import tensorflow as tf
    from tensorflow.python.eager import context

    import nddebug
    from tests.test_transparency import WORKLOADS, _variables

    ctx = context.context()
    captured: list = []
    export = ctx.export_run_metadata

    def spy():  # the tracer exports (and so clears) what it collected: keep a copy
        metadata = export()
        if metadata is not None:
            captured.append(metadata)
        return metadata

    def values(result, state):
        return [r.numpy() for r in tf.nest.flatten(result)] + [v.numpy() for v in _variables(state)]

    plain_step, args, plain_state = WORKLOADS[name]()
    ctx.enable_graph_collection()
    plain = values(plain_step(*args), plain_state)
    plain_graphs = [export()]
    ctx.disable_graph_collection()
    step, args, state = WORKLOADS[name]()
    ctx.export_run_metadata = spy
    try:
        ctx.enable_graph_collection()
        with nddebug.trace():
            traced = values(step(*args), state)
        spy()
        ctx.disable_graph_collection()
    finally:
        del ctx.export_run_metadata
    p_nodes, t_nodes = _user_nodes(plain_graphs), _user_nodes(captured)
    p_ops = collections.Counter((n["op"], n["device"].split("/")[-1]) for n in p_nodes)
    t_ops = collections.Counter((n["op"], n["device"].split("/")[-1]) for n in t_nodes)
    return {
        "values traced vs plain": _distance(plain, traced),
        "ops only plain": sorted(f"{op}@{d} x{c}" for (op, d), c in (p_ops - t_ops).items()),
        "ops only traced": sorted(f"{op}@{d} x{c}" for (op, d), c in (t_ops - p_ops).items()),
        "plain nodes": p_nodes,
        "traced nodes": t_nodes,
    }


def run(name: str) -> dict[str, dict[str, bool]]:
    import tensorflow as tf

    import nddebug
    from tests.test_transparency import WORKLOADS, _bits

    found = {}
    for setting, options in SETTINGS.items():
        tf.config.optimizer.set_experimental_options(
            {"remapping": True, "layout_optimizer": True, "arithmetic_optimization": True} | options
        )
        plain_step, args, plain_state = WORKLOADS[name]()
        plain = _bits(plain_step(*args), plain_state)
        again = _bits(plain_step(*args), plain_state)  # the state moved on: compare calls 2
        step, args, state = WORKLOADS[name]()
        with nddebug.trace():
            traced = _bits(step(*args), state)
            traced_again = _bits(step(*args), state)
        after = _bits(step(*args), state) == _bits(plain_step(*args), plain_state)
        found[setting] = {
            "traced == plain": traced == plain and traced_again == again,
            "after == plain": after,
        }
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", help="a name from tests/test_transparency.py's WORKLOADS")
    parser.add_argument("--determinism", action="store_true", help="op determinism on")
    parser.add_argument("--graphs", metavar="FILE", help="write the optimized graphs here")
    args = parser.parse_args()
    import tensorflow as tf

    if args.determinism:
        tf.config.experimental.enable_op_determinism()
    if args.graphs:
        detail = graphs(args.workload)
        with open(args.graphs, "w", encoding="utf-8") as f:
            json.dump(detail, f, indent=1)
        short = {k: v for k, v in detail.items() if not k.endswith("nodes")}
        print(json.dumps(short, indent=1))
    result = run(args.workload)
    print(
        json.dumps(
            {
                "workload": args.workload,
                "native_gpu": os.environ.get("NDDEBUG_NATIVE_GPU", "1"),
                "found": result,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
