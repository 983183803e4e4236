"""Where ``nddebug.trace()`` spends its time on the CNN step: variants of the tracer, side by side.

Run from the repository root::

    .venv/bin/python benchmarks/profile_tracer.py            # full run (~3 min)
    .venv/bin/python benchmarks/profile_tracer.py --quick    # short run

Each variant is the same step (``mnist_cnn.make_custom_step``) traced inside
``nddebug.trace()`` while one piece of the tracer is swapped out *in this process only*
(monkeypatching; nothing in ``nddebug/`` is changed). All variants run interleaved, round by
round, and medians are reported with the ratio to the plain step:

- ``full``: nddebug as it is;
- ``full, outside trace()``: the same instrumented function called with no block active;
- ``callbacks only``: every digest replaced by a constant (the per-op host callback and its
  control-dependency chain remain; grappler folds the constants);
- ``callbacks + 1-element read``: the digest reads one byte of each tensor: what the extra
  consumers cost by themselves (they keep grappler from fusing Conv2D+BiasAdd+Relu etc.);
- ``digests only``: all digests computed, no host callbacks: the digests are summed into an
  extra output of the step;
- ``digests + one callback per step``: all digests, handed to the host in ONE numpy_function
  at the end of the step (the recorder gets the same events);
- ``portable digest``: ``use_matmul=False`` (multiply + reduce instead of MatMul);
- ``shared weight constants``: the 4096-entry weight tables made once per graph instead of
  once per digested tensor (first call and graph size);
- ``unchained callbacks``: the host callbacks marked ``run_independently`` so automatic
  control dependencies do not chain them in program order.

A second table runs the same step *eagerly* (``train_step.python_function``): plain, inside
``trace()``, and inside ``trace()`` with eager CPU tensors of 32 KB or more digested by the TF
kernels (``digest.eager_digest_fn``) instead of ``digest_numpy``.

It also reports, per variant, the first call (tracing + instrumentation + graph optimisation)
and the op count and GraphDef size of the traced graph; and, for ``full``, the Python time
spent inside ``Recorder.on_graph_event`` per step.
Results: ``benchmarks/results/profile_tracer.json``.

This script swaps nddebug internals (``tf.numpy_function`` as the tracer calls it,
``digest.build_digest``, ``digest._weighted_sum``, ``Recorder.on_graph_event``): if the tracer
is reorganised, a variant may stop applying; it then prints the error and is skipped.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (ROOT, os.path.join(ROOT, "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from _common import interleave, machine, paired_ratio, source_state  # noqa: E402
from tabulate import tabulate  # noqa: E402
from tensorflow.python.framework import auto_control_deps as acd  # noqa: E402

import nddebug  # noqa: E402
from nddebug import digest as dg  # noqa: E402
from nddebug import tracer  # noqa: E402
from nddebug.examples import mnist_cnn  # noqa: E402
from nddebug.tracer import eager as eager_hooks  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "profile_tracer.json")

_ORIG_NPF = tf.numpy_function
_ORIG_BUILD = dg.build_digest
_ORIG_USE_MATMUL = dg.use_matmul_for
_ORIG_WEIGHTED_SUM = dg._weighted_sum
_ORIG_ACD_ENTER = acd.AutomaticControlDependencies.__enter__
_ORIG_ACD_EXIT = acd.AutomaticControlDependencies.__exit__


def make_sink_step(model, collected: list, batched: bool) -> Callable:
    """``make_custom_step`` plus a tail consuming the digests the tracer emitted."""
    loss_fn = model.loss
    optimizer = model.optimizer

    @tf.function(autograph=False)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            loss = tf.reduce_mean(loss_fn(y, pred))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=False))
        with tracer.inside_nddebug():
            if batched:
                layout = [(op_id, o.shape[0], i.shape[0]) for op_id, o, i in collected]
                outs = tf.concat([o for _, o, _ in collected], 0)
                ins = tf.concat([i for _, _, i in collected], 0)

                def receive(outs_np, ins_np):
                    rec = tracer.Recorder.active
                    if rec is None:
                        return
                    a = b = 0
                    for op_id, no, ni in layout:
                        rec.on_graph_event(op_id, outs_np[a : a + no], ins_np[b : b + ni])
                        a += no
                        b += ni

                _ORIG_NPF(receive, [outs, ins], Tout=[], stateful=True)
                return loss
            sink = tf.add_n([tf.reduce_sum(o) + tf.reduce_sum(i) for _, o, i in collected])
        return loss, sink

    return train_step


def _touch(tensor, use_matmul, active=None):
    first = tf.cast(dg.byte_view(tensor)[:1], tf.int64)
    return tf.concat([first, tf.zeros([2], tf.int64)], 0)[:2]


@contextlib.contextmanager
def patched(kind: str) -> Iterator[list]:
    """Swap one piece of the tracer while the variant's function is traced."""
    collected: list = []
    acd_stack: list = []
    if kind in ("digests only", "digests + one callback per step"):

        def npf(func, inp, Tout, stateful=True, name=None):
            op_id = int(tf.get_static_value(inp[0]))
            collected.append((op_id, inp[1], inp[2]))
            return []

        tf.numpy_function = npf
    elif kind == "callbacks only":
        dg.build_digest = lambda t, u, active=None: tf.zeros([2], tf.int64)
    elif kind == "callbacks + 1-element read":
        dg.build_digest = _touch
    elif kind == "portable digest":
        dg.use_matmul_for = lambda device: False
    elif kind == "shared weight constants":
        consts: dict = {}

        def weighted_sum(words, weights, stream, use_matmul):
            graph = tf.compat.v1.get_default_graph()
            key = (id(graph), id(weights))
            if weights is not dg._block_weights(stream):
                return _ORIG_WEIGHTED_SUM(words, weights, stream, use_matmul)
            if key not in consts:
                consts[key] = tf.constant(weights)
            w = consts[key]
            if stream == 1:
                words = tf.bitwise.right_shift(words, 32)
            if words.shape.rank == 2 and use_matmul:
                return tf.reshape(tf.matmul(words, tf.reshape(w, [-1, 1])), [-1])
            return tf.reduce_sum(words * w, axis=-1)

        dg._weighted_sum = weighted_sum
    elif kind == "unchained callbacks":

        def enter(self):
            out = _ORIG_ACD_ENTER(self)
            acd_stack.append(self)
            return out

        def exit_(self, *exc):
            acd_stack.pop()
            return _ORIG_ACD_EXIT(self, *exc)

        acd.AutomaticControlDependencies.__enter__ = enter
        acd.AutomaticControlDependencies.__exit__ = exit_

        def npf(func, inp, Tout, stateful=True, name=None):
            out = _ORIG_NPF(func, inp, Tout=Tout, stateful=stateful, name=name)
            op = tf.compat.v1.get_default_graph().get_operations()[-1]
            if acd_stack and op.type in ("PyFunc", "EagerPyFunc"):
                acd_stack[-1].run_independently(op)
            return out

        tf.numpy_function = npf
    try:
        yield collected
    finally:
        tf.numpy_function = _ORIG_NPF
        dg.build_digest = _ORIG_BUILD
        dg.use_matmul_for = _ORIG_USE_MATMUL
        dg._weighted_sum = _ORIG_WEIGHTED_SUM
        acd.AutomaticControlDependencies.__enter__ = _ORIG_ACD_ENTER
        acd.AutomaticControlDependencies.__exit__ = _ORIG_ACD_EXIT


