"""Outside trace(), an instrumented function runs its plain twin (nddebug.tracer.plain): the
same FunctionDef without nddebug's ops, so a function debugged once costs what it did before.
Inside a block the instrumented function runs again and records as before.

What the twin computes (bitwise equal to the plain function) is held by
test_transparency.py's "changed after trace()" check, which now runs the twins; these tests
show that the twins are what runs, that they hold none of nddebug's ops, and where no twin
can be made.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug import emulate
from nddebug.tracer import plain
from nddebug.tracer.registry import REGISTRY
from tests.helpers import on_cpu


def _function_defs(name: str) -> list[Any]:
    """``name``'s FunctionDef and those of every function it names (branches, bodies, calls)."""
    from tensorflow.python.eager import context

    ctx = context.context()
    seen: dict[str, Any] = {}
    todo = [name]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen[n] = fdef = ctx.get_function_def(n)
        for node in fdef.node_def:
            for value in node.attr.values():
                if value.HasField("func"):
                    todo.append(value.func.name)
                elif value.HasField("list"):
                    todo += [f.name for f in value.list.func]
    return list(seen.values())


def _op_types(name: str) -> set[str]:
    return {node.op for fdef in _function_defs(name) for node in fdef.node_def}


def _loop_step() -> tuple[Any, Any, tf.Variable]:
    w = tf.Variable(tf.linspace(0.5, 1.5, 64), name="w")

    @tf.function
    def step(x: Any) -> Any:
        with tf.GradientTape() as tape:
            h = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(h * w)), (0, x))[1]
            h = tf.cond(tf.reduce_sum(h) > 0, lambda: h * 2.0, lambda: h - 1.0)
            loss = tf.reduce_sum(h * h)
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    return step, tf.linspace(-1.0, 1.0, 64), w


def test_outside_trace_the_twin_runs_and_holds_none_of_nddebugs_ops() -> None:
    with on_cpu():
        step, x, _ = _loop_step()
        with nddebug.trace() as first:
            step(x)
        name = step.get_concrete_function(x).name.decode()
        assert name in REGISTRY.instrumented_functions
        assert any(t.startswith("Nddebug") for t in _op_types(name))

        before = plain.twins()
        step(x)  # no block: the twin
        made = {k: v for k, v in plain.twins().items() if k not in before}
        twin = made.get(name)
        assert twin is not None, made
        assert all(v is not None for v in made.values()), made  # branches and bodies too
        types = _op_types(twin)
        assert {"While", "StatelessWhile"} & types or {"If", "StatelessIf"} & types
        assert not {t for t in types if t.startswith("Nddebug")}, types
        scoped = [n.name for f in _function_defs(twin) for n in f.node_def if "nddebug/" in n.name]
        assert not scoped, scoped  # a sum's wait for its records included (sums read terms)
        assert any(
            "nddebug/" in n.name and n.op == "Identity"
            for f in _function_defs(name)
            for n in f.node_def
        )
        nested = {
            value.func.name
            for fdef in _function_defs(twin)
            for node in fdef.node_def
            for value in node.attr.values()
            if value.HasField("func")
        }
        assert nested and all(n.endswith(plain.SUFFIX) for n in nested), nested

        # Back in a block, the instrumented function runs and records as it did.
        with nddebug.trace() as again:
            step(x)
        assert len(again.events) == len(first.events) > 0
        assert not again.warnings, again.warnings


def test_the_twin_computes_the_plain_bits_after_an_emulated_block() -> None:
    # The emulation switch is read by the user's (emulated) ops: the twin keeps it, and with
    # no emulate_gpu() block open the step computes what the plain step does.
    data = tf.constant(np.random.default_rng(0).normal(size=(20000, 8)).astype(np.float32))
    ids = tf.constant(np.random.default_rng(1).integers(0, 16, 20000).astype(np.int32))

    def make() -> Any:
        @tf.function
        def step(d: Any, i: Any) -> Any:
            return tf.math.unsorted_segment_sum(d * 1.5, i, 16)

        return step

    with on_cpu():
        expected = make()(data, ids).numpy()
        step = make()
        with nddebug.trace(emulate_gpu=True):
            step(data, ids)
        assert not emulate.is_active()
        before = plain.twins()
        got = [step(data, ids).numpy() for _ in range(3)]
        made = {k: v for k, v in plain.twins().items() if k not in before}
    assert made and all(v is not None for v in made.values()), made
    for g in got:
        assert g.tobytes() == expected.tobytes()


