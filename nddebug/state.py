"""Snapshot and restore the state a training step changes, so repeats start identical."""

from __future__ import annotations

import contextlib
import gc
import random
from collections.abc import Iterator
from typing import Any

import numpy as np


def _tf_variable(v: Any) -> Any:
    """The tf.Variable behind a Keras 3 variable (which compares by value, not identity)."""
    import tensorflow as tf

    if isinstance(v, tf.Variable):
        return v
    inner = getattr(v, "value", None)
    if isinstance(inner, tf.Variable):
        return inner
    return None


def _mutable_table(obj: Any) -> bool:
    """A lookup table the step can change (tf.lookup.experimental.MutableHashTable,
    DenseHashTable): its contents are state, exported and re-imported like a variable's
    value. Static tables are fixed once initialized."""
    return all(callable(getattr(obj, m, None)) for m in ("export", "insert", "remove"))


def collect_variables(state: Any) -> list[Any]:
    """The tf.Variables of ``state`` (see :func:`collect_state`)."""
    return collect_state(state)[0]


def collect_state(state: Any) -> tuple[list[Any], list[Any]]:
    """Every tf.Variable reachable from ``state``: Keras models (weights, seed generators,
    compiled optimizer and metrics), optimizers, layers, tf.Modules, tf.random.Generators,
    variables, tf.train.Checkpoint and other trackable objects, and lists, tuples, sets and
    dicts of any of these.

    Returns them, and the mutable lookup tables among them or held by them.

    Anything else raises TypeError before the step runs: state that check() silently could not
    restore would make every repeat start from another value (a deterministic step reported
    NOT reproducible, the variables advanced once per repeat)."""
    import tensorflow as tf

    found: dict[int, Any] = {}
    tables: dict[int, Any] = {}

    def add(v: Any) -> None:
        tv = _tf_variable(v)
        if tv is not None:
            found.setdefault(id(tv), tv)
        elif _mutable_table(v):
            tables.setdefault(id(v), v)

    walked: set[int] = set()

    def walk(obj: Any, where: str) -> None:
        if obj is None or id(obj) in walked:
            return
        walked.add(id(obj))
        if isinstance(obj, dict):
            for k, o in obj.items():
                walk(o, f"{where}[{k!r}]")
            return
        if isinstance(obj, (list, tuple, set)):
            for i, o in enumerate(obj):
                walk(o, f"{where}[{i}]")
            return
        if _tf_variable(obj) is not None or _mutable_table(obj):
            add(obj)
            return
        if is_iterator(obj):
            raise TypeError(
                f"state{where} is a tf.data iterator ({type(obj).__name__}): check() cannot "
                "rewind it between repeats, so each repeat would get other batches. Take the "
                "batch first (x, y = next(iterator)) and pass it to the step as arguments."
            )
        accepted = False
        for attr in ("variables", "metrics_variables"):
            values = getattr(obj, attr, None)
            if values is None or isinstance(values, (str, bytes)):
                continue
            accepted = True
            for v in values() if callable(values) else values:
                add(v)
        if _is_keras_model(obj):
            walk(getattr(obj, "optimizer", None), f"{where}.optimizer")
        state_var = getattr(obj, "state", None)  # tf.random.Generator, keras SeedGenerator
        if state_var is not None and _tf_variable(state_var) is not None:
            accepted = True
            add(state_var)
        if isinstance(obj, tf.__internal__.tracking.Trackable):
            accepted = True  # a tf.train.Checkpoint and what it tracks
            for child in tf.train.TrackableView(obj).descendants():
                add(child)
                if _is_keras_model(child) or _is_keras_optimizer(child):
                    # What a checkpoint tracks of a Keras 3 model leaves out its layers'
                    # seed generators (a Dropout's): they were not restored, the step was
                    # "NOT reproducible" and check() left other weights than one step.
                    walk(child, f"{where} > {type(child).__name__}")
        if not accepted:
            raise TypeError(
                f"state{where} is a {type(obj).__name__}, which holds no TensorFlow variables "
                "that check() could restore between repeats. Pass the model, optimizer, "
                "variables, a tf.train.Checkpoint, or a list/tuple/dict of them."
            )

    walk(state, "")
    return list(found.values()), list(tables.values())


