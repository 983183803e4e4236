"""Run a step several times with identical inputs and state, and compare the recordings."""

from __future__ import annotations

import contextlib
import numbers
import re
import sys
import warnings as py_warnings
from collections.abc import Callable, Collection, Sequence
from typing import Any

from nddebug import knowledge
from nddebug import state as st
from nddebug.recording import (
    DATASET_PASSES,
    NOT_COMPARED,
    OPAQUE,
    PIPELINE_OPS,
    TABLE_WRITERS,
    Recording,
    seeded_random,
)
from nddebug.report import Report
from nddebug.tracer.ops import WRITER, eager_identity
from nddebug.tracer.unheld import UnheldVariables

#: Ops that take a step's next input from state that goes on between runs, which check()
#: cannot rewind: a tf.data iterator's next element, a queue's next elements.
TAKES_NEXT = ("IteratorGetNext", "QueueDequeue")


def _updates(op_type: str) -> bool:
    """Whether ``op_type`` changes state that state= can hold: a variable (a generator's
    too) or a mutable lookup table."""
    return bool(
        WRITER.match(op_type)
        or TABLE_WRITERS.match(op_type)
        or knowledge.advances_generator(op_type)
    )


def _writes_unseen(recording: Recording) -> bool:
    """Whether a run may have written a variable where check() could not read it first: in
    a tf.data function (the variables a function call writes, seen or not, are read before
    the call and put back: tracer.unheld; those written eagerly are the unrestored updates).
    A step that only reads variables (``model.predict``) starts every repeat from the same
    values: nothing to say."""
    return any(
        WRITER.match(t) for op in recording.ops.values() for t in op.attrs.get(PIPELINE_OPS, [])
    )


def held_identities(variables: list[Any]) -> set[str]:
    """The identities (``OpInfo.resource``) of ``variables``' handles; a distributed
    variable's with each of its components'."""
    kept = set()
    for v in variables:
        for part in (v, *(getattr(v, "_values", None) or ())):
            handle = getattr(part, "handle", None)
            if handle is None:  # a lookup table
                handle = getattr(part, "resource_handle", None)
            if getattr(handle, "_id", None) is not None:
                kept.add(eager_identity(handle))
    return kept


def unrestored_updates(
    recording: Recording, variables: list[Any], restored: set[str] = frozenset()
) -> list[str]:
    """The ops of ``recording`` that update a variable or a mutable lookup table (known by
    its eager handle) that none of ``variables`` is and check() did not restore otherwise
    (``restored``: the variables its step's function calls write, tracer.unheld), one "op at
    location" per variable: an eager update of a variable left out of state= makes every
    repeat start from other values, and a deterministic step look NOT reproducible. A draw
    from a tf.random.Generator updates its state too, and an insert into a MutableHashTable
    its contents."""
    kept = held_identities(variables) | set(restored)
    missed: dict[str, str] = {}
    for op in recording.ops.values():
        if op.resource.startswith("eager:") and _updates(op.op_type):
            if op.resource not in kept:
                where = f" at {op.location}" if op.location else ""
                missed.setdefault(op.resource, f"{op.op_name or op.op_type}{where}")
    names = _variable_names(set(missed))
    return sorted(
        f"{names[res]} ({what})" if res in names else what for res, what in missed.items()
    )


def _variable_names(identities: set[str]) -> dict[str, str]:
    """The names of the live variables with these identities (ops.eager_identity), as the
    user knows them: a Keras variable's path (``random_flip/seed_generator_state``, which
    names its layer), else the tf.Variable's name. Found among the process's objects, only
    for a warning: the warning named the ops that updated them alone, neither the variables
    nor their owner (probe round 47, F4)."""
    if not identities:
        return {}
    import gc

    import tensorflow as tf

    keras = sys.modules.get("keras")
    keras_variable = getattr(keras, "Variable", None) if keras is not None else None
    kinds = (tf.Variable, keras_variable) if isinstance(keras_variable, type) else (tf.Variable,)
    names: dict[str, str] = {}
    for obj in gc.get_objects():
        if not isinstance(obj, kinds):  # (type checks only: other objects load lazily)
            continue
        inner = getattr(obj, "_value", None) if not isinstance(obj, tf.Variable) else None
        var = inner if isinstance(inner, tf.Variable) else obj
        if not isinstance(var, tf.Variable) or not hasattr(var, "handle"):
            continue
        try:
            identity = eager_identity(var.handle)
        except Exception:  # noqa: BLE001 - a variable without an eager handle
            continue
        if identity in identities and (identity not in names or var is not obj):
            names[identity] = str(getattr(obj, "path", None) or var.name)
    return names


def iterators_carried_over(first: Recording, second: Recording) -> dict[str, str]:
    """The ops that read a tf.data iterator both runs used, the same iterator object (one
    the step captures, which goes on where the previous run stopped), as key -> "op type at
    location". An iterator made inside the step is a new one in every run (another handle,
    or a name inside the graph)."""

    def reads(rec: Recording) -> dict[str, tuple[str, str]]:
        return {
            op.resource: (op.key, f"{op.op_type} at {op.location}" if op.location else op.op_type)
            for op in rec.ops.values()
            if op.resource.startswith("eager:") and op.op_type.startswith(TAKES_NEXT)
        }

    again = reads(second)
    return dict(found for res, found in reads(first).items() if res in again)


def iterators_from_before(rec: Recording, first_new_id: int) -> list[str]:
    """The iterator reads of ``rec`` (eager ``IteratorGetNext``) whose iterator existed before
    the check began: its handle is older than ``first_new_id`` (TensorFlow numbers eager
    tensors in the order it makes them), as "op type at location"."""
    found = set()
    for op in rec.ops.values():
        if not (op.op_type.startswith("IteratorGetNext") and op.resource.startswith("eager:")):
            continue
        handle = op.resource.removeprefix("eager:")
        if handle.isdigit() and int(handle) < first_new_id:
            found.add(f"{op.op_type} at {op.location}" if op.location else op.op_type)
    return sorted(found)


def _moved_iterator_note(older: list[str]) -> str:
    """Rerun mode's warning for a step that reads an iterator made before check() ("" if
    none): the iterator goes on with every run, so the training after check() reads other
    batches. (Repeat mode sees it in the repeats' inputs: :func:`_iterator_note`.)"""
    if not older:
        return ""
    return (
        f"The step takes the next element of an iterator made before check() "
        f"({', '.join(older[:3])}): check() runs the step twice (the traced step and the "
        "ordinary step at the end) and cannot rewind an iterator, so it leaves the iterator "
        "further on than one ordinary step would, and the training that follows reads other "
        "batches. Take the batch outside the step and pass it as an argument "
        "(check(step, batch, ...))."
    )