def test_no_twin_where_a_users_op_reads_a_value_of_nddebugs() -> None:
    with on_cpu():
        step, x, _ = _loop_step()
        with nddebug.trace():
            step(x)
        from tensorflow.python.eager import context

        fdef = context.context().get_function_def(step.get_concrete_function(x).name.decode())
    stripped = plain.strip(fdef)
    assert stripped is not None
    assert not any(n.op.startswith("Nddebug") for n in stripped.node_def)
    # Make a user op read a record's digests: taking nddebug's ops out would cut that edge.
    broken = type(fdef)()
    broken.CopyFrom(fdef)
    record = next(n for n in broken.node_def if n.op == "NddebugDigestRecord")
    user = next(
        n for n in broken.node_def if n.op in ("Tanh", "Mul") and "nddebug" not in n.name.split("/")
    )
    user.input.append(f"{record.name}:digests:0")
    assert plain.strip(broken) is None
    # A returned value of nddebug's: no twin either.
    returned = type(fdef)()
    returned.CopyFrom(fdef)
    key = next(iter(returned.ret))
    returned.ret[key] = f"{record.name}:digests:0"
    assert plain.strip(returned) is None


@pytest.mark.parametrize("native", ["1", "0"])
def test_twins_on_both_paths(native: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The pure-TF path's digests and host callbacks go as the native path's records do.
    monkeypatch.setenv("NDDEBUG_NATIVE", native)
    with on_cpu():
        step, x, w = _loop_step()
        plain_step, plain_x, plain_w = _loop_step()
        expected = [plain_step(plain_x).numpy() for _ in range(2)] + [plain_w.numpy()]
        with nddebug.trace() as rec:
            step(x)
        assert rec.events
        w.assign(tf.linspace(0.5, 1.5, 64))
        before = plain.twins()
        got = [step(x).numpy() for _ in range(2)] + [w.numpy()]
        made = {k: v for k, v in plain.twins().items() if k not in before}
    assert made and all(v is not None for v in made.values()), made
    twin = made[step.get_concrete_function(x).name.decode()]
    assert not {t for t in _op_types(twin) if t.startswith("Nddebug") or t == "EagerPyFunc"}
    assert [g.tobytes() for g in got] == [e.tobytes() for e in expected]


def test_no_twin_for_ops_whose_kernels_keep_state_and_the_draws_go_on() -> None:
    # Legacy random ops draw from a generator their kernel instance holds: a twin (another
    # FunctionDef, other kernels) started the stream again, and every later step of the run
    # differed from the plain program's.
    def run(traced: bool) -> list[bytes]:
        tf.random.set_seed(7)

        @tf.function
        def draw(x: Any) -> Any:
            u = tf.random.uniform([64], seed=3)
            return tf.nn.dropout(x * u, rate=0.5, seed=5) + tf.random.shuffle(u, seed=9)

        x = tf.ones([64])
        out = []
        for i in range(4):
            if traced and i in (0, 2):
                with nddebug.trace():
                    out.append(draw(x).numpy().tobytes())
            else:
                out.append(draw(x).numpy().tobytes())
        if traced:
            name = draw.get_concrete_function(x).name.decode()
            assert name in plain.twins() and plain.twins()[name] is None
        return out

    with on_cpu():
        expected = run(traced=False)
        assert len(set(expected)) == 4  # each step draws anew
        assert run(traced=True) == expected


def test_a_users_callback_in_a_scope_called_nddebug_still_runs() -> None:
    calls: list[float] = []

    def log(x: Any) -> Any:
        calls.append(float(x))
        return x

    @tf.function
    def f(x: Any) -> Any:
        with tf.name_scope("nddebug"):
            tf.py_function(log, [x], tf.float32)  # for its side effect alone
        return x * 2

    with on_cpu():
        with nddebug.trace():
            f(tf.constant(1.0))
        f(tf.constant(2.0))
        f(tf.constant(3.0))
    assert calls == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("emulate", [False, True])
def test_a_savedmodel_written_inside_a_block_loads_without_nddebug(
    emulate: bool, tmp_path: Any
) -> None:
    # `nddebug run --all` puts a whole script in a block, its model export too: the SavedModel
    # held nddebug's ops ("Op type not registered 'NddebugDigestRecord'" where it was loaded).
    # Under emulate_gpu() the function also reads the emulation switch: read as off.
    from tests.helpers import run_python

    class Model(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(tf.linspace(0.5, 1.5, 8))

        @tf.function(input_signature=[tf.TensorSpec([8], tf.float32), tf.TensorSpec([8], tf.int32)])
        def predict(self, x: Any, ids: Any) -> Any:
            h = tf.math.unsorted_segment_sum(tf.tanh(x * self.w), ids, 4)
            return tf.cond(tf.reduce_sum(h) > 0, lambda: h * 2.0, lambda: h - 1.0)

    x, ids = tf.linspace(-1.0, 1.0, 8), tf.constant([0, 1, 2, 3, 0, 1, 2, 3])
    with on_cpu():
        reference = Model()  # held: a tf.function method holds its instance weakly
        expected = reference.predict(x, ids).numpy()
        model = Model()
        with nddebug.trace(emulate_gpu=emulate) as rec:
            model.predict(x, ids)
            tf.saved_model.save(model, str(tmp_path / "model"))
    assert rec.events
    saved = (tmp_path / "model" / "saved_model.pb").read_bytes()
    assert b"Nddebug" not in saved
    out = run_python(
        f"""
        import json, sys
        import tensorflow as tf
        m = tf.saved_model.load({str(tmp_path / "model")!r})
        got = m.predict(tf.linspace(-1.0, 1.0, 8), tf.constant([0, 1, 2, 3, 0, 1, 2, 3]))
        print(json.dumps({{"got": got.numpy().tolist(), "nddebug": "nddebug" in sys.modules}}))
        """,
        env={"CUDA_VISIBLE_DEVICES": "-1"},
    )
    assert not out["nddebug"]
    assert np.array_equal(np.asarray(out["got"], np.float32), expected)


def test_a_twin_goes_when_its_function_goes() -> None:
    """A twin is registered with the context beside the function it stands for; when
    TensorFlow removes that function (its last ConcreteFunction freed), the twin goes too.
    It stayed: a step rebuilt again and again kept every twin and its kernels."""
    import gc

    from tensorflow.python.eager import context

    def build() -> tuple[Any, str]:
        v = tf.Variable(tf.ones([8]))

        @tf.function
        def step():
            v.assign(v * 1.5 + 0.25)
            return tf.reduce_sum(v)

        with nddebug.trace():
            step()
        step()  # no block: its twin runs
        name = step.get_concrete_function().name.decode()
        return step, name

    step, name = build()
    twin = plain.twins().get(name)
    assert twin is not None and twin != name, plain.twins().get(name)
    assert context.context().has_function(twin)
    del step
    gc.collect()
    assert not context.context().has_function(name)  # TensorFlow freed the function
    assert not context.context().has_function(twin), "the twin outlived its function"
    assert name not in plain.twins()


def test_an_instrumented_graph_is_freed_with_its_function() -> None:
    """nddebug's per-graph memo (digest tensors of the graph) sat in a WeakKeyDictionary whose
    values held their key alive: no instrumented graph was ever freed, nor the functions its
    ops keep registered. A Keras fit with DeterminismCheck kept one train function per check
    (24 checks: 52 -> 74 functions registered; probe round 31, F6)."""
    import gc
    import weakref

    @tf.function
    def f(x):
        return tf.reduce_sum(x * 2.0)

    with nddebug.trace():
        f(tf.ones([4]))
    graph = weakref.ref(f.get_concrete_function(tf.ones([4])).graph)
    del f
    gc.collect()
    assert graph() is None


def test_a_graph_tensorflow_keeps_does_not_keep_the_block_s_recording() -> None:
    """TensorFlow keeps the graph of a function that applies a Keras optimizer's gradients for
    the life of the process, plain or traced. A record nddebug left pending in such a graph
    (an intermediate grappler may fuse with its reader, never read by another op) held the
    block's recorder in its closure, and with it the block's whole recording: a DeterminismCheck
    kept every check's events."""
    import gc
    import weakref

    import keras

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    optimizer = keras.optimizers.Adam()
    x = tf.ones([16, 8])

    @tf.function
    def step(a):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(a) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    with nddebug.trace() as recording:
        step(x)
    assert recording.events
    graph = weakref.ref(step.get_concrete_function(x).graph)
    kept = weakref.ref(recording)
    del recording, step
    gc.collect()
    assert graph() is not None, "premise: TensorFlow keeps this graph (Keras's optimizer)"
    assert kept() is None, "the graph kept the block's recording alive"