def is_iterator(obj: Any) -> bool:
    try:
        from tensorflow.python.data.ops import iterator_ops
    except ImportError:  # pragma: no cover - layout of other TF versions
        return False
    return isinstance(obj, (iterator_ops.OwnedIterator, iterator_ops.IteratorBase))


def _is_keras_model(obj: Any) -> bool:
    return hasattr(obj, "train_on_batch") and hasattr(obj, "compile")


def _is_keras_optimizer(obj: Any) -> bool:
    return hasattr(obj, "apply_gradients") and hasattr(obj, "variables")


def keras_models(state: Any) -> list[Any]:
    if isinstance(state, dict):
        return keras_models(list(state.values()))
    if isinstance(state, (list, tuple, set)):
        return [m for s in state for m in keras_models(s)]
    return [state] if _is_keras_model(state) else []


Snapshot = dict[int, tuple[Any, np.ndarray]]


def fresh_copy(value: np.ndarray) -> np.ndarray:
    """A copy of a kept value to assign from, sharing memory with nothing nddebug keeps: a
    variable assigned from memory that something else still holds (a snapshot, a numpy view of
    a read) is updated by copying it on write, and TensorFlow 2.21's StatefulRandomBinomial
    then draws without moving its generator's state on (eager; measured in probe round 34: the
    steps after a check drew the same noise again in 5 of 8 processes)."""
    return np.array(value, copy=True)


class StateKeeper:
    """Remembers variable values, including those of variables created while it watches."""

    def __init__(self, state: Any) -> None:
        self.variables, self.tables = collect_state(state)
        self.initial: Snapshot = {}  # variables created while watching, at creation
        self.unreadable: list[str] = []  # created, but their initial value could not be read
        # Variables created while a function was traced, read when the function is about to
        # run (see settle), keyed by id, with their initial_value argument.
        self.pending: dict[int, tuple[Any, Any]] = {}
        # Tables whose contents were put back but not the order they export them in, and
        # how many of them check() has said so of.
        self.reordered: list[Any] = []
        self.reordered_said = 0

    def also(self, extra: Any) -> None:
        """Keep ``extra``'s variables too (state the step changes that the user did not
        name; None: nothing)."""
        held = {id(v) for v in self.variables}
        self.variables += [v for v in collect_variables(extra) if id(v) not in held]

    def snapshot(self) -> Snapshot:
        snap: Snapshot = {id(v): (v, v.numpy()) for v in self.variables}
        snap.update({id(t): (t, _live_contents(t)) for t in self.tables})
        return snap

    def restore(self, snap: Snapshot) -> None:
        for var, value in self._merged(snap):
            if _mutable_table(var):
                restored_order = _set_table_contents(var, value)
                if not restored_order and all(t is not var for t in self.reordered):
                    self.reordered.append(var)
            else:
                var.assign(fresh_copy(value))

    def table_states(self) -> list[Any]:
        """The tables' contents after the step, as values check() compares like variables'."""
        return [TableState(t, part) for t in self.tables for part in ("keys", "values")]

    def _merged(self, snap: Snapshot) -> list[tuple[Any, np.ndarray]]:
        merged = dict(self.initial)
        merged.update(snap)
        return list(merged.values())

    @contextlib.contextmanager
    def watch_creation(self) -> Iterator[None]:
        """Record the initial value of every variable created inside (e.g. optimizer slots
        built on the first step), so later repeats can start from it."""
        import tensorflow as tf

        def creator(next_creator: Any, **kwargs: Any) -> Any:
            traced = tf.inside_function()
            v = next_creator(**kwargs)
            tv = _tf_variable(v)
            if tv is None or id(tv) in self.initial or id(tv) in self.pending:
                return v
            if tv.name == "nddebug_active:0":
                return v
            if traced:
                # Made while a function is traced (an optimizer's slots, a layer built on its
                # first call, a tf.Variable a tf.function makes on its first call): its value
                # is what the function finds when it runs, after TensorFlow initialized it
                # and a checkpoint's deferred restore filled it (settle). Its initializer,
                # called again here, gave the slots' zeros instead of the restored moments
                # (probe round 47, F8) and drew a random initial value anew (F10).
                self.pending[id(tv)] = (tv, kwargs.get("initial_value"))
            else:
                self._add(tv, _initial_value(tv, kwargs.get("initial_value")))
            return v

        with tf.variable_creator_scope(creator):
            try:
                yield
            finally:
                self.close_pending()

    def _add(self, tv: Any, value: np.ndarray | None) -> None:
        if value is None:
            self.unreadable.append(getattr(tv, "name", "?"))
        else:
            self.initial[id(tv)] = (tv, value)
            self.variables.append(tv)

    def settle(self) -> None:
        """A function is about to run: read the variables made while it (or another) was
        traced that TensorFlow has initialized by now. One not initialized yet is read at a
        later call (TensorFlow's ``initialize_variables`` function runs before the step's)."""
        if not self.pending:
            return
        from tensorflow.python.ops import gen_resource_variable_ops as gen

        from nddebug.tracer.registry import inside_nddebug

        for key, (tv, _) in list(self.pending.items()):
            try:
                with inside_nddebug():  # nddebug's reads: not the step's ops
                    if not bool(gen.var_is_initialized_op(tv.handle)):
                        continue
                    value = tv.numpy()
            except Exception:  # noqa: BLE001 - left to close_pending
                continue
            del self.pending[key]
            self._add(tv, np.array(value, copy=True))

    def close_pending(self) -> None:
        """The run is over: a variable made while tracing that no call found initialized is
        read from its initial value, as a last resort."""
        for tv, initial in self.pending.values():
            self._add(tv, _initial_value(tv, initial))
        self.pending.clear()