VARIANTS = (
    "full",
    "callbacks only",
    "callbacks + 1-element read",
    "digests only",
    "digests + one callback per step",
    "portable digest",
    "shared weight constants",
    "unchained callbacks",
)


def _digest_eager_tf_kernel(tensor):
    """digest_eager_tensor, but eager CPU tensors of 32 KB or more are digested by the TF
    kernels (``eager_digest_fn``) instead of ``digest_numpy`` (same digest, checked)."""
    try:
        dtype = tensor.dtype
    except AttributeError:
        return None
    n = tensor.shape.num_elements()
    if dg.digestible(dtype) and n is not None and n * dtype.size >= 32768:
        values = dg.eager_digest_fn(dtype, tuple(tensor.shape), True)(tensor).numpy()
        return int(values[0]), int(values[1])
    return _ORIG_DIGEST_EAGER(tensor)


_ORIG_DIGEST_EAGER = eager_hooks.digest_eager_tensor


def eager_section(model, x, y, rounds: int, reps: int) -> dict:
    """The same step run eagerly (its python_function): every op is an eager op, digested on
    the host by digest_numpy (CPU), or by the TF kernels for tensors >= 32 KB."""
    step = mnist_cnn.make_custom_step(model).python_function

    def traced() -> None:
        with nddebug.trace():
            step(x, y)

    def traced_tf_kernel() -> None:
        eager_hooks.digest_eager_tensor = _digest_eager_tf_kernel
        try:
            with nddebug.trace():
                step(x, y)
        finally:
            eager_hooks.digest_eager_tensor = _ORIG_DIGEST_EAGER

    big = tf.random.normal([1000, 100])
    for t in (x, y, big):  # the swap changes the speed, not the digest
        assert _digest_eager_tf_kernel(t) == _ORIG_DIGEST_EAGER(t)
    variants = {
        "eager plain": (lambda: step(x, y), 1, reps),
        "eager, trace()": (traced, 1, reps),
        "eager, trace(), TF-kernel digests >= 32 KB": (traced_tf_kernel, 1, reps),
    }
    for run, _, _ in variants.values():
        run()
    cpu: dict[str, list[float]] = {}
    samples = interleave(variants, rounds, cpu)
    reps_of = {k: v[2] for k, v in variants.items()}
    return {
        "median_ms": {k: statistics.median(v) * 1e3 for k, v in samples.items()},
        "ratio_to_plain_paired": {
            k: paired_ratio(samples, k, "eager plain", reps_of) for k in samples
        },
        "cpu_median_ms": {k: statistics.median(v) * 1e3 for k, v in cpu.items()},
    }


