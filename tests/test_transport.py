"""How graph digests reach the host: on the CPU with the native ops, one drain of a C++
buffer per top-level call instead of one host callback per op, with the same recording as
the pure-TF path (``NDDEBUG_NATIVE=0``)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug import digest as dg
from nddebug import native
from nddebug.digest import digest_numpy
from nddebug.tracer import transport
from tests.helpers import run_python

N_OPS = 60


def _chain():
    """A fresh tf.function of N_OPS dependent multiplies (and a loop of 5 iterations). Each
    product is read by a Tanh: a product read only by another product or a sum is not
    digested (grappler may merge the chain; see data/rewrites.toml)."""

    @tf.function
    def chain(x):
        for _ in range(N_OPS):
            x = tf.tanh(x * 1.5)
        i = tf.constant(0)
        while i < 5:
            x = x + 1.0
            i += 1
        return x

    return chain


def _native_lib():
    if not native.enabled() or dg.gpu_present():
        pytest.skip("native ops disabled (NDDEBUG_NATIVE=0) or a GPU present")
    lib = native.load()
    assert lib is not None, native.problem()
    return lib


def _record(fn, x, calls):
    before = dict(transport.COUNTS)
    with nddebug.trace() as rec:
        for _ in range(calls):
            y = fn(x)
    delta = {k: transport.COUNTS[k] - before[k] for k in before}
    return rec, delta, y


def test_native_path_hands_digests_over_once_per_call_not_per_op():
    _native_lib()
    x = tf.constant(np.arange(5000, dtype=np.float32))
    calls = 3
    rec, delta, y = _record(_chain(), x, calls)
    graph_events = [e for e in rec.events if rec.ops[e.op_id].graph]
    # every multiply of every call was recorded ...
    muls = [e for e in graph_events if rec.ops[e.op_id].op_type == "Mul"]
    assert len(muls) == N_OPS * calls
    # ... yet the host was reached at most once per top-level call: no per-op callbacks
    assert delta["callbacks"] == 0
    assert 1 <= delta["drains"] <= calls
    # the digests are exact, and each call's graph events come before the call's own event
    adds = [e for e in graph_events if rec.ops[e.op_id].op_type == "AddV2"]
    adds = [e for e in adds if rec.ops[e.op_id].dtypes == ["float32"]]  # not the counter
    assert adds[-1].digests == [digest_numpy(y.numpy())]
    calls_seq = [e.seq for e in rec.events if not rec.ops[e.op_id].graph]
    assert len(calls_seq) == calls
    for e in graph_events:
        assert e.call in calls_seq and e.seq < e.call


def test_instrumented_function_outside_trace_hands_nothing_over():
    lib = _native_lib()
    fn = _chain()
    x = tf.constant(np.ones(100, np.float32))
    _record(fn, x, 1)
    before = dict(transport.COUNTS)
    fn(x)
    assert lib.drain() == []
    assert transport.COUNTS == before


def test_pure_tf_path_gives_the_same_recording(monkeypatch):
    _native_lib()
    x = tf.constant(np.linspace(-3, 3, 3000, dtype=np.float32))
    fast, fast_delta, _ = _record(_chain(), x, 2)
    monkeypatch.setenv(native.ENV, "0")
    slow, slow_delta, _ = _record(_chain(), x, 2)  # a fresh function: built the old way
    n_graph = sum(1 for e in slow.events if slow.ops[e.op_id].graph)
    assert slow_delta["callbacks"] == n_graph > 2 * N_OPS
    assert slow_delta["drains"] == 0 and fast_delta["callbacks"] == 0

    def rows(rec):
        # Ops that may run concurrently (the loop and the digests of the multiplies) arrive
        # in either order on both paths: compare each op's executions, in order, per call.
        calls = sorted(e.seq for e in rec.events if not rec.ops[e.op_id].graph)
        per_op: dict = {}
        for e in rec.events:
            op = rec.ops[e.op_id]
            call = calls.index(e.call) if op.graph else -1
            per_op.setdefault(op.key, []).append((call, e.digests, e.inputs, e.seq <= e.call))
        return per_op

    assert rows(fast) == rows(slow)
    assert not fast.warnings and not slow.warnings


def test_failed_build_falls_back_with_one_warning(tmp_path):
    """No compiler: the pure-TF path records the same events, and the recording says why."""
    code = """
import json
import tensorflow as tf, nddebug
from nddebug import native
from nddebug.tracer import transport
@tf.function
def f(x):
    return tf.sin(x * 2.0) + 1.0
with nddebug.trace() as rec:
    f(tf.constant([1.0, 2.0]))