def _live_contents(table: Any) -> tuple[np.ndarray, np.ndarray]:
    """A table's keys and values in the order it exports them (its buckets'), without a
    DenseHashTable's empty and deleted buckets."""
    keys, values = (t.numpy() for t in table.export())
    unused = [getattr(table, a, None) for a in ("_empty_key", "_deleted_key")]
    keep = np.ones(len(keys), bool)
    for k in unused:
        if k is not None:
            k = np.asarray(k.numpy() if hasattr(k, "numpy") else k)
            if k.dtype.kind == "U":  # a string table's keys export as bytes; given as str
                k = np.asarray(np.char.encode(k, "utf-8"), dtype=object)
            keep &= ~np.all((keys == k).reshape(len(keys), -1), axis=1)
    return keys[keep], values[keep]


def _table_contents(table: Any) -> tuple[np.ndarray, np.ndarray]:
    """A table's keys and values, sorted by key (a hash table exports in bucket order): its
    contents, as compared."""
    keys, values = _live_contents(table)
    order = np.argsort(keys.reshape(len(keys), -1)[:, 0], kind="stable") if len(keys) else []
    return keys[order], values[order]


def _set_table_contents(table: Any, contents: tuple[np.ndarray, np.ndarray]) -> bool:
    """Put back a table's contents as :func:`_live_contents` read them, and whether its
    export order is back too. A step that reads ``table.export()`` computes with that order:
    restored sorted by key, the table handed the steps after check() its keys in another
    order (probe round 35, finding 5). A hash table orders its keys by bucket and, within a
    bucket, newest first: emptied and refilled in reverse export order it exports in the same
    order again, unless the step grew it (more buckets, which emptying does not undo)."""
    keys, values = contents
    now_keys, now_values = _live_contents(table)
    if _same(now_keys, keys) and _same(now_values, values):
        return True  # unchanged (a table the step only reads): nothing to write
    for reverse in (True, False):
        current, _ = _live_contents(table)
        if len(current):
            table.remove(current)
        try:
            if len(keys):
                if reverse:
                    table.insert(keys[::-1].copy(), values[::-1].copy())
                else:
                    table.insert(keys, values)
        except BaseException:
            with contextlib.suppress(Exception):  # never leave the user's table empty
                table.insert(keys, values)
            raise
        again, _ = _live_contents(table)
        if np.array_equal(again, keys):
            return True
    return False


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two exported arrays are equal in shape, order and bytes (strings by value)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "OSU":
        return bool(np.array_equal(a, b))
    return a.tobytes() == b.tobytes()