def _iterator_note(report: Report, carried: dict[str, str], passed: bool) -> str:
    """The warning for repeats that read on from one iterator, where that made an iterator
    op diverge ("" otherwise): the pipeline is not to blame, the repeats' inputs differ."""
    diverged = [f for f in report.comparison.findings if f.op.op_type.startswith(TAKES_NEXT)]
    named = sorted({carried[f.key] for f in diverged if f.key in carried})
    if not named and passed and diverged:
        named = sorted({f"{f.op.op_type} at {f.op.location}" for f in diverged})
    if not named:
        return ""
    if all(n.startswith("QueueDequeue") for n in named):
        return (
            f"The step takes the next elements of a queue it did not create "
            f"({', '.join(named[:3])}): each repeat takes the next ones, and check() cannot "
            "put them back, so the repeats' inputs differ whatever the queue's producers do, "
            "and the training after check() finds the queue further on than without it. "
            "Take the elements outside the step and pass them as an argument "
            "(check(step, batch, ...))."
        )
    what = "an iterator passed to it" if passed and not carried else "an iterator it did not create"
    return (
        f"The step takes the next element of {what} ({', '.join(named[:3])}): each repeat "
        "reads the next batch, and check() cannot rewind an iterator, so the repeats' inputs "
        "differ whatever the pipeline does. Take the batch outside the step and pass it as "
        "an argument (check(step, batch, ...))."
    )


def _reuse_key(mode: str, k: int, emulate_gpu: bool, seed: int | None) -> tuple:
    """What the instrumented copy of a step depends on besides the step itself (see
    :func:`_fresh`): how its graphs were instrumented (the mode and its re-executions, GPU
    emulation's masks, the op callbacks active, such as check_numerics), the op seeds its
    random ops took when traced (``seed``, the global seed) and the kernels TensorFlow made
    for it (op determinism is read when a kernel is made). A copy made under other settings
    is traced again."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import config

    return (
        mode,
        k,
        bool(emulate_gpu),
        seed,
        config.is_op_determinism_enabled(),
        context.global_seed(),
        # Other op callbacks rewrite graphs as they are traced too (check_numerics, tfdbg2).
        tuple(context.context().op_callbacks),
    )


def _callable_as_a_step(fn: Callable[..., Any]) -> None:
    """Refuse, before anything runs, what check() cannot run as a step: a call from inside a
    tf.function (check() runs the step eagerly, several times, and restores state between
    runs; it failed in NumPy conversion), and a generator or coroutine function, whose body
    runs only when iterated or awaited (it "recorded no TensorFlow op", and the coroutine was
    left unawaited; probe round 47, F15)."""
    import inspect

    import tensorflow as tf

    from nddebug.errors import TraceError

    if tf.inside_function():
        raise TraceError(
            "nddebug.check() was called while a tf.function is being traced: it runs the step "
            "eagerly, several times, restoring state between runs. Call check() from Python "
            "(outside any tf.function), with the tf.function as the step."
        )
    target = getattr(fn, "python_function", fn)
    if inspect.isgeneratorfunction(target) or inspect.iscoroutinefunction(target):
        what = "a generator" if inspect.isgeneratorfunction(target) else "a coroutine"
        raise TypeError(
            f"check() runs the step and compares what it computes, but {fn!r} is {what} "
            "function: its body runs only when it is iterated or awaited. Pass a function "
            "that runs the step when called."
        )


def _function_called(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The tf.function that calling ``fn`` runs, where ``fn`` is an object (a ``tf.Module``)
    whose ``__call__`` is one: check() retraces a tf.function it is given (:func:`_fresh`),
    and given the object it ran the function's graph traced before, uninstrumented, and
    blamed the whole call with the advice to give check() the function (probe round 47,
    F2). The bound function is the same object on every access, so what check() keeps on it
    for the next check is found again."""
    import inspect

    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    if isinstance(fn, polymorphic_function.Function):
        return fn
    call = inspect.getattr_static(type(fn), "__call__", None)
    if isinstance(call, polymorphic_function.Function):
        return fn.__call__
    return fn


def _fresh(
    fn: Callable[..., Any],
    warnings: list[str],
    args: Any = (),
    kwargs: Any = None,
    reuse: tuple | None = None,
) -> Callable[..., Any]:
    """A tf.function traced before check() runs an uninstrumented graph: retrace a copy.

    With ``reuse`` (:func:`_reuse_key`), the copy an earlier check of ``fn`` made with the
    same settings and kept (:func:`_keep_copy`) is taken again: instrumented at its first call
    then, it is not traced again. A copy per check cost a whole trace, instrumentation and
    optimization each time, and TensorFlow keeps the graph of a function that applies a
    Keras optimizer's gradients for the life of the process, so a process that checked every
    few steps grew by an instrumented train function per check.

    Not a function restored from a SavedModel: its Python function only calls the restored
    graphs, so a copy traced in the block held one call op, which TensorFlow runs inside the
    graph without telling nddebug, and what the call wrote to its variables went uncompared
    (check(loaded.serve) was never "reproducible"). It is traced for ``args`` here, outside
    any block, as its first plain call would trace it: each call in the runs is then an eager
    call of the restored graph, compared at its boundary (its inputs, outputs and the
    variables it captures)."""
    import tensorflow as tf
    from tensorflow.python.eager.polymorphic_function import polymorphic_function
    from tensorflow.python.saved_model.function_deserialization import RestoredFunction

    if isinstance(fn, RestoredFunction):
        try:
            fn.get_concrete_function(*args, **(kwargs or {}))
        except Exception:  # noqa: BLE001 - no match for these arguments: the call will say
            pass
        return fn
    if not isinstance(fn, polymorphic_function.Function):
        return fn
    jit = getattr(fn, "_jit_compile", None)
    if jit:
        warnings.append(
            "XLA (jit_compile=True) was switched off for the checked function, so that its ops "
            "are recorded one by one (XLA clusters cannot hold nddebug's host callbacks)."
        )
    kept = getattr(fn, st.REUSE_ATTR, None) if reuse is not None else None
    if kept is not None and kept[0] == reuse:
        return kept[1]
    return tf.function(
        fn.python_function,
        input_signature=fn.input_signature,
        reduce_retracing=getattr(fn, "_reduce_retracing", False),
        jit_compile=False,
    )


def _keep_copy(fn: Callable[..., Any], copy: Callable[..., Any], reuse: tuple) -> None:
    """Keep ``copy`` on ``fn`` for the next check of it with the same settings (see
    :func:`_fresh`), once its warm-up has run: on the function, not in a WeakKeyDictionary,
    whose values would hold their keys alive through the step's closures."""
    if copy is fn:
        return
    try:
        setattr(fn, st.REUSE_ATTR, (reuse, copy))
    except (AttributeError, TypeError):  # a function that takes no attributes: traced anew
        pass


#: check() keeps the events of at most this many repeats that differ from one another (each
#: a whole step's op executions); repeats that match a kept one share its events.
MAX_DISTINCT_REPEATS = 16


class RepeatStore:
    """The repeats of check(), kept in memory bounded by how many *different* runs there
    were, not by ``repeats``: a repeat whose signature (:func:`analysis.run_signature`)
    matches a kept one shares that run's events and ops, and the comparison reads it as the
    run it repeated. Past ``limit`` different runs, further different ones are counted,
    not kept: the verdict cannot be "ok" by then, and their digests are in ``path`` if one
    was given."""

    def __init__(self, limit: int = MAX_DISTINCT_REPEATS) -> None:
        self.limit = limit
        self.runs: list[Recording] = []
        self._by_signature: dict[str, Recording] = {}
        self.dropped: list[str] = []  # labels of different repeats not kept

    def add(self, rec: Recording) -> None:
        from nddebug.analysis import run_signature

        signature = run_signature(rec)
        same = self._by_signature.get(signature)
        if same is not None:
            rec.events, rec.ops = same.events, same.ops  # one copy in memory
        elif len(self._by_signature) >= self.limit:
            self.dropped.append(rec.label)
            return
        else:
            self._by_signature[signature] = rec
        self.runs.append(rec)

    def dropped_note(self) -> str:
        return (
            f"{len(self.dropped)} repeat(s) ({', '.join(self.dropped[:3])}"
            f"{', …' if len(self.dropped) > 3 else ''}) differed from all of the "
            f"{self.limit} different runs already kept and were left out of the comparison "
            "to bound memory"
        )


