"""Rerun mode: every stateless op also runs k more times on its very own inputs, and the
host compares the copies' outputs with the original's (``trace(rerun=k)``).

Eager ops are executed again at once. Graph ops get k copies of the node; on the CPU the host
receives the tensors themselves and compares them in place, elsewhere the graph compares the
copies bitwise and sends bytes only for an output whose copies differed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nddebug import digest as dg
from nddebug.recording import Event, OpInfo
from nddebug.tracer import ops
from nddebug.tracer.registry import REGISTRY

_WORD = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def on_host(device: str) -> bool:
    """Whether a graph op's outputs live in host memory, where the host reads them for free."""
    if device:
        return "CPU" in device.upper()
    return not dg.gpu_present()


def rerun_eager(
    rec: Any, op_type: str, inputs: Any, attrs: Any, outputs: list[Any], ev: Event, capture: bool
) -> list[list[dg.Digest | None]]:
    """Execute the op again, at once, on the very same input tensors and device. Both
    values are still at hand, so those of a divergent output are kept to measure it."""
    import tensorflow as tf
    from tensorflow.python.eager import context, execute

    from nddebug.tracer.eager import digest_eager_tensors

    # The eager fast path reports unset optional attrs as None: leave those to defaults.
    pairs = zip(attrs[::2], attrs[1::2], strict=False) if attrs else ()
    flat = tuple(x for k, v in pairs if v is not None for x in (k, v))
    reruns = []
    results = []
    with tf.device(outputs[0].device or None):
        for _ in range(rec.rerun):
            again = execute.quick_execute(
                op_type, len(outputs), list(inputs), flat, context.context()
            )
            results.append(again)
            # Only the outputs the original has a digest of (none of an undefined output).
            wanted = [t if d is not None else None for t, d in zip(again, ev.digests, strict=False)]
            reruns.append(digest_eager_tensors(wanted))
    for slot, digest in enumerate(ev.digests):
        if digest is None or not (capture or any(r[slot] != digest for r in reruns)):
            continue
        for j, t in enumerate([outputs[slot], *(again[slot] for again in results)]):
            value = ops.kept_value(t.numpy())
            if value is not None:
                rec.recording.values[f"{ev.seq}:{slot}" + (f"@{j}" if j else "")] = value
    return reruns


def duplicates(graph: Any, op: Any, inputs: Any, k: int) -> list[Any]:
    """k copies of ``op`` on the very same input tensors, for rerun mode. Nothing consumes
    them but their digests, so the graph computes what it computed before. Each copy waits
    for the previous one (control edge) and differs from it by an attribute, so grappler's
    common-subexpression elimination cannot merge them back into one."""
    from tensorflow.core.framework import attr_value_pb2

    cache = REGISTRY.graph_cache(graph)
    name = f"<rerun>{op.name}"
    if name in cache:
        return cache[name]
    attrs = {k_: op.node_def.attr[k_] for k_ in op.node_def.attr}
    dups = []
    prev = op
    for j in range(1, k + 1):
        attrs["_nddebug_rerun"] = attr_value_pb2.AttrValue(i=j)
        with graph.control_dependencies([prev]), graph.name_scope("nddebug"):
            # Graph.create_op, the public spelling, is deprecated and warns on every call.
            dup = graph._create_op_internal(
                op.type,
                list(inputs),
                [t.dtype for t in op.outputs],
                attrs=dict(attrs),
                name=f"rerun{j}_{op.name.rsplit('/', 1)[-1]}",
            )
        if op.device:
            dup._set_device(op.device)
        dups.append(dup)
        prev = dup
    cache[name] = dups
    return dups


#: Ops that oneDNN's graph rewrite (MklLayoutRewritePass, CPU builds with oneDNN on) merges
#: into one oneDNN kernel where a Conv2DBackpropFilter and a BiasAddGrad read the same
#: gradient: it computes the bias gradient with oneDNN's kernel, not BiasAddGrad's.
MERGED_BY_ONEDNN = frozenset({"Conv2DBackpropFilter", "BiasAddGrad"})
#: OpInfo.rerun of such an op.
RERUN_MERGED = (
    "merged by oneDNN's graph rewrite with the op that reads the same gradient (a filter "
    "gradient and its bias gradient): a copy cannot run the merged kernel"
)


def blocker(op_type: str, device: str) -> str:
    """Why rerun mode does not copy a graph op whose copies could not run the original's
    kernel ("" if it copies it). Which of an original and its copies oneDNN merged depended
    on the order of the gradient's consumers in memory, so rerun mode compared two kernels
    and named BiasAddGrad a source in about one step in three; a Snapshot of the gradient for
    each kept all of them unmerged, and then the original computed other bits than the plain
    step (probe round 48, F5, as the sums of ops.RERUN_SUMS). Not copied, they merge as in
    the plain step."""
    from nddebug.environment import onednn_enabled

    if op_type in MERGED_BY_ONEDNN and on_host(device) and onednn_enabled():
        return RERUN_MERGED
    return ""