class TableState:
    """One part (keys or values) of a mutable table's sorted contents, read like a variable."""

    def __init__(self, table: Any, part: str) -> None:
        self.table, self.part = table, part
        name = getattr(table, "name", None) or getattr(table, "_name", None) or "table"
        self.name = f"{name}:{part}"

    def read_value(self) -> Any:
        import tensorflow as tf

        keys, values = _table_contents(self.table)
        return tf.constant(keys if self.part == "keys" else values)


def _initial_value(var: Any, initial: Any) -> np.ndarray | None:
    """The value a new variable starts from. Variables created while a tf.function is first
    traced (optimizer slots, Keras metrics) cannot be read yet: use their initial value,
    which is a callable or a tensor made outside the graph (``init_scope``)."""
    import tensorflow as tf

    if tf.executing_eagerly():
        with contextlib.suppress(Exception):
            return var.numpy()
    try:
        with tf.init_scope():
            if callable(initial):
                initial = initial()
            if hasattr(initial, "numpy"):
                return np.array(initial.numpy())
            if tf.is_symbolic_tensor(initial):
                return None  # a tensor of the function's graph (an unlifted initializer)
            if initial is not None:
                return np.array(initial)
    except Exception:  # noqa: BLE001 - reported by the caller as unreadable
        return None
    return None


def set_seeds(seed: int) -> None:
    """Seed Python, NumPy, TensorFlow (and Keras, which seeds all three)."""
    import tensorflow as tf

    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)
    try:
        import keras

        keras.utils.set_random_seed(seed)
    except ImportError:
        pass


#: Where check() keeps, on the model itself, the functions Keras built while checking it (see
#: fresh_keras_functions): on the model, not in a WeakKeyDictionary, whose values (functions
#: closing over the model) would keep their key alive.
REUSE_ATTR = "_nddebug_checked"
_KERAS_FUNCTIONS = ("train_function", "test_function", "predict_function")


@contextlib.contextmanager
def fresh_keras_functions(
    models: list[Any], warnings: list[str], reuse: Any = None
) -> Iterator[list[tuple[Any, dict[str, Any]]]]:
    """Make Keras rebuild its train/test/predict functions inside the trace (so they are
    instrumented), without XLA (which cannot hold host callbacks), and put the user's
    functions and settings back afterwards. ``reset_keras_functions`` rebuilds them again.

    With ``reuse`` (check()'s settings), the functions an earlier check with the same settings
    built (:func:`keep_keras_functions`) are put back instead, where the model's own
    functions are still the ones they were built beside (a ``compile()`` since makes new
    ones): instrumented already, they are not traced again. Yields each model with its own
    functions, for :func:`keep_keras_functions`."""
    saved = []
    for m in models:
        attrs = {a: getattr(m, a, None) for a in _KERAS_FUNCTIONS}
        jit = getattr(m, "jit_compile", None)
        saved.append((m, attrs, jit))
        if jit:
            warnings.append(
                f"XLA (jit_compile) was switched off on model {getattr(m, 'name', '')} while "
                "checking: XLA-compiled steps are checked as a whole only."
            )
    reset_keras_functions(models)
    if reuse is not None:
        for m, attrs, _ in saved:
            kept = getattr(m, REUSE_ATTR, None)
            if (
                kept is not None
                and kept[0] == reuse
                and all(attrs[a] is kept[1].get(a) for a in _KERAS_FUNCTIONS)
                and all(x is y for x, y in zip(_compiled(m), kept[3], strict=True))
            ):
                for a, fn in kept[2].items():
                    setattr(m, a, fn)
    try:
        yield [(m, attrs) for m, attrs, _ in saved]
    finally:
        for m, attrs, jit in saved:
            for a, v in attrs.items():
                setattr(m, a, v)
            if jit is not None:
                m.jit_compile = jit


@contextlib.contextmanager
def keras_functions_kept(models: list[Any]) -> Iterator[None]:
    """Run with the models' own train/test/predict functions and settings (XLA included), and
    put them back afterwards: a function Keras builds while checking is not left behind."""
    saved = [(m, {a: getattr(m, a, None) for a in _KERAS_FUNCTIONS}) for m in models]
    try:
        yield
    finally:
        for m, attrs in saved:
            for a, v in attrs.items():
                setattr(m, a, v)