warned = sum("native ops could not be built" in w for w in rec.warnings)
print(json.dumps([len(rec.events), transport.COUNTS["callbacks"], warned, native.load() is None]))
"""
    env = {"NDDEBUG_CACHE_DIR": str(tmp_path), "CXX": "nddebug-no-such-compiler"}
    env["NDDEBUG_NATIVE"] = "1"
    # Mul, Sin and AddV2 by host callback, and the call itself; one warning; no library
    assert run_python(code, env=env) == [4, 3, 1, True]


def test_native_graph_digests_and_records_each_op_with_one_op():
    """One fused op per recorded op: its outputs are the digests the consumers' records reuse,
    and constants are digested when the graph is built, not by an op in every step."""
    _native_lib()
    fn = _chain()
    x = tf.constant(np.arange(50, dtype=np.float32))
    with nddebug.trace() as rec:
        fn(x)
    graph = fn.get_concrete_function(x).graph
    ours = [op for op in graph.get_operations() if op.type.startswith("Nddebug")]
    fused = [op for op in ours if op.type == "NddebugDigestRecord"]
    recorded = {info.op_name for info in rec.ops.values() if info.graph == graph.name}
    assert {op.get_attr("op_id") for op in fused} <= set(rec.ops)
    assert len(fused) == len(recorded) >= N_OPS
    # besides them, only the function's argument needs a digest op
    assert [op.inputs[-1].op.type for op in ours if op.type == "NddebugDigest"] == ["Placeholder"]
    assert not any(t.op.type == "Const" for op in ours for t in op.inputs)
    # ... and the constants' digests recorded are those of their values
    muls = [e for e in rec.events if rec.ops[e.op_id].op_type == "Mul"]
    assert {tuple(e.inputs[1]) for e in muls} == {digest_numpy(np.float32(1.5))}


def test_fused_op_row_places_static_input_digests_between_dynamic_ones():
    lib = _native_lib()
    a = np.linspace(-1, 1, 9000, dtype=np.float64)
    b = np.arange(7, dtype=np.int8)
    lib.drain()
    lib.set_active(True)
    try:
        din = tf.constant([[11, 12], [13, 14]], tf.int64)
        outs = lib.digest_record(77, [tf.constant(a), tf.constant(b)], [din], [(5, 6)], [1])
        rows = transport.drain()
    finally:
        lib.set_active(False)
    assert [tuple(o.numpy()[0]) for o in outs] == [digest_numpy(a), digest_numpy(b)]
    assert rows == [
        (77, [list(digest_numpy(a)), list(digest_numpy(b))], [[11, 12], [5, 6], [13, 14]])
    ]
    # outside a trace the op reads nothing and appends nothing
    outs = lib.digest_record(78, [tf.constant(a)], [], [(5, 6)], [0])
    assert [tuple(o.numpy()[0]) for o in outs] == [(0, 0)] and lib.drain() == []
    # a static position past the inputs is an error, and leaves no partial row behind
    lib.set_active(True)
    try:
        with pytest.raises(tf.errors.InvalidArgumentError, match="past the inputs"):
            lib.digest_record(79, [tf.constant(b)], [din], [(5, 6)], [3])
        assert lib.drain() == []
    finally:
        lib.set_active(False)


def test_the_split_drain_gives_the_flat_drains_rows():
    # The recorder drains the buffer split in two (headers; digest values), the per-row
    # Python work of a trace; rows of other lengths must come out as the flat drain's.
    lib = _native_lib()
    a = np.linspace(-1, 1, 9000, dtype=np.float64)
    b = np.arange(7, dtype=np.int8)
    din = tf.constant([[11, 12], [13, 14]], tf.int64)

    def emit():
        lib.digest_record(81, [tf.constant(a), tf.constant(b)], [din], [(5, 6)], [1])
        lib.digest_record(82, [tf.constant(b)], [], [], [])
        lib.digest_record(83, [tf.constant(a)], [], [(7, 8)], [0])

    lib.drain()
    lib.set_active(True)
    try:
        emit()
        flat = transport.drain()
        emit()
        ids, outs, ins = transport.drain_columns()
        empty = transport.drain_columns()
    finally:
        lib.set_active(False)
    assert [r[0] for r in flat] == [81, 82, 83]
    split = [
        (i, [list(d) for d in o], [list(d) for d in n])
        for i, o, n in zip(ids, outs, ins, strict=True)
    ]
    assert split == flat
    assert empty == ([], [], [])


def test_the_library_name_is_the_same_wherever_tensorflow_is_installed(monkeypatch):
    # A GPU machine with the same TensorFlow but no headers finds a library built here (in
    # $NDDEBUG_CACHE_DIR): the folder TensorFlow lives in is not part of the name. Another
    # TensorFlow build flag is.
    here = native.library_path()
    include, lib = tf.sysconfig.get_include(), tf.sysconfig.get_lib()
    compile_flags, link_flags = native._flags()

    def elsewhere(flags):
        return [
            f.replace(include, "/opt/x/tensorflow/include").replace(lib, "/opt/x/tensorflow")
            for f in flags
        ]

    monkeypatch.setattr(tf.sysconfig, "get_include", lambda: "/opt/x/tensorflow/include")
    monkeypatch.setattr(tf.sysconfig, "get_lib", lambda: "/opt/x/tensorflow")
    monkeypatch.setattr(native, "_flags", lambda: (elsewhere(compile_flags), elsewhere(link_flags)))
    assert native.library_path() == here
    monkeypatch.setattr(
        native, "_flags", lambda: ([*elsewhere(compile_flags), "-DOTHER_ABI=1"], link_flags)
    )
    assert native.library_path() != here


def test_a_block_adds_few_collectable_objects_per_op_execution_and_leaves_earlier_runs_alone():
    # Each object a block keeps that the cyclic garbage collector tracks brings its next full
    # pass over all of TensorFlow's objects closer (~0.3 s each, every ~20 traced steps of a
    # 1,300-op step when the block copied every op it recorded). An op execution keeps its
    # Event and its two digest lists; the op's static facts are shared with the registry.
    import dataclasses
    import gc

    _native_lib()
    fn = _chain()
    x = tf.constant(np.ones(64, np.float32))
    first, _, _ = _record(fn, x, 1)
    snapshot = {i: dataclasses.asdict(op) for i, op in first.ops.items()}
    gc.collect()
    before = len(gc.get_objects())
    with nddebug.trace() as later:
        for _ in range(4):
            fn(x)
    gc.collect()
    graph_events = sum(1 for e in later.events if later.ops[e.op_id].graph)
    assert graph_events >= 4 * N_OPS
    per_event = (len(gc.get_objects()) - before) / graph_events
    assert per_event < 3.2, per_event
    # The later block changed nothing the earlier run holds (its ops' device, notes, ...).
    assert {i: dataclasses.asdict(op) for i, op in first.ops.items()} == snapshot
    assert all(op.device for op in later.ops.values() if op.graph)


def _movers():
    """A step whose byte movers (ops.BYTE_MOVERS) carry both a value computed in the step
    and, in the second, one drawn without a seed."""

    @tf.function
    def step(x, noise):
        h = tf.tanh(x * 1.5) + noise
        moved = tf.transpose(tf.tile(h, [3, 1]))
        moved = tf.pad(tf.concat([moved, moved * 2.0], 0), [[1, 1], [0, 2]])
        return tf.reduce_sum(tf.sin(moved) * tf.broadcast_to(h[:1, :1], tf.shape(moved)))

    return step


def test_byte_movers_are_compared_through_their_inputs_and_read_no_output():
    _native_lib()
    x = tf.constant(np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8))
    zero = tf.zeros([8, 8])
    step = _movers()
    with nddebug.trace() as rec:
        step(x, zero)
    movers = [e for e in rec.events if rec.ops[e.op_id].op_type in ("Tile", "Transpose", "Pad")]
    assert len(movers) == 3
    for e in movers:
        pairs = np.array([v for pair in e.inputs for v in pair], np.int64)
        assert tuple(e.digests[0]) == digest_numpy(pairs)  # made from its inputs' digests
    # No digest op reads a byte mover's output: the graph reads only its inputs.
    graph = step.get_concrete_function(x, zero).graph
    for op in graph.get_operations():
        if op.type in ("Tile", "Transpose", "ConcatV2", "Pad", "BroadcastTo") and (
            not any(p.split("_")[0] == "nddebug" for p in op.name.split("/"))  # its own
        ):
            readers = {c.type for c in op.outputs[0].consumers()}
            assert not readers & {"NddebugDigest", "NddebugDigestRecord"}, (op.type, readers)


def test_byte_movers_give_the_pure_tf_paths_recording_and_propagate_a_source(monkeypatch):
    _native_lib()
    x = tf.constant(np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8))
    zero = tf.zeros([8, 8])
    with nddebug.trace() as fast:
        _movers()(x, zero)
    monkeypatch.setenv(native.ENV, "0")
    with nddebug.trace() as slow:
        _movers()(x, zero)
    monkeypatch.delenv(native.ENV)

    def by_op(rec):
        return sorted(
            (rec.ops[e.op_id].op_type, e.digests, e.inputs)
            for e in rec.events
            if rec.ops[e.op_id].graph
        )

    assert by_op(fast) == by_op(slow)
    # A source upstream of them: the movers propagate it, and are never named.
    step = _movers()
    report = nddebug.check(lambda: step(x, tf.random.uniform([8, 8])), repeats=3)
    assert not report.ok
    assert set(report.sources["op_type"]) == {"RandomUniform"}
    assert nddebug.check(lambda: step(x, zero), repeats=3).ok