def device_payload(original: Any, copies: list[Any]) -> list[Any]:
    """What the host needs to compare an output with its copies' outputs: the bytes of the
    original and of each copy, sliced to nothing unless some copy differs. A bitwise compare
    is a few ops where a digest per copy is tens, and a divergent op (rare) brings its values
    along, to be measured."""
    import tensorflow as tf

    with tf.name_scope("nddebug"):
        word = _WORD.get(original.dtype.size) if original.dtype != tf.bool else None

        def bits(t: Any) -> Any:
            return tf.bitcast(t, word) if word and t.dtype != word else dg.byte_view(t)

        if original.dtype == tf.string:
            # Copies' strings may have other lengths: compare digests, not byte views.
            mine = dg.build_digest(original, False)
            differs = [tf.reduce_any(tf.not_equal(mine, dg.build_digest(c, False))) for c in copies]
        else:
            a = bits(original)
            differs = [tf.reduce_any(tf.not_equal(a, bits(c))) for c in copies]
        raw = [dg.byte_view(t) for t in (original, *copies)]
        any_differs = tf.cast(tf.reduce_any(tf.stack(differs)), tf.int32)
        out = [raw[0][: tf.size(raw[0]) * any_differs]]
        out += [
            r[: tf.size(r) * tf.cast(d, tf.int32)] for r, d in zip(raw[1:], differs, strict=True)
        ]
    return out


def host_digests(
    ev: Event, slots: list[int], k: int, arrays: tuple[np.ndarray, ...], kept: dict[str, np.ndarray]
) -> None:
    """Rerun mode on the CPU: the graph handed over each output and its k copies (zero-copy
    views of host memory), so they are compared and digested here, and the graph carries no
    digest ops. The inputs were the same tensors for all copies by construction."""
    ev.inputs = []
    reruns: list[list[dg.Digest | None]] = [list(ev.digests) for _ in range(k)]
    for i, slot in enumerate(slots):
        # A scalar string output arrives as bytes (tf.print's StringFormat): as an array.
        original, *copies = (dg.host_array(a) for a in arrays[i * (k + 1) : (i + 1) * (k + 1)])
        ev.digests[slot] = d = dg.digest_numpy(original)
        for j, copy in enumerate(copies):
            if _same_bits(original, copy):
                reruns[j][slot] = d
                continue
            reruns[j][slot] = dg.digest_numpy(copy)
            for m, c in enumerate([original, *copies]):  # the buffers are TensorFlow's
                value = ops.kept_value(c)
                if value is not None:
                    kept[f"{ev.seq}:{slot}" + (f"@{m}" if m else "")] = value
    if k:
        ev.reruns = reruns


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.itemsize == 0 or not a.size:
        return True
    if dg.is_strings(a):
        return bool(np.array_equal(a, b))
    return bool(
        np.array_equal(
            np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
        )
    )


def device_digests(
    op: OpInfo,
    ev: Event,
    slots: list[int],
    k: int,
    payload: tuple[np.ndarray, ...],
    kept: dict[str, np.ndarray],
) -> list[list[dg.Digest | None]]:
    """The copies' digests from their payload: per output, the original's bytes and each
    copy's, all empty unless some copy differed (see device_payload). The bytes of a divergent
    output are kept as values, to measure the divergence with no second pass."""
    import tensorflow as tf

    reruns: list[list[dg.Digest | None]] = [list(ev.digests) for _ in range(k)]
    for i, slot in enumerate(slots):
        original, *copies = payload[i * (k + 1) : (i + 1) * (k + 1)]
        if not original.size:
            continue  # every copy equalled the original
        dtype = np.dtype(tf.as_dtype(op.dtypes[slot]).as_numpy_dtype)
        # A string output's payload is its digest's bytes (string_bytes): digested, not kept.
        keep = not dg.is_strings(dtype)
        if keep:
            kept[f"{ev.seq}:{slot}"] = np.frombuffer(original.tobytes(), dtype)
        for j, data in enumerate(copies, start=1):
            if data.size:
                reruns[j - 1][slot] = dg.digest_numpy(data)
                if keep:
                    kept[f"{ev.seq}:{slot}@{j}"] = np.frombuffer(data.tobytes(), dtype)
            elif keep:
                kept[f"{ev.seq}:{slot}@{j}"] = kept[f"{ev.seq}:{slot}"]
    return reruns