def keep_keras_functions(saved: list[tuple[Any, dict[str, Any]]], reuse: Any) -> None:
    """After a check's warm-up, keep on each model the functions Keras built (instrumented
    at their first call, in the warm-up) for the next check with the same settings ``reuse``,
    beside the model's own functions they stand in for (see :func:`fresh_keras_functions`)."""
    for m, own in saved:
        built = {a: getattr(m, a, None) for a in _KERAS_FUNCTIONS}
        try:
            object.__setattr__(m, REUSE_ATTR, (reuse, own, built, _compiled(m)))
        except (AttributeError, TypeError):  # a model that takes no attributes: rebuilt
            pass


def _compiled(model: Any) -> tuple[Any, Any]:
    """What ``compile()`` made (its config and the optimizer), by identity: a model whose own
    functions are None (never built, or reset by a compile since) was otherwise taken for the
    one an earlier check built functions beside."""
    return getattr(model, "_compile_config", None), getattr(model, "optimizer", None)


def reset_keras_functions(models: list[Any]) -> None:
    for m in models:
        for a in _KERAS_FUNCTIONS:
            if hasattr(m, a):
                setattr(m, a, None)
        if getattr(m, "jit_compile", False):
            m.jit_compile = False


def python_generators() -> list[tuple[Any, Any]]:
    """Every random generator kept in a Python object now, with its state: NumPy Generator and
    RandomState instances, and random.Random ones (SystemRandom has no state). A step that
    draws from one (``rng = np.random.default_rng(5)`` used in a tf.numpy_function, or in
    eager code) moves it on in every run of check(); put back, the steps after check() draw
    what they would have drawn (probe round 48, F2). Found by one pass over the objects the
    garbage collector tracks (~0.15 s for 300,000 objects)."""
    found = []
    numpy_types = (np.random.Generator, np.random.RandomState)
    for obj in gc.get_objects():
        if isinstance(obj, numpy_types):
            found.append((obj, _generator_state(obj)))
        elif isinstance(obj, random.Random) and not isinstance(obj, random.SystemRandom):
            with contextlib.suppress(Exception):  # a subclass whose state cannot be read
                found.append((obj, obj.getstate()))
    return found


def _generator_state(gen: Any) -> Any:
    if isinstance(gen, np.random.Generator):
        return gen.bit_generator.state
    return gen.get_state()


def set_python_generators(saved: list[tuple[Any, Any]]) -> None:
    """Put back the generators :func:`python_generators` found, each as it was."""
    for gen, state in saved:
        with contextlib.suppress(Exception):  # a generator made unusable meanwhile
            if isinstance(gen, np.random.Generator):
                gen.bit_generator.state = state
            elif isinstance(gen, np.random.RandomState):
                gen.set_state(state)
            else:
                gen.setstate(state)