class CallbackTimer:
    """Accumulates the Python time spent in Recorder.on_graph_event (all threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds = 0.0
        self.calls = 0
        self._orig = tracer.Recorder.on_graph_event

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        orig = self._orig

        def timed(rec, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return orig(rec, *args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                with self.lock:
                    self.seconds += dt
                    self.calls += 1

        tracer.Recorder.on_graph_event = timed
        try:
            yield
        finally:
            tracer.Recorder.on_graph_event = orig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run")
    parser.add_argument("--out", default=RESULTS, help="JSON results file")
    parser.add_argument("--only", nargs="*", help="variants to run (default: all)")
    parser.add_argument("--no-eager", action="store_true", help="skip the eager-step section")
    args = parser.parse_args()
    rounds, reps = (2, 2) if args.quick else (6, 3)
    kinds = [k for k in VARIANTS if not args.only or k in args.only]

    model = mnist_cnn.make_model()
    xn, yn = mnist_cnn.make_data(128)
    x, y = tf.constant(xn), tf.constant(yn)
    plain = mnist_cnn.make_custom_step(model)
    t0 = time.perf_counter()
    plain(x, y)
    plain_graph = plain.get_concrete_function(x, y).graph
    static = {
        "plain": {
            "first_call_s": time.perf_counter() - t0,
            "ops": len(plain_graph.get_operations()),
            "graphdef_bytes": plain_graph.as_graph_def().ByteSize(),
        }
    }
    fns: dict[str, Callable[[], object]] = {"plain": lambda: plain(x, y)}
    for kind in kinds:
        try:
            with patched(kind) as collected:
                if kind in ("digests only", "digests + one callback per step"):
                    step = make_sink_step(model, collected, kind != "digests only")
                else:
                    step = mnist_cnn.make_custom_step(model)
                t0 = time.perf_counter()
                with nddebug.trace() as rec:
                    step(x, y)
                first = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - a variant that no longer applies is skipped
            print(f"variant {kind!r} skipped: {type(exc).__name__}: {exc}")
            continue
        graph = step.get_concrete_function(x, y).graph
        types = collections.Counter(op.type for op in graph.get_operations())
        static[kind] = {
            "first_call_s": first,
            "ops": sum(types.values()),
            "graphdef_bytes": graph.as_graph_def().ByteSize(),
            "op_types": dict(types.most_common(12)),
            "events_first_call": len(rec.events),
            "warnings": rec.warnings[:3],
        }
        print(f"traced {kind!r}: {first:.1f} s, {sum(types.values())} ops, {len(rec)} events")

        def run(step=step) -> None:
            with nddebug.trace():
                step(x, y)

        fns[kind] = run
        if kind == "full":
            fns["full, outside trace()"] = lambda step=step: step(x, y)

    for fn in fns.values():  # warm up
        fn()
        fn()
    cpu: dict[str, list[float]] = {}
    samples = interleave({k: (fn, 1, reps) for k, fn in fns.items()}, rounds, cpu)
    names = list(fns)

    timer = CallbackTimer()
    py = None
    if "full" in fns:
        n = 3 * reps
        with timer.active():
            for _ in range(n):
                fns["full"]()
        py = {
            "callbacks_per_step": timer.calls / n,
            "python_ms_per_step": timer.seconds / n * 1e3,
            "python_us_per_callback": timer.seconds / max(1, timer.calls) * 1e6,
        }

    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    paired = {k: paired_ratio(samples, k, "plain", dict.fromkeys(names, reps)) for k in names}
    cpu_med = {k: statistics.median(v) * 1e3 for k, v in cpu.items()}
    rows = []
    for name in names:
        s = static.get(name, {})
        rows.append(
            [
                name,
                f"{med[name]:.1f}",
                f"{med[name] / med['plain']:.2f}",
                f"{paired[name]:.2f}",
                f"{(paired[name] - 1) * med['plain']:+.1f}",
                f"{cpu_med[name]:.0f} ({cpu_med[name] / cpu_med['plain']:.2f}x)",
                f"{s['first_call_s']:.1f}" if s else "",
                s.get("ops", ""),
                f"{s['graphdef_bytes'] / 1e6:.2f}" if s else "",
            ]
        )
    print()
    print(
        tabulate(
            rows,
            headers=[
                "variant",
                "median ms/step",
                "x plain (medians)",
                "x plain (paired)",
                "ms over plain (paired)",
                "CPU ms/step (x plain)",
                "first call s",
                "graph ops",
                "GraphDef MB",
            ],
            disable_numparse=True,
        )
    )
    if py:
        print(
            f"\nfull: {py['callbacks_per_step']:.0f} host callbacks per step; Python inside "
            f"Recorder.on_graph_event: {py['python_ms_per_step']:.2f} ms per step "
            f"({py['python_us_per_callback']:.1f} us per callback)"
        )
    eager = None
    if not args.no_eager:
        eager = eager_section(model, x, y, max(2, rounds // 2), 2)
        print()
        print(
            tabulate(
                [
                    [
                        k,
                        f"{v:.1f}",
                        f"{eager['ratio_to_plain_paired'][k]:.2f}",
                        f"{eager['cpu_median_ms'][k]:.0f}",
                    ]
                    for k, v in eager["median_ms"].items()
                ],
                headers=["eager step", "median ms/step", "x plain (paired)", "CPU ms/step"],
                disable_numparse=True,
            )
        )

    results = {
        "benchmark": "profile_tracer",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "source": source_state(),
        "quick": args.quick,
        "rounds": rounds,
        "reps_per_round": reps,
        "median_ms": med,
        "ratio_to_plain_by_medians": {k: v / med["plain"] for k, v in med.items()},
        "ratio_to_plain_paired": paired,
        "cpu_median_ms": cpu_med,
        "cpu_ratio_to_plain": {k: v / cpu_med["plain"] for k, v in cpu_med.items()},
        "samples_ms": {k: [v * 1e3 for v in vs] for k, vs in samples.items()},
        "static": static,
        "python_callbacks": py,
        "eager": eager,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
