"""``nddebug.trace()``: the block that records one run."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator

from nddebug import digest as dg
from nddebug.recording import NOT_COMPARED, Recording
from nddebug.tracer import steps
from nddebug.tracer.recorder import Recorder
from nddebug.tracer.stream import EventStream

RECORD_ENV = "NDDEBUG_RECORD"  # set by `nddebug run` for the processes it starts
LABEL_ENV = "NDDEBUG_LABEL"
EMULATE_ENV = "NDDEBUG_EMULATE_GPU"  # set by `nddebug run --emulate-gpu`
DETAIL_ENV = "NDDEBUG_DETAIL"  # set by `nddebug run --steps / --bisect`


@contextlib.contextmanager
def trace(
    label: str = "",
    path: str | None = None,
    rerun: int = 0,
    emulate_gpu: bool = False,
    record_env: bool = True,
    detail: str | None = None,
) -> Iterator[Recording]:
    """Record every TensorFlow op executed in the block.

    ``with nddebug.trace() as rec:`` gives the :class:`Recording`, filled when the block ends;
    with ``path`` the run is also appended to that recording file; a block longer than a chunk
    of op executions is written to it as it runs, and its Recording then holds no events in
    memory (``rec.whole()`` reads them back; see :mod:`nddebug.tracer.stream`). With
    ``rerun=k`` every stateless op also runs k more times on its own inputs (eagerly at once;
    in graphs as copies of the node), and ``nddebug.compare([rec])`` reports the ops whose
    re-executions differ: kernel non-determinism found in a single step, with no state to
    restore. With ``emulate_gpu`` the block also runs under :func:`nddebug.emulate_gpu`.
    ``record_env=False`` (check()'s own runs) keeps the block out of the file `nddebug run`
    asks for: a script's check() compares its runs itself, and its warm-up is no block of the
    script's.
    ``detail="steps"`` keeps one digest per step instead of every op execution (very long
    runs), ``detail="step:K"`` step K in full and the steps before it as digests
    (``"step:K-L"``: steps K to L in full; see
    :mod:`nddebug.tracer.steps`); `nddebug run` sets it through NDDEBUG_DETAIL.
    """
    if emulate_gpu or os.environ.get(EMULATE_ENV) == "1":
        from nddebug import emulate

        if not emulate.is_active():
            with (
                emulate.emulate_gpu(),
                trace(label, path, rerun, record_env=record_env, detail=detail) as rec,
            ):
                yield rec
            return
    if rerun < 0:
        raise ValueError(f"rerun must be a number of extra executions >= 0, got {rerun}")
    if detail is None:
        detail = os.environ.get(DETAIL_ENV, "ops") if record_env else "ops"
    steps.parse(detail)  # a bad value fails here, before anything runs
    from nddebug import environment

    # `nddebug run` asks every trace block of the script it runs to save into one file.
    if path is None and record_env and os.environ.get(RECORD_ENV):
        path = os.environ[RECORD_ENV]
        label = label or os.environ.get(LABEL_ENV, "")
        _note_entered(path)
    if path is not None:
        # A folder, a missing folder or a file that is no recording fails here, before the
        # block runs, not when it ends and the training it recorded is over (probe round 37).
        from nddebug import storage

        storage.check_appendable(path)
    rec = Recording(label=label, digest_algorithm=dg.ALGORITHM, kind="rerun" if rerun else "run")
    rec.environment = environment.capture()
    recorder = Recorder(rec, rerun=rerun, detail=detail)
    if path is not None:
        recorder.stream = EventStream(path, rec)
    drawn_from = _python_random_states() if rerun else None
    owner = os.getpid()
    _OPEN.append(rec)
    recorder.start()
    try:
        yield rec
    except SystemExit as exc:
        # sys.exit(0) (or sys.exit()) inside the block ends the program as it was meant to
        # end: what ran is the whole run. Another code is a failure, as any exception is.
        if exc.code not in (None, 0):
            rec.status = "interrupted"
        raise
    except BaseException:
        rec.status = "interrupted"
        raise
    finally:
        if rec in _OPEN:
            _OPEN.remove(rec)
        if os.getpid() != owner:
            # A child forked inside the block (os.fork) leaving it: its copy of the run has
            # the parent's run id and half its events. Saved, it took the parent's place in
            # the file, and two runs that differed after the fork were "reproducible" (probe
            # round 45, F6). The parent's block saves the run.
            path = None
            rec.warnings.append(FORKED_CHILD_NOTE)
        if not rec.environment.get("devices"):  # TensorFlow made them inside the block
            rec.environment["devices"] = environment.devices()
        recorder.stop()
        _determinism_set_inside(rec)
        if drawn_from is not None:
            _python_draws(rec, drawn_from)
        if not rec.events and not (recorder.stream is not None and recorder.stream.started):
            rec.warnings.append(
                "No TensorFlow op ran inside the block: nothing was recorded. Put the training "
                "step itself (not only the model construction) inside nddebug.trace()."
            )
        if path is not None:
            stream = recorder.stream
            # A long block wrote its chunks as it went: write the rest and close the run.
            save = stream.finish if stream.started else (lambda: rec.save(path))
            if sys.exc_info()[0] is None:
                save()
            else:
                # The block raised: its own exception goes on to the caller; failing to save
                # the interrupted run must not replace it.
                try:
                    save()
                except Exception as exc:  # noqa: BLE001 - reported, never masks the user's
                    warnings.warn(
                        f"nddebug: the interrupted run could not be saved to {path}: {exc}",
                        RuntimeWarning,
                        stacklevel=3,
                    )


#: The blocks open in this process (a fork inside one is said in its run).
_OPEN: list[Recording] = []
#: Said in the run of a block the process forked inside.
FORKED_NOTE = (
    "The process forked inside the block (os.fork, a multiprocessing 'fork' pool): what the "
    "child processes computed is not recorded here; what they hand back is compared where it "
    "enters TensorFlow."
)
#: Said in a forked child's copy of the run, which is not saved.
FORKED_CHILD_NOTE = (
    "This process was forked inside the block: its copy of the run is not saved (the parent's "
    "block saves the run)."
)


def _forked_in_parent() -> None:
    for rec in list(_OPEN):
        if FORKED_NOTE not in rec.warnings:
            rec.warnings.append(FORKED_NOTE)


def _forked_in_child() -> None:
    _OPEN.clear()  # the parent's blocks: this process saves none of them


os.register_at_fork(after_in_parent=_forked_in_parent, after_in_child=_forked_in_child)


def _python_random_states() -> dict[str, str]:
    """Python's and NumPy's global random states, by name, as digests (cheap: a few KB)."""
    import hashlib
    import random

    import numpy as np

    states = {"Python's random module": repr(random.getstate()).encode()}
    try:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        states["NumPy's np.random"] = keys.tobytes() + repr((name, pos, has_gauss, cached)).encode()
    except (TypeError, ValueError, AttributeError):
        pass  # a global state of another kind: not compared, as before
    return {k: hashlib.sha256(v).hexdigest() for k, v in states.items()}


def _python_draws(rec: Recording, before: dict[str, str]) -> None:
    """A rerun block whose code drew from Python's or NumPy's global random state: the values
    it made enter TensorFlow without an op (a tensor made from a NumPy array), and re-executing
    ops on their own inputs cannot compare them. An eager step fed ``np.random.rand`` was
    "reproducible" in rerun mode while two plain calls differed (probe round 38). Repeated
    steps compare such values as the inputs of the ops that read them."""
    after = _python_random_states()
    drawn = [name for name, state in before.items() if after.get(name) != state]
    if drawn:
        rec.warnings.append(
            f"{NOT_COMPARED}the block drew from {' and '.join(drawn)} global random state: "
            "values made in Python enter TensorFlow without an op, and rerun mode compares "
            "each op's re-executions on its own inputs, not values from one run to the next. "
            "Repeat the step (nddebug.check's default mode) to compare them."
        )


def _determinism_set_inside(rec: Recording) -> None:
    """Op determinism switched inside the block (``nddebug run --all`` opens the block before
    the script's first line, which may call enable_op_determinism()): the run is described
    with the setting its ops ran under at the end, and the switch is said."""
    from nddebug import environment

    was = rec.environment.get("op_determinism")
    now = environment.op_determinism_enabled()
    if was is None or was == now:
        return
    rec.environment["op_determinism"] = now
    rec.warnings.append(
        f"Op determinism was turned {'on' if now else 'off'} inside the block (it was "
        f"{'on' if was else 'off'} when the block began): the ops that ran before that ran "
        f"{'without' if now else 'with'} it."
    )


#: Beside the file `nddebug run` gives a run: a line per trace() block the script entered,
#: so that a process that ends inside a block (os._exit) is told from one that ran none.
ENTERED_SUFFIX = ".entered"


def _note_entered(path: str) -> None:
    try:
        with open(path + ENTERED_SUFFIX, "a", encoding="utf-8") as f:
            f.write("block\n")
    except OSError:
        pass  # only a better message is lost