class RandomStreams:
    """The process's random streams that a step may draw from: Python's and NumPy's global
    generators, TensorFlow's op-seed stream (the global seed's counter) and TensorFlow's global
    tf.random.Generator when it exists, and (``generators``) the NumPy and Python generators
    kept in Python objects (:func:`python_generators`). check() puts them back before its
    final ordinary step, so after check() they are where one plain step leaves them."""

    def __init__(self, generators: bool = True) -> None:
        from tensorflow.python.eager import context
        from tensorflow.python.ops import stateful_random_ops

        # The op seeds check()'s own stream gave out (see set_apart): an eager random op
        # whose seed2 is one of them took it from the global seed and left the user's kernels
        # alone; one with another seed2 has a seed= of its own.
        self.given: set[int] = set()
        self.python = random.getstate()
        self.numpy = np.random.get_state()
        self.generators = python_generators() if generators else []
        ctx = context.context()
        # The global seed's value: check(seed=S) sets it to S; left so, the random ops made
        # after check() took their seeds from S instead of the user's (probe round 37).
        self.global_seed = getattr(ctx, "_seed", None)
        rng = getattr(ctx, "_rng", None)
        self._tf_rng = rng if isinstance(rng, random.Random) else None
        self.tf_seeds = self._tf_rng.getstate() if self._tf_rng is not None else None
        gen = stateful_random_ops.global_generator
        self.tf_generator = (gen, gen.state.numpy()) if gen is not None else None
        # keras.utils.set_random_seed (check(seed=...)) drops Keras's global SeedGenerator:
        # the keras.random calls after check() drew from a new one (probe round 38).
        self.keras = keras_seed_attributes()

    def set_apart(self) -> None:
        """Until :meth:`restore`, eager random ops with no seed of their own draw their op
        seeds from a stream of check()'s own. With a global seed set, each such op takes the
        next seed of TensorFlow's op-seed stream, and TensorFlow keeps its kernel, whose
        generator goes on, for that seed: the runs of check() made and advanced the kernels
        of the very seeds that the steps after it draw again once the stream is put back,
        and an eager step with dropout computed other bits after check() than without it."""
        from tensorflow.python.eager import context

        if self._tf_rng is None:
            return
        copy = random.Random()
        copy.setstate(self.tf_seeds)
        context.context()._rng = _LoggedSeeds(copy.getrandbits(64) ^ 0x6E64646562756721, self)

    def logging(self) -> bool:
        """Whether every op seed an eager op drew since :meth:`set_apart` came from
        check()'s own stream, or none did for want of a global seed: nothing called
        tf.random.set_seed since (which replaces the stream and resets every kernel)."""
        from tensorflow.python.eager import context

        rng = getattr(context.context(), "_rng", None)
        if self._tf_rng is None:  # no global seed: eager ops draw no op seeds at all
            return rng is None
        return isinstance(rng, _LoggedSeeds) and rng._streams is self

    def restore(self) -> None:
        from tensorflow.python.eager import context

        set_python_generators(self.generators)  # first: the global ones are among them
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        ctx = context.context()
        if hasattr(ctx, "_seed"):
            ctx._seed = self.global_seed  # not tf.random.set_seed: it resets every kernel
        if self._tf_rng is not None:
            ctx._rng = self._tf_rng
            self._tf_rng.setstate(self.tf_seeds)
        elif hasattr(ctx, "_rng"):
            ctx._rng = None  # no global seed before check(): none after it
        if self.tf_generator is not None:
            gen, state = self.tf_generator
            gen.state.assign(state)
        set_keras_seed_attributes(self.keras)


class _LoggedSeeds(random.Random):
    """check()'s own op-seed stream: TensorFlow's context draws eager op seeds with
    ``randint`` (``Context._internal_operation_seed``); each one given is noted."""

    def __init__(self, seed: int, streams: RandomStreams) -> None:
        super().__init__(seed)
        self._streams = streams

    def randint(self, a: int, b: int) -> int:
        value = super().randint(a, b)
        self._streams.given.add(value)
        return value


_KERAS_ATTRIBUTES = ("global_seed_generator", "global_random_seed")


def _keras_global_state() -> Any:
    """Keras's global_state module, where Keras is loaded (None otherwise)."""
    import sys

    if "keras" not in sys.modules:
        return None
    try:
        from keras.src.backend.common import global_state
    except ImportError:  # another Keras
        return None
    return global_state


def keras_seed_attributes() -> dict[str, Any]:
    """What keras.utils.set_random_seed replaces: Keras's global SeedGenerator (the object)
    and the seed it remembers. check(seed=...) seeds every run through it."""
    gs = _keras_global_state()
    if gs is None:
        return {}
    return {name: gs.get_global_attribute(name) for name in _KERAS_ATTRIBUTES}


def set_keras_seed_attributes(values: dict[str, Any]) -> None:
    gs = _keras_global_state()
    if gs is not None:
        for name, value in values.items():
            gs.set_global_attribute(name, value)


def keras_global_seed_generator() -> Any:
    """Keras's global SeedGenerator, what ``keras.random.*`` ops given no seed draw from, if
    Keras made one (None otherwise, and when Keras is not loaded: nothing drew from it)."""
    import sys

    if "keras" not in sys.modules:
        return None
    try:
        from keras.src.backend.common import global_state
        from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR
    except ImportError:  # another Keras: nothing to put back
        return None
    gen = global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)
    return gen if hasattr(gen, "state") else None
