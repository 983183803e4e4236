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
that nddebug's readers block (or allow) only on one path. For the graphs themselves, add
``TF_DUMP_GRAPH_PREFIX=/tmp/g`` and compare the ``after_graph_optimization`` dumps.
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
    args = parser.parse_args()
    import tensorflow as tf

    if args.determinism:
        tf.config.experimental.enable_op_determinism()
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