#: At most this many capture runs: two, and more while a source's divergence has not recurred
#: in them (a race that showed in the compared repeats may not in the next two runs).
MAX_CAPTURES = 6


def _not_yet_measured(sources: set[str], captures: list[Recording]) -> set[str]:
    """The sources whose captured values the report could not measure yet (the same in every
    capture run so far), by the rule the report's magnitudes use (quantify.measure)."""
    import numpy as np

    from nddebug import quantify
    from nddebug.analysis import unit_values

    measured = set()
    values = unit_values(captures)
    for (unit, _slot), arrays in values.items():
        if unit[1] in sources and unit[1] not in measured:
            shapes = {(np.shape(a), getattr(a, "dtype", None)) for a in arrays}
            if len(shapes) > 1:  # it recurred: values of other shapes (a padded batch)
                measured.add(unit[1])
                continue
            d = quantify.measure(arrays)
            if d is not None and d.frac_differing > 0:
                measured.add(unit[1])
    # A source no capture run captured (in a function the step calls, traced before them)
    # will not be in the next one either: no more runs for it.
    captured = {unit[1] for unit, _slot in values}
    return (sources & captured) - measured


def check(
    fn: Callable[..., Any],
    *args: Any,
    repeats: int = 5,
    state: Any = None,
    seed: int | None = None,
    path: str | None = None,
    quantify: bool = True,
    advance: bool = True,
    mode: str = "repeat",
    rerun: int = 1,
    emulate_gpu: bool = False,
    confirm: int = 64,
    **kwargs: Any,
) -> Report:
    """Run ``fn(*args, **kwargs)`` ``repeats`` times under :func:`nddebug.trace` and compare.

    A first, traced warm-up run builds (and instruments) the step's graphs and creates the
    variables a first call creates, such as optimizer slots; it is not compared, because it
    runs one-time ops the others do not. The instrumented copy of a ``tf.function`` step, and
    the train functions Keras builds for models in ``state``, are kept for the next check of
    the same step with the same settings (see :func:`_fresh`), which does not trace them
    again. Before every compared repeat the variables of ``state`` and those created by the
    warm-up are restored, and with ``seed`` the Python, NumPy, TensorFlow and Keras seeds are
    set. If ops diverge and ``quantify`` is set, two more runs capture the full values of the
    divergent ops to measure how far apart they are (up to :data:`MAX_CAPTURES` while a
    source's divergence does not recur in them).
    With ``path`` each compared run is appended to that file as soon as it ends.

    With ``mode="rerun"`` the step runs once, traced with ``trace(rerun=rerun)``: every
    stateless op runs ``rerun`` more times on its own inputs, and an op whose re-executions
    differ is a source. One step, no repeats, but it cannot see stateful ops, races between
    ops or input-pipeline order (the report says so); ``repeats`` is not used.

    With ``emulate_gpu`` the traced runs rehearse a GPU (:func:`nddebug.emulate_gpu`); the
    final ordinary step does not, so training goes on at the CPU's speed and results.

    An op with no deterministic kernel on this device raises UnimplementedError under op
    determinism: the report then names it (``report.errors``) with the alternatives.

    A known culprit that ran but did not diverge (``report.risks``) is confirmed by one more
    traced step in which that op alone also runs ``confirm`` more times on its very inputs
    (rerun mode's machinery, for that op only): ``risks["confirmed"]`` says in how many of
    them it differed. ``confirm=0`` skips it.

    Finally the state is restored once more and ``fn`` runs once, uninstrumented: the user's
    training continues exactly as if check() had been one ordinary step. With
    ``advance=False`` the state is left as before the check instead.
    """
    from nddebug.tracer import Recorder, trace
    from nddebug.tracer.fresh import FreshCopies

    if mode not in ("repeat", "rerun"):
        raise ValueError(f"mode must be 'repeat' or 'rerun', got {mode!r}")
    # Arguments are checked before anything runs: a bad one must not cost a traced warm-up.
    for name, value in (("repeats", repeats), ("rerun", rerun), ("confirm", confirm)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be a whole number, got {value!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise TypeError(f"seed must be a whole number or None, got {seed!r}")
    if not callable(fn):
        raise TypeError(f"check() needs the step to run (a callable), got {type(fn).__name__}")
    _callable_as_a_step(fn)
    fn = _function_called(fn)
    if mode == "repeat" and repeats < 2:
        raise ValueError(f"repeats must be at least 2 to compare runs, got {repeats}")
    if mode == "rerun" and rerun < 1:
        raise ValueError(f"rerun must be at least 1 extra execution per op, got {rerun}")
    if path is not None:
        from nddebug import storage

        storage.check_appendable(path)  # a bad path fails before the step runs
    k = rerun if mode == "rerun" else 0
    warnings: list[str] = []
    models = st.keras_models(state)
    # Keras's global SeedGenerator (keras.random.* with no seed) is state the step changes
    # that no state= can name (a DeterminismCheck passes the model): restored with the
    # rest, or the repeats drew other numbers and training went on from another stream.
    keeper = st.StateKeeper(state)
    keeper.also(st.keras_global_seed_generator())
    before = keeper.snapshot()
    traced_before = _program_op_types(fn)  # the program the user runs, to compare the copy's
    # Set apart at the start of each run (one_run). The NumPy and Python generators kept in
    # objects are looked for unless the step is a tf.function traced into graphs that run
    # no Python function (nothing else can draw from them).
    streams = st.RandomStreams(
        generators=not traced_before or any(t & PY_FUNCTION_TYPES for t in traced_before)
    )
    # The variables the step writes that state= does not hold (a tf.random.Generator, a
    # Keras SeedGenerator, metrics built in the first step): found as the runs go, put back
    # with the rest (tracer.unheld).
    unheld = UnheldVariables(lambda: held_identities(keeper.variables), keeper.settle)
    # What the runs moved on for good (XLA's random counter): said as a Python warning too,
    # for a DeterminismCheck whose training goes on from there (probe round 42, F2).
    moved_on: list[str] = []
    fresh_kernels: set[str] = set()  # the seeded stateful random ops that drew from fresh kernels
    per_run_made: set[int] | None = None  # variables made by runs after the warm-up (one_run)
    program = [""]  # what the runs' labels begin with: AS_COMPILED for the pass as compiled
    # With seed=: Keras's global SeedGenerator as the warm-up made it. Seeding drops it, and
    # each run made a new one (another variable): "took a different path" (probe round 38).
    seeded_keras: dict[str, Any] = {}

    def one_run(
        step: Callable[..., Any],
        label: str,
        capture: set[str] | None = None,
        rerun_only: set[str] | None = None,
    ) -> Recording:
        nonlocal per_run_made
        keeper.restore(before)
        unheld.restore()
        known = {id(v) for v in keeper.variables}
        # Every run draws its eager op seeds from the start of check()'s own stream: the same
        # seeds in each run, as fresh processes draw the same ones from the global seed.
        streams.set_apart()
        if seed is not None:
            st.set_seeds(seed)
            # The warm-up's generator, its state put back to its first value with the
            # variables the step made (keeper.restore above).
            st.set_keras_seed_attributes(seeded_keras)
        k_here = confirm if rerun_only is not None else k
        # Seeded random ops draw from fresh kernels in every run (tracer.fresh): the
        # runs compare the same draws, and the user's own kernels are left to the last step.
        copies = FreshCopies()
        try:
            label = program[0] + label
            with keeper.watch_creation(), trace(label=label, rerun=k_here, record_env=False) as rec:
                assert Recorder.active is not None
                Recorder.active.rerun_only = rerun_only
                Recorder.active.fresh = copies
                Recorder.active.unheld = unheld
                if capture is not None:
                    Recorder.active.capture = capture
                returned = step(*args, **kwargs)
                keeper.close_pending()  # made while tracing, and found by no call after
                assert Recorder.active is not None
                Recorder.active.record_return(returned)
                # A variable the step makes in every run (a tf.random.Generator, a temporary of
                # eager code) is that run's own: one an earlier run made is put back to its first
                # value and left alone by this run, so its value is not this run's to compare.
                # The warm-up's are the step's for good (an optimizer's slots, made on its
                # first call).
                made_here = {id(v) for v in keeper.variables if id(v) not in known}
                if per_run_made is not None:
                    per_run_made.update(made_here)
                own = [
                    v
                    for v in keeper.variables
                    if per_run_made is None or id(v) not in per_run_made or id(v) in made_here
                ]
                python = [v for v in unheld.python.values() if id(v) not in known]
                Recorder.active.record_variables(own + python + keeper.table_states())
        finally:
            fresh_kernels.update(copies.op_types)
            copies.release()
        if per_run_made is None:
            per_run_made = set()  # the warm-up has run: what later runs make is their own
            if seed is not None:
                seeded_keras.update(
                    (k, v) for k, v in st.keras_seed_attributes().items() if v is not None
                )
        if capture is not None:
            rec.kind = "capture"
        rec.warnings.extend(w for w in warnings if w not in rec.warnings)
        return rec

    def compared(
        step: Callable[..., Any],
        retrace: Callable[[], Callable[..., Any]],
        warmed_up: Callable[[], None] = lambda: None,
    ) -> Report:
        """Warm up, run the compared repeats (or the one rerun step) and, if ops diverged,
        measure them on two capture runs of a freshly traced ``retrace()``. ``warmed_up`` is
        called once the warm-up has run (and instrumented the step's graphs)."""
        runs: list[Recording] = []
        from tensorflow.python.framework import ops as tf_ops

        first_new_id = tf_ops.uid()
        warm = one_run(step, "warm-up" if mode == "repeat" else "rerun")
        unheld.closed = True  # found from now on: moved on by the warm-up already
        warmed_up()
        # Repeats that read on from such an iterator see other batches, and say so below.
        moved = (
            ""
            if mode == "repeat"
            else _moved_iterator_note(iterators_from_before(warm, first_new_id))
        )
        if keeper.unreadable:
            warnings.append(
                "Could not read the initial value of variable(s) created by the step "
                f"({', '.join(keeper.unreadable[:5])}): they are not restored between runs."
            )
        warnings.extend(w for w in warm.warnings if w not in warnings)
        # This pass's own: the XLA-off pass after an as-compiled one emulates what this missed.
        unemulated = _not_emulated_note(warm) if emulate_gpu else ""
        xla_random = _xla_random_note(warm)
        if xla_random and xla_random not in warnings:
            warnings.append(xla_random)
            warm.warnings.append(xla_random)
            moved_on.append(xla_random)
        passes = _passes_note(warm, first_new_id)
        if passes and passes not in warnings:
            warnings.append(passes)
            warm.warnings.append(passes)
        for written in (_summaries_note(warm), _checkpoints_note(warm), _py_functions_note(warm)):
            if written and written not in warnings:
                warnings.append(written)
                warm.warnings.append(written)
        missed = (
            unrestored_updates(warm, [*keeper.variables, *keeper.tables], unheld.identities())
            if mode == "repeat"
            else []  # rerun mode's one traced step has no repeats to start from it
        )
        if mode == "repeat" and state is None and (missed or _writes_unseen(warm)):
            warnings.append(
                "The step updates variables (or lookup tables) that check() cannot put back "
                "by itself (written eagerly, a table, or inside a tf.data function), and no "
                "state= was given: every repeat starts from whatever the previous one left. "
                "Pass the model, optimizer, variables or tables as state= to restore them."
            )
        elif mode == "repeat" and state is not None:
            if missed:
                more = f" and {len(missed) - 3} more" if len(missed) > 3 else ""
                warnings.append(
                    f"The step updates {len(missed)} variable(s) or table(s) that state= does "
                    f"not hold (updated by {', '.join(missed[:3])}{more}): every repeat starts "
                    "from what the previous one left in them, so what reads them differs, and "
                    "the steps after the check go on from where the last run left them. Add "
                    "their owner to state= (an optimizer: state=[model, optimizer]; a Keras "
                    "layer or model, whose random layers keep a seed generator's state: that "
                    "layer or model; a tf.random.Generator or a MutableHashTable: itself)."
                )
        if mode == "rerun":
            # One traced step is the whole check: its ops were compared with themselves.
            runs.append(warm)
            if path is not None:
                warm.save(path)
        seeded = _seeded_kernels(warm) if mode == "repeat" else set()
        kept = RepeatStore(MAX_DISTINCT_REPEATS)
        for i in range(repeats if mode == "repeat" else 0):
            rec = one_run(step, f"repeat {i}")
            if path is not None:
                rec.save(path)
            kept.add(rec)
        runs += kept.runs
        if keeper.reordered:
            warnings.append(_reordered_note(keeper.reordered))
            keeper.reordered_said = len(keeper.reordered)
            for rec in runs:
                rec.warnings.append(warnings[-1])
        if unheld.late:
            warnings.append(LATE_VARIABLES_NOTE.format(n=len(unheld.late)))
            for rec in runs:
                rec.warnings.append(warnings[-1])
        if traced_unseeded:
            warnings.append(TRACED_UNSEEDED_NOTE.format(ops=", ".join(traced_unseeded[:4])))
            for rec in runs:
                rec.warnings.append(warnings[-1])
        if mode == "rerun" and _uses_xla(fn, models):
            warnings.append(RERUN_XLA_NOTE)
            for rec in runs:
                rec.warnings.append(warnings[-1])
        if seed is not None and _seeded_kernels(warm):
            warnings.append(SEED_RESETS_KERNELS_NOTE)
            for rec in runs:
                rec.warnings.append(warnings[-1])
        if emulate_gpu and seed is not None:
            warnings.append(SEEDED_EMULATION_NOTE)
            for rec in runs:
                rec.warnings.append(warnings[-1])
        if kept.dropped:
            warnings.append(kept.dropped_note())
            for rec in runs:
                rec.warnings.append(warnings[-1])
        report = Report(runs, mode=mode)
        # An iterator or queue every run reads on from: each more run (capture, confirm)
        # takes elements the training after check() then misses, and a finite queue ran dry.
        carried = iterators_carried_over(warm, kept.runs[0]) if kept.runs else {}
        if mode == "repeat" and kept.runs:
            note = _iterator_note(
                report,
                carried,
                any(st.is_iterator(a) for a in (*args, *kwargs.values())),
            )
            if note:
                warnings.append(note)
                for rec in runs:
                    rec.warnings.append(note)
                report = Report(runs, mode=mode)
        # Still sources: they drew where check() could not give them fresh kernels.
        stuck = sorted(
            {
                f.op.op_type
                for f in report.comparison.findings
                if f.role == "source" and f.key in seeded
            }
        )
        said = []
        if stuck:
            said.append(STUCK_KERNELS_NOTE.format(ops=", ".join(stuck)))
        elif fresh_kernels:
            said.append(SEEDED_KERNELS_NOTE.format(ops=", ".join(sorted(fresh_kernels))))
        # Only while check()'s own stream gave the op seeds (check(seed=...) and a step that
        # calls tf.random.set_seed replace it, and reset every kernel besides).
        own = _own_seeds(warm, streams.given) if streams.logging() else []
        if own:
            said.append(OWN_SEEDS_NOTE.format(ops=", ".join(own)))
        for say in said:
            warnings.append(say)
            for rec in runs:
                rec.warnings.append(say)
        if unemulated:
            for rec in runs:
                rec.warnings.append(unemulated)
        if said or unemulated:
            report = Report(runs, mode=mode)
        if moved:
            warnings.append(moved)
            for rec in runs:
                rec.warnings.append(moved)
            report = Report(runs, mode=mode)
        keys = {f.key for f in report.comparison.findings if f.role != "control flow"}
        # Rerun mode measured divergent outputs as it went: no second pass.
        if quantify and keys and mode == "repeat" and not carried:
            step = retrace()
            one_run(step, "capture warm-up", keys)
            sources = {f.key for f in report.comparison.findings if f.role == "source"}
            captures: list[Recording] = []
            for j in range(MAX_CAPTURES):
                captures.append(one_run(step, f"capture {j}", keys))
                if path is not None:
                    captures[-1].save(path)
                if j >= 1 and not _not_yet_measured(sources, captures):
                    break
            report = Report(runs, mode="repeat", captures=captures)
        hidden = report.hidden_risk_keys()
        if confirm and hidden and mode == "repeat" and not carried:
            # The known culprits that ran without diverging: re-execute each alone on its
            # own inputs, in one more step traced afresh (its graphs get the copies).
            step = retrace()
            rec = one_run(step, "confirm suspects", rerun_only=hidden)
            report.set_confirmations(confirmations(rec, hidden))
        return report

    from nddebug.emulate import emulate_gpu as emulation
    from nddebug.emulate import suspended as emulation_suspended

    traced_unseeded = _traced_unseeded(fn, seed)
    try:
        with emulation() if emulate_gpu else contextlib.nullcontext():
            as_compiled = None
            if _uses_xla(fn, models) and mode == "repeat":
                # The program as the user runs it first: XLA clusters are compared at their
                # boundary (outputs and the variables they write), not op by op.
                program[0] = AS_COMPILED
                try:
                    with st.keras_functions_kept(models):
                        as_compiled = compared(fn, lambda: fn)
                finally:
                    program[0] = ""
                as_compiled.program = "as compiled (XLA)"
            if as_compiled is None or not as_compiled.ok:
                # The step's instrumented copy (and the Keras functions it builds) is made
                # once for all checks of it with these settings (see _fresh).
                reuse = _reuse_key(mode, k, emulate_gpu, seed)
                with st.fresh_keras_functions(models, warnings, reuse) as own:

                    def retrace() -> Callable[..., Any]:
                        # Retrace, so that the graphs hand the chosen outputs' values to the
                        # host.
                        st.reset_keras_functions(models)
                        return _fresh(fn, [], args, kwargs)

                    first = _fresh(fn, warnings, args, kwargs, reuse)

                    def warmed_up() -> None:
                        _keep_copy(fn, first, reuse)
                        st.keep_keras_functions(own, reuse)
                        note = _retraced_otherwise(traced_before, first, not emulate_gpu)
                        if note and note not in warnings:
                            warnings.append(note)

                    report = compared(first, retrace, warmed_up)
                if as_compiled is not None:
                    report.program = "XLA off"
                    report.as_compiled = as_compiled
                elif _uses_xla(fn, models):
                    report.program = "XLA off"  # rerun mode: RERUN_XLA_NOTE
            else:
                report = as_compiled
    except BaseException as exc:
        keeper.restore(before)
        unheld.restore()  # what could not be put back is not worth hiding exc for
        streams.restore()
        from nddebug import environment

        if isinstance(exc, TypeError) and OUT_OF_SCOPE in str(exc):
            # A resource the function made on its first call and kept in Python (a lookup
            # table): check()'s retraced copy cannot use it, as a retrace of the function
            # itself cannot (probe round 47, F6).
            raise TypeError(RETRACE_OUT_OF_SCOPE.format(error=str(exc).splitlines()[0])) from exc
        # Only op determinism turns a kernel with no deterministic variant into an error;
        # without it, an UnimplementedError is the step's own and is the user's to see.
        if type(exc).__name__ != "UnimplementedError" or not environment.capture().get(
            "op_determinism"
        ):
            raise
        # No deterministic kernel for an op here (op determinism on a GPU): say which and what
        # to do instead, rather than end with TensorFlow's traceback.
        from nddebug.verify import raised_from

        return Report([], mode=mode, errors=[raised_from(exc)])
    # Leave the state as after one ordinary, uninstrumented step of the user's own function:
    # instrumented graphs can fuse ops differently, so their last bits need not match it.
    from nddebug.verify import Replay

    report.replay = Replay(fn, args, kwargs, state, repeats, emulate_gpu)
    keeper.restore(before)
    if len(keeper.reordered) > keeper.reordered_said:  # found in later runs or just now
        py_warnings.warn(_reordered_note(keeper.reordered), stacklevel=2)
    failed = unheld.restore()
    streams.restore()
    for note in moved_on:
        py_warnings.warn(note, stacklevel=2)
    if failed:
        py_warnings.warn(
            "nddebug.check() could not put back these variables that state= does not hold as "
            "they were before it, so the steps after it go on from where its runs left them: "
            f"{'; '.join(failed)}",
            stacklevel=2,
        )
    if advance:
        # With the process's random streams as they were, not seeded to ``seed``: that is
        # the step the program would have run. Seeded, it left Python's, NumPy's and
        # TensorFlow's streams reset to ``seed`` for the rest of the training, and every
        # check with seed= reset the shuffles and augmentations (probe round 37). Not
        # emulated either, inside `with emulate_gpu():` too: the training goes on as the
        # program's own step would take it (see emulate.suspended).
        with emulation_suspended():
            fn(*args, **kwargs)
    return report


def _reordered_note(tables: list[Any]) -> str:
    """What check() could not put back of mutable tables in state=: the order they export
    their keys in (see state._set_table_contents)."""
    names = ", ".join(str(getattr(t, "name", None) or getattr(t, "_name", "table")) for t in tables)
    return (
        f"check() put back the contents of lookup table(s) in state= ({names}) but not the "
        "order they export them in (a step that grows a table past a resize does this: "
        "emptying a hash table keeps its buckets). A step that reads table.export() sees its "
        "keys in another order after check() than without it; the lookups are unchanged."
    )


#: Said for check(emulate_gpu=True, seed=...): see the text (probe round 36, finding 5).
SEEDED_EMULATION_NOTE = (
    NOT_COMPARED + "the emulated GPU accumulation order: check(seed=...) sets "
    "tf.random.set_seed before every run, which resets TensorFlow's random kernels, the "
    "emulation's random masks among them, so every run replays the same emulated order and "
    "its divergence cannot show. Seed the program yourself (before building the model) and "
    "check without seed= when emulating."
)
#: Said for check(mode="rerun") of an XLA step (probe round 42, F4: "reproducible", with
#: nothing that said the compiled program was not checked).
RERUN_XLA_NOTE = (
    NOT_COMPARED + "the step as compiled (XLA): rerun mode re-executes the ops one by one, "
    "which it can only do with XLA off, so it checked that program, not the compiled one you "
    "run. nddebug.check(..., mode='repeat') checks the step as compiled first."
)
#: Said when check(seed=...) ran a step with seeded stateful random ops.
SEED_RESETS_KERNELS_NOTE = (
    "check(seed=...) sets tf.random.set_seed before every run, which makes TensorFlow drop "
    "the kernels of every stateful random op in the process (tf.random.uniform, dropout): "
    "the seeded random ops of the steps after check() start their streams again instead of "
    "going on where a plain step would leave them. check() puts the global seed and Python's "
    "and NumPy's streams back; to keep your training's random streams as they are, seed the "
    "program yourself and check without seed=."
)
#: Said when the function the user runs holds unseeded random ops that check()'s copy of it,
#: traced under a global seed, holds seeded (see _traced_unseeded).
TRACED_UNSEEDED_NOTE = (
    NOT_COMPARED + "the function you run was traced before a global seed was set "
    "(tf.random.set_seed, or check(seed=...)), so its random ops ({ops}) are unseeded in it and "
    "draw other numbers in every process; check() traced a copy under the seed set now, in "
    "which they are seeded, so it checked another program than the one that runs. Set the "
    "seed before the function's first call, or give the ops a seed=."
)


#: How the labels of check()'s runs of a step as compiled (XLA on) begin: a file check()
#: appended both passes to holds two programs' runs, which `nddebug report` compares apart.
AS_COMPILED = "as compiled: "
#: TensorFlow's error for a tensor of another function's graph used in a retrace.
OUT_OF_SCOPE = "is out of scope and cannot be used here"
#: Said instead, when check()'s retraced copy of the step met such a tensor.
RETRACE_OUT_OF_SCOPE = (
    "check() retraces the step to record its ops, and the retrace uses a tensor an earlier "
    "trace made ({error}): the function creates something on its first call (a lookup table, "
    "a tf.Variable of its own) and keeps it in Python, which no other trace can use. "
    "TensorFlow raises the same when it retraces the function itself (new input shapes). "
    "Create it outside the function (or in its __init__), and pass or capture it."
)
#: Said when check()'s copy of the step holds other ops than the function the user runs.
RETRACED_OTHERWISE_NOTE = (
    NOT_COMPARED + "the function you run: check() traced a copy of it, and the copy {how}. "
    "Python values read while tracing (a flag, a setting, a layer's attribute) changed since "
    "your function was traced; TensorFlow keeps running the graph it traced then, so check() "
    "compared another program than the one that runs. Check the step before changing such "
    "values, or call tf.function anew (and its first call) after changing them."
)
#: Op types that instrumenting a step adds to its graph (or takes from a traced call) beside
#: nddebug's own ops: not a sign of another program.
_PLUMBING = frozenset(
    {"Identity", "IdentityN", "NoOp", "Const", "ReadVariableOp", "Reshape", "Placeholder"}
)


def _traced_concrete_functions(fn: Any) -> list[Any]:
    """The graphs a tf.function was traced into so far, tracing nothing: TensorFlow's list
    traces a function with an input signature (a step of no arguments has one) that was
    never called, which traced the user's function, and the functions it calls, outside
    check()'s block (those then ran uninstrumented)."""
    if not fn.experimental_get_tracing_count():
        return []
    return list(fn._list_all_concrete_functions())


def _program_op_types(fn: Any) -> list[set[str]]:
    """The op types of each graph ``fn`` (a tf.function) was traced into so far, with those
    of the functions they call (nddebug's own left out); [] for anything else."""
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    from nddebug.tracer import opaque

    if not isinstance(fn, polymorphic_function.Function):
        return []
    try:
        concrete = _traced_concrete_functions(fn)
        return [
            {t.split("(")[0] for t in opaque.ops_inside(cf.function_def.signature.name, cf.graph)}
            for cf in concrete
        ]
    except Exception:  # noqa: BLE001 - a function TensorFlow cannot list: not compared
        return []


def _retraced_otherwise(before: list[set[str]], copy: Any, extra_too: bool) -> str:
    """RETRACED_OTHERWISE_NOTE where ``copy`` (check()'s retraced, warmed-up copy) lacks an
    op type every graph of the user's function holds, or (``extra_too``) holds one none of
    them does. A step traced with an unseeded random op behind a Python flag, then the flag
    turned off: TensorFlow's function still draws, check()'s copy did not, and the step was
    "reproducible" (probe round 47, F12)."""
    if not before or any(types != before[0] for types in before):
        return ""  # never traced, or traced into other programs for other arguments
    after = _program_op_types(copy) if copy is not None else []
    if not after:
        return ""
    missing = set.intersection(*before) - set.union(*after)
    extra = (set.intersection(*after) - set.union(*before) - _PLUMBING) if extra_too else set()
    parts = []
    if missing:
        parts.append(f"lacks {', '.join(sorted(missing))}, which yours runs")
    if extra:
        parts.append(f"runs {', '.join(sorted(extra))}, which yours does not")
    return RETRACED_OTHERWISE_NOTE.format(how=" and ".join(parts)) if parts else ""


def _traced_unseeded(fn: Any, seed: int | None) -> list[str]:
    """The unseeded stateful random ops ("RandomUniform in __inference_step_12") of the graphs
    ``fn`` (a tf.function) was traced into before check(), where a global seed is set now (or
    check() sets one): check() retraces a copy, whose ops take op seeds from that global seed,
    while the function the user calls keeps the graph it has, with ops that draw from the
    operating system's entropy in every process. It was "reproducible" (probe round 36)."""
    from tensorflow.python.eager import context

    if seed is None and context.global_seed() is None:
        return []
    try:
        concrete = _traced_concrete_functions(fn)
    except Exception:  # noqa: BLE001 - not a tf.function, or one never traced
        return []
    from nddebug.tracer import opaque

    found = []
    for cf in concrete:
        name = cf.function_def.signature.name
        for t in opaque.ops_inside(name, cf.graph):
            if t.endswith("(unseeded)"):
                found.append(f"{t.removesuffix('(unseeded)')} in {name}")
    return sorted(set(found))


#: Said when the step wrote variables (drew from tf.random.Generators) first after
#: check()'s warm-up.
LATE_VARIABLES_NOTE = (
    "The step wrote {n} variable(s) (a tf.random.Generator's state among them, if it drew "
    "from one) that state= does not hold first after check()'s warm-up (a code path the "
    "warm-up did not take): the runs before had moved them on already, so they were not put "
    "back, and the runs started from where the previous ones left them. Pass them (or their "
    "owner) in state= to compare those runs from one state."
)


#: Why an op is not re-executed (OpInfo.rerun), as a confirmation says it.
_BLOCKERS = {
    "stateful": "it changes state (a variable, a random generator, an iterator), and running "
    "it again would change what the step goes on with; only repeated steps compare it",
}


def confirmations(rec: Recording, keys: set[str]) -> dict[str, str]:
    """Per op key: how many of its re-executions in ``rec`` differed from it."""
    counts: dict[str, list[int]] = {}
    blocked: dict[str, str] = {}  # why an op ran but was not re-executed (OpInfo.rerun)
    for ev in rec.events:
        op = rec.ops.get(ev.op_id)
        base = re.sub(r"#\d+$", "", op.key) if op is not None else ""
        if base not in keys:
            continue
        if not ev.reruns:
            if op is not None and op.rerun:
                blocked.setdefault(base, op.rerun)
            continue
        seen = counts.setdefault(base, [0, 0])
        seen[1] += len(ev.reruns)
        seen[0] += sum(1 for again in ev.reruns if list(again) != list(ev.digests))
    out = {}
    for key in keys:
        differed, total = counts.get(key, (0, 0))
        if not total and key in blocked:
            out[key] = f"not re-executed: {_BLOCKERS.get(blocked[key], blocked[key])}"
        elif not total:
            out[key] = "not re-executed (the op did not run again in the confirming step)"
        elif differed:
            # Evidence about the kernel, not the program: a re-execution runs the op alone,
            # and the program's own executions may never vary (a weighted bincount of
            # constants: 64 of 64 re-executions differed, 72 program steps did not; probe
            # round 42, F5). The row is here because they did not differ in these runs.
            out[key] = (
                f"differed in {differed} of {total} re-executions on its recorded inputs, "
                "run alone (the kernel can vary on these inputs; the step's own executions "
                "did not differ in these runs)"
            )
        else:
            out[key] = f"not seen in {total} re-executions on its recorded inputs"
    return out


#: Said when check()'s runs called fresh copies of the functions holding seeded legacy random
#: ops (see tracer.fresh).
SEEDED_KERNELS_NOTE = (
    "The step runs seeded stateful random ops ({ops}) in its functions. Each keeps its place in "
    "its seeded stream inside its kernel, which lives as long as the function and which no "
    "state= can restore: each call of one function draws the next numbers. So each of "
    "check()'s runs called fresh copies of those functions, and their draws were compared "
    "from the start of their streams, where a fresh process's first step starts (a later "
    "step draws further on in the same streams). Your own functions' kernels were left where "
    "they were, for the ordinary step that ends the check."
)


#: Said when seeded stateful random ops still differed: check() could not give them fresh
#: kernels.
STUCK_KERNELS_NOTE = (
    "The seeded stateful random ops {ops} differed from run to run because each keeps its "
    "place in its seeded stream inside its kernel: each call draws the next numbers, which is "
    "not non-determinism (fresh processes draw the same). check() gives them fresh kernels "
    "only in functions it calls from the step's own thread (not eager ops, not an "
    "XLA-compiled function, not another thread's calls): draw with stateless random ops or a "
    "tf.random.Generator in state= to compare them."
)


#: Said when eager random ops with a seed= of their own ran in check()'s runs.
OWN_SEEDS_NOTE = (
    "The step runs random ops eagerly with a seed= of their own ({ops}). TensorFlow keeps one "
    "kernel per seed for the process, and check()'s traced runs drew from it, so the steps "
    "after check() draw further on in its stream than they would have without check() (op "
    "seeds drawn from a global seed alone come from a stream of check()'s own, and yours are "
    "left as they were). Move the op into a tf.function, whose seeded ops check()'s runs give "
    "fresh kernels, or draw with stateless random ops."
)


def _own_seeds(rec: Recording, given: set[int]) -> list[str]:
    """The eager random op types of ``rec`` with a seed of their own: a nonzero seed2 that
    check()'s op-seed stream did not give out (``given``, see state.RandomStreams)."""
    return sorted(
        {
            op.op_type
            for op in rec.ops.values()
            if not op.graph and seeded_random(op) and op.attrs.get("seed2") not in given
        }
    )


def _seeded_kernels(rec: Recording) -> set[str]:
    """The op keys of the seeded stateful random ops (``tf.random.uniform``,
    ``tf.image.random_*`` with a global or op seed) that ``rec`` ran. Their kernels keep
    their generators' positions between calls (TensorFlow resets them only
    when ``tf.random.set_seed`` clears every kernel, the user's too), so two calls of one
    traced function draw different numbers by design; two fresh traces draw the same. An
    unseeded one (seed and seed2 both 0) seeds itself at random: it is not listed."""
    return {op.key for op in rec.ops.values() if seeded_random(op)}


def _not_emulated_note(rec: Recording) -> str:
    """Under emulate_gpu(): the GPU culprits inside calls the runs could not look into (a
    tf.function traced before the check that a Python step calls, an XLA cluster), which ran
    as on this CPU, unemulated ("" if none). Their risk rows named them, but nothing said the
    rehearsal missed them, and the verdict showed no source."""
    from nddebug import emulate

    where = _inside_calls(rec, OPAQUE, lambda t: t if t in emulate.RECIPES else None)
    if not where:
        return ""
    return (
        f"emulate_gpu() did not reach the GPU culprits inside calls it cannot look into ({where})"
        ": they ran as on this CPU, so these runs cannot show them diverge. A tf.function "
        "traced before the check and called by the step: pass it to check() itself, or first "
        "call it inside the step; an XLA cluster: check() goes on with XLA off; a function "
        "restored from a SavedModel: check the code it was made from."
    )


def _passes_note(rec: Recording, first_new_id: int) -> str:
    """What check()'s runs leave behind in a dataset made before the check that reshuffles
    with a seed on every pass ("" if the step began no pass over one): each run was one more
    pass, which nothing can rewind, so the training after check() saw other orders than
    without it (probe round 35, finding 7)."""
    found: set[str] = set()
    for op in rec.ops.values():
        for entry in (op.attrs.get(DATASET_PASSES) or {}).values():
            dataset = str(entry.get("dataset", "")).removeprefix("eager:")
            if dataset.isdigit() and int(dataset) < first_new_id:
                where = f" at {op.location}" if op.location else ""
                found.add(f"{op.op_type}{where}")
    if not found:
        return ""
    return (
        f"The step begins a pass over a dataset made before check() that reshuffles with its "
        f"seed on every pass ({', '.join(sorted(found)[:3])}): each of check()'s runs was one "
        "more pass, which nothing can rewind, so the passes after check() come in other orders "
        "than they would have without it. Check with shuffle(..., "
        "reshuffle_each_iteration=False), or build the dataset inside the step."
    )


#: Ops that write a summary to a file (tf.summary.write and the TensorBoard summaries on it).
SUMMARY_WRITES = re.compile(r"^(Write\w*Summary|ImportEvent)$")


def _ran(rec: Recording, types: re.Pattern[str]) -> list[str]:
    """The ops of those types that ran in ``rec``, as "SaveV2 at train.py:12 (step)"."""
    ran = {ev.op_id for ev in rec.events}
    return sorted(
        {
            f"{op.op_type} at {op.location}" if op.location else op.op_type
            for op_id, op in rec.ops.items()
            if op_id in ran and types.match(op.op_type)
        }
    )


def _summaries_note(rec: Recording) -> str:
    """What check()'s runs add to the user's logs ("" if nothing): every run of a step that
    writes summaries writes them again, at the step number state= put back, so TensorBoard
    showed five points at one step (probe round 35, finding 4). Only the ops that ran."""
    found = _ran(rec, SUMMARY_WRITES)
    if not found:
        return ""
    return (
        f"The step writes summaries ({', '.join(found[:3])}): each of check()'s runs wrote them "
        "again, so the event file holds extra points: at the same step where state= puts the "
        "step counter back (an optimizer's iterations), otherwise at the next step numbers, "
        "which shifts the steps after the check. Check a step that writes no summaries, or "
        "write them outside the checked function."
    )


#: tf.py_function's op: its Python function runs TensorFlow ops where no op callback is.
PY_FUNCTION_TYPES = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless"})
PY_FUNCTIONS = re.compile(r"^(EagerPyFunc|PyFunc|PyFuncStateless)$")


def _py_functions_note(rec: Recording) -> str:
    """What check() cannot see or put back inside a tf.py_function or tf.numpy_function (""
    if the step runs none). TensorFlow runs its Python function on one of its own threads,
    where nddebug's op callbacks are not, so a tf.random.Generator it draws from (or a
    variable it writes) moved on in every run, unrestored and unsaid, and training after the
    check went on from there (probe round 47, F5). A NumPy or Python generator it draws
    from moves on between the runs too: put back after them, but the runs compared other
    draws, as a program run twice in one process draws twice (probe round 48, F2)."""
    found = _ran(rec, PY_FUNCTIONS)
    if not found:
        return ""
    return (
        f"The step runs Python code through tf.py_function or tf.numpy_function "
        f"({', '.join(found[:3])}): TensorFlow runs it on a thread of its own, where nddebug "
        "records nothing, so its output is compared but not what it does. What its TF ops "
        "change (a tf.random.Generator, a variable) is put back between runs, and compared "
        "after each, where state= holds it or the function names it (in its closure or "
        "globals): pass any other as state=. A NumPy or Python generator "
        "it draws from (np.random.default_rng(SEED), np.random.seed) moves on from run to "
        "run, so the runs compare other draws; check() puts it back afterwards. A seeded "
        "one draws the same in fresh processes: `nddebug run` compares those."
    )


#: Ops that write a checkpoint's files (tf.train.Checkpoint.save/write, CheckpointManager).
CHECKPOINT_WRITES = re.compile(r"^(SaveV2|SaveSlices|Save|MergeV2Checkpoints)$")


def _checkpoints_note(rec: Recording) -> str:
    """What check()'s runs do to the user's checkpoints ("" if nothing): every run of a step
    that saves one saves again, and a CheckpointManager numbers each save on and deletes
    the oldest beyond max_to_keep: a check of 3 repeats left ckpt-8..10, and the real
    ckpt-1 and ckpt-2 were gone (probe round 45, F4)."""
    found = _ran(rec, CHECKPOINT_WRITES)
    if not found:
        return ""
    return (
        f"The step saves checkpoints ({', '.join(found[:3])}): each of check()'s runs saved "
        "again, so the folder holds other files than one step would leave: a "
        "CheckpointManager numbers every save on (its save counter is a variable of its own) "
        "and deletes the oldest beyond max_to_keep, which may be checkpoints saved before the "
        "check. Check a step that saves no checkpoint, or save outside the checked function."
    )


def _xla_random_note(rec: Recording) -> str:
    """What check() cannot put back when the step calls XLA-compiled functions holding
    stateful random ops ("" if it does not): XLA ignores their seeds and draws them from a
    counter of the process that every run advances (TensorFlow warns "Using
    tf.random.uniform with XLA compilation will ignore seeds"), so check()'s runs move it on
    and the steps after check() draw other numbers than they would have without it."""

    def random(t: str) -> str | None:
        return t.split("(")[0] if t.endswith(("(random)", "(unseeded)")) else None

    where = _inside_calls(rec, ("xla",), random)
    if not where:
        return ""
    return (
        f"Stateful random ops run inside XLA-compiled functions ({where}). XLA ignores their "
        "seeds and draws from a counter of the process that every call advances: check() "
        "cannot put it back, so the steps after check() draw other random numbers than they "
        "would have without it. Use stateless random ops (tf.random.stateless_uniform, "
        "keras.random with a SeedGenerator) or a tf.random.Generator in compiled functions."
    )


def _inside_calls(
    rec: Recording, functions: Collection[str], pick: Callable[[str], str | None]
) -> str:
    """ "A, B in f; C in g": the op types ``pick`` keeps (of what ``ops_inside`` lists) inside
    the calls of ``rec`` whose kind is one of ``functions``, by the call's name ("" if none)."""
    found: dict[str, set[str]] = {}
    for op in rec.ops.values():
        if op.function not in functions:
            continue
        kept = {p for p in map(pick, op.attrs.get("ops_inside", [])) if p}
        if kept:
            found.setdefault(_call_name(op), set()).update(kept)
    return "; ".join(f"{', '.join(sorted(v))} in {k}" for k, v in sorted(found.items()))


def _call_name(op: Any) -> str:
    """The name a user knows a call by: the function's own name, without TensorFlow's
    "__inference_" prefix and number."""
    from nddebug.tracer.ops import function_name

    return function_name(op.op_type if op.op_type.startswith("__") else op.op_name)


def _uses_xla(fn: Callable[..., Any], models: list[Any]) -> bool:
    """Whether the step as the user wrote it compiles with XLA: a tf.function with
    jit_compile, or a Keras model compiled with it (Keras' default on a GPU)."""
    if getattr(fn, "_jit_compile", None):
        return True
    return any(getattr(m, "jit_compile", False) for m in models)


def assert_deterministic(
    fn: Callable[..., Any], *args: Any, repeats: int = 3, state: Any = None, **kwargs: Any
) -> Report:
    """For your own test suite: check ``fn`` and raise AssertionError with the report's text
    if any op diverged. Returns the report otherwise."""
    report = check(fn, *args, repeats=repeats, state=state, **kwargs)
    if not report.ok:
        raise AssertionError(f"{fn!r} is not deterministic:\n{report}")
    return report


def compare(recordings: Sequence[Recording]) -> Report:
    """Compare recordings made separately (your own loop, other processes, other machines)."""
    if isinstance(recordings, (str, bytes)) or hasattr(recordings, "__fspath__"):
        raise TypeError(
            f"compare() takes a list of recordings, not the path {recordings!r}: "
            "use nddebug.compare(nddebug.load(path))"
        )
    if recordings is None or isinstance(recordings, Recording):
        what = "None" if recordings is None else "a single Recording"
        raise TypeError(
            f"compare() takes a list of two or more recordings, not {what}: record the step "
            "at least twice (e.g. [rec1, rec2]), or load them with nddebug.load(path)"
        )
    recs = list(recordings)
    wrong = [type(r).__name__ for r in recs if not isinstance(r, Recording)]
    if wrong:
        raise TypeError(
            f"compare() takes Recording objects, got {', '.join(sorted(set(wrong)))}: "
            "use the `with nddebug.trace() as rec` objects or nddebug.load(path)"
        )
    recs = [r.whole() for r in recs]  # long blocks written to their file as they ran
    runs = [r for r in recs if r.kind != "capture"]
    captures = [r for r in recs if r.kind == "capture"]
    if any(r.kind == "rerun" for r in runs):
        return Report(runs, mode="rerun", captures=captures)
    return Report(runs, mode="compare", captures=captures)


def load(path: str) -> list[Recording]:
    """Every run saved in a recording file (by ``Recording.save``, ``Report.save`` or
    ``check(path=...)``)."""
    from nddebug import storage

    return storage.load(path)
