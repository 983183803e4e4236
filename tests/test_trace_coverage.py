"""What trace() sees: eager ops, tf.function graphs with control flow and gradients,
optimizer updates, Keras fit; and functions traced before the block are reported."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import nddebug
from nddebug.examples import mnist_cnn


def test_while_loop_and_cond_bodies_are_recorded_per_iteration() -> None:
    @tf.function
    def f(x):
        def body(i, acc):
            acc = tf.cond(i % 2 == 0, lambda: acc * 1.5, lambda: acc - 0.5)
            return i + 1, acc

        return tf.while_loop(lambda i, _: i < 6, body, [tf.constant(0), x])[1]

    with nddebug.trace() as rec:
        f(tf.ones([4]))
    by_type: dict[str, int] = {}
    for ev in rec.events:
        t = rec.ops[ev.op_id].op_type
        by_type[t] = by_type.get(t, 0) + 1
    assert by_type.get("Mul", 0) == 3 and by_type.get("Sub", 0) == 3, by_type
    graphs = {rec.ops[ev.op_id].graph for ev in rec.events}
    assert any("cond_true" in g for g in graphs) and any("while_body" in g for g in graphs)


def test_gradients_and_optimizer_updates_are_recorded() -> None:
    w = tf.Variable(tf.ones([3, 2]))
    opt = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w) ** 2)
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        return loss

    with nddebug.trace() as rec:
        step(tf.ones([4, 3]))
    ops = list(rec.ops.values())
    assert any(op.op_type == "MatMul" and "gradient_tape" in op.op_name for op in ops)
    updates = [op for op in ops if op.note == "value of the variable after this update"]
    assert updates, [op.op_type for op in ops]


def test_keras_fit_is_recorded_including_the_input_pipeline() -> None:
    model = mnist_cnn.make_model(0)
    x, y = mnist_cnn.make_data(64)
    with nddebug.trace() as rec:
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    types = {rec.ops[ev.op_id].op_type for ev in rec.events}
    assert {"IteratorGetNext", "Conv2DBackpropFilter", "BiasAddGrad"} <= types, types


def test_a_function_traced_before_the_block_is_reported_not_silently_missed() -> None:
    @tf.function
    def g(x):
        return tf.nn.softmax(x * 3.0)

    g(tf.ones([5]))  # traced outside any trace() block
    with nddebug.trace() as rec:
        g(tf.ones([5]))
    assert any("traced before nddebug.trace()" in w for w in rec.warnings), rec.warnings
    assert not any(rec.ops[ev.op_id].op_type == "Softmax" for ev in rec.events)

    # check() retraces it, so its inner ops are covered.
    report = nddebug.check(g, tf.ones([5]), repeats=2)
    assert report.ok
    assert any(op.op_type == "Softmax" for op in report.recordings[0].ops.values())
    assert not any("traced before" in w for w in report.warnings)


def test_eager_ops_have_user_locations_and_input_digests() -> None:
    x = tf.constant(np.arange(6, dtype=np.float32))
    with nddebug.trace() as rec:
        y = tf.square(x)
    (ev,) = [e for e in rec.events if rec.ops[e.op_id].op_type == "Square"]
    op = rec.ops[ev.op_id]
    assert "test_trace_coverage.py" in op.location
    from nddebug.digest import digest_numpy
    from nddebug.tracer.eager import input_form

    # Its input's digest, then its inputs' shapes and its attributes (the same bytes in
    # another shape, or another attribute, are other inputs).
    assert ev.inputs == [digest_numpy(x.numpy()), input_form([x], ("T", 1))]
    assert ev.inputs[-1] != input_form([tf.reshape(x, [2, 3])], ("T", 1))
    assert ev.inputs[-1] != input_form([x], ("T", 2))
    assert ev.digests == [digest_numpy(y.numpy())]


def test_an_xla_function_is_not_broken_and_is_reported() -> None:
    @tf.function(jit_compile=True)
    def h(x):
        return tf.reduce_sum(tf.tanh(x) * 2.0)

    with nddebug.trace() as rec:
        value = h(tf.ones([8]))
    assert value.numpy().tobytes() == h(tf.ones([8])).numpy().tobytes()
    assert any("XLA" in w for w in rec.warnings), rec.warnings
    # The call itself is still compared through its inputs and outputs.
    assert any(rec.ops[ev.op_id].function for ev in rec.events)
    # check() checks the step as compiled; reproducible there, it need not look inside.
    report = nddebug.check(h, tf.ones([8]), repeats=2)
    assert report.ok and report.program == "as compiled (XLA)", str(report)
    assert not any(op.op_type == "Tanh" for op in report.recordings[0].ops.values())
    # Retraced without XLA, its inner ops are recorded: Tanh on its own, or (where grappler
    # may fuse it with its consumer, as with oneDNN on) as a member of the consumer's record.
    report = nddebug.check(tf.function(h.python_function), tf.ones([8]), repeats=2)
    ops = report.recordings[0].ops.values()
    recorded = {t for op in ops for t in [op.op_type, *op.fused.values()]}
    assert report.ok and "Tanh" in recorded, recorded


def test_the_gradient_of_an_xla_function_is_not_instrumented() -> None:
    """TensorFlow builds the backward graph of an XLA function's call outside the function's
    XLA context and compiles it with XLA too: nddebug's ops in it made the step fail to
    compile (Keras 3's ConvNeXt, whose grouped convolutions are jit-compiled). It is left
    alone, as the function is, and the step computes the plain bits."""

    def make():
        v = tf.Variable(tf.linspace(0.5, 1.5, 8))

        @tf.function(jit_compile=True)
        def f(x):
            return tf.sin(x) * x

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                y = tf.reduce_sum(f(v * 2.0))
            v.assign_sub(0.1 * tape.gradient(y, v))
            return y

        return step, v

    step, v = make()
    step()
    plain = v.numpy().tobytes()
    step, v = make()
    with nddebug.trace() as rec:
        step()
    assert v.numpy().tobytes() == plain
    assert any("XLA" in w for w in rec.warnings), rec.warnings
    assert any(rec.ops[e.op_id].op_type == "AssignSubVariableOp" for e in rec.events)


def test_plain_assignments_record_the_written_value_eagerly_and_in_graphs() -> None:
    v = tf.Variable(tf.zeros([3, 4]))
    new = tf.reshape(tf.range(12, dtype=tf.float32), [3, 4])

    @tf.function
    def assign_in_graph(x):
        v.assign(x * 2.0)

    with nddebug.trace() as rec:
        v.assign(new)  # eager AssignVariableOp
        assign_in_graph(new)
    assert not any("could not be recorded" in w for w in rec.warnings), rec.warnings
    from nddebug.digest import digest_numpy

    written = [
        ev.digests[0]
        for ev in rec.events
        if rec.ops[ev.op_id].op_type == "AssignVariableOp"
        and rec.ops[ev.op_id].note == "value of the variable after this update"
    ]
    assert written == [digest_numpy(new.numpy()), digest_numpy(new.numpy() * 2.0)]


def test_a_random_op_inside_vectorized_map_is_the_source() -> None:
    """pfor makes the vectorized ops without op callbacks: the unseeded dropout's random op
    ran unrecorded, and the SelectV2 that read it was blamed as if its input came from
    outside TensorFlow."""
    w = tf.Variable(tf.random.stateless_normal([4, 4], seed=[1, 2]))

    @tf.function
    def step(x):
        return tf.reduce_sum(
            tf.vectorized_map(lambda r: tf.nn.dropout(tf.linalg.matvec(w, r), 0.5), x)
        )

    x = tf.random.stateless_normal([3, 4], seed=[3, 4])
    report = nddebug.check(step, x, repeats=3, state=[w])
    assert not report.ok
    sources = report.sources
    assert list(sources["op_type"]) == ["RandomUniform"], report
    assert set(sources["kind"]) == {"random"}, report
    assert "test_trace_coverage.py" in sources["location"].iloc[0]


def test_an_xla_function_called_inside_a_step_is_said_once_as_xla() -> None:
    """Keras's grouped convolution (ConvNeXt) is a jit-compiled function called inside the
    train step, through a call op TensorFlow adds without op callbacks. Caught up, each call
    was also said to be "traced before nddebug.trace()" (72 warnings on ConvNeXtTiny)."""
    w = tf.Variable(tf.random.stateless_normal([8, 8], seed=[1, 1]))

    @tf.function(jit_compile=True)
    def inner(x):
        return tf.tanh(x @ w)

    @tf.function
    def step(x):
        return tf.reduce_sum(inner(inner(x)))

    x = tf.random.stateless_normal([4, 8], seed=[2, 2])
    with nddebug.trace() as rec:
        step(x)
    assert any("XLA" in w for w in rec.warnings), rec.warnings
    assert not any("its inner ops are not recorded" in w for w in rec.warnings), rec.warnings
    assert any(op.op_type == "StatefulPartitionedCall" for op in rec.ops.values())


def test_a_nested_function_read_by_cond_and_while_loop_runs_as_plain() -> None:
    """A nested tf.function's call op is made without op callbacks and caught up when the
    If / While that reads it is made: its record was ordered after that stateful op by
    automatic control dependencies while the op waited for the record, and the traced
    function failed with "nodes in a cycle"."""
    w = tf.Variable(tf.random.stateless_normal([4, 4], seed=[5, 6]))

    def make():  # a fresh step: one called before the block would run uninstrumented
        @tf.function
        def inner(h):
            return tf.nn.silu(h @ w)

        @tf.function
        def step(x, k):
            with tf.GradientTape() as tape:
                h = inner(x)
                y = tf.cond(k > 0, lambda: h * 2.0, lambda: h)
                _, z = tf.while_loop(lambda i, a: i < k, lambda i, a: (i + 1, a + h), (0, y))
                loss = tf.reduce_sum(z**2)
            return loss, tape.gradient(loss, w)

        return step

    x = tf.random.stateless_normal([2, 4], seed=[7, 8])
    k = tf.constant(3)
    plain = [t.numpy() for t in make()(x, k)]
    with nddebug.trace() as rec:
        traced = [t.numpy() for t in make()(x, k)]
    for a, b in zip(plain, traced, strict=True):
        assert a.tobytes() == b.tobytes()
    # Built as in the plain program: a StatelessIf and a StatelessWhile (see
    # instrument.hook_statefulness); the call reads a variable, so it is stateful either way.
    types = {op.op_type for op in rec.ops.values()}
    assert {"StatefulPartitionedCall", "StatelessIf", "StatelessWhile"} <= types, types
    assert not rec.warnings, rec.warnings
    report = nddebug.check(make(), x, k, repeats=2, state=[w])
    assert report.ok, str(report)


def test_a_function_named_like_an_xla_one_has_its_gradient_recorded() -> None:
    """Whether a backward graph belongs to an XLA function was told by the forward's name:
    after a jit-compiled `inner`, another function called `inner` had its gradient left
    unrecorded and said to be "traced before nddebug.trace()"."""
    w = tf.Variable(tf.random.stateless_normal([4, 4], seed=[16, 17]))
    x = tf.random.stateless_normal([2, 4], seed=[18, 19])

    def make(jit: bool):
        @tf.function(jit_compile=jit)
        def inner(h):
            return tf.tanh(h @ w)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(inner(x) ** 2)
            return tape.gradient(loss, w)

        return step

    with nddebug.trace():
        make(jit=True)()
    with nddebug.trace() as rec:
        make(jit=False)()
    assert not rec.warnings, rec.warnings
    graphs = {op.graph for op in rec.ops.values()}
    assert any(g.startswith("__backward_inner") for g in graphs), graphs


def test_the_location_read_from_the_live_stack_is_the_tracebacks(monkeypatch) -> None:
    """An op's location is read from the live stack while it is made (location.
    creation_location); TensorFlow's own traceback of the op must give the same line and the
    same layer scope, on a Keras model called from a step (layers: the scope), an LSTM (a
    while loop and its gradient) and an autograph loop with a branch."""
    import keras

    from nddebug.tracer import instrument, location

    compared: list[tuple[str, str, str]] = []
    live = location.creation_location

    def both(op, frame, lib_dirs):
        where = live(op, frame, lib_dirs)
        compared.append((op.name, where, location.graph_location(op, lib_dirs)))
        return where

    monkeypatch.setattr(instrument, "creation_location", both)
    model = keras.Sequential([keras.Input((5, 3)), keras.layers.LSTM(4), keras.layers.Dense(2)])
    opt = keras.optimizers.Adam()
    v = tf.Variable(tf.ones([2]))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
            for _ in tf.range(2):
                if loss > 0:
                    loss += tf.reduce_sum(v)
        grads = tape.gradient(loss, [*model.trainable_variables, v])
        opt.apply_gradients(zip(grads, [*model.trainable_variables, v], strict=True))
        return loss

    with nddebug.trace():
        step(tf.ones([2, 5, 3]))
    assert len(compared) > 200
    assert [c for c in compared if c[1] != c[2]] == []
    here = [c for c in compared if "test_trace_coverage.py" in c[1]]
    assert any(" in sequential" in where for _, where, _ in here), here[:5]  # a layer's scope
