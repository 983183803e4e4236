"""IPython integration: ``%load_ext nddebug`` registers the ``%%nddebug`` cell magic.

The cell body is the training step: ``%%nddebug`` runs it several times with
:func:`nddebug.check` and shows the report. It exists because a notebook's step is usually a
cell, not a function, and wrapping it in a ``def`` just to check it breaks the flow of the
notebook. This module imports IPython; ``import nddebug`` does not import this module.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class

from nddebug.check import check
from nddebug.errors import NddebugError
from nddebug.report import Report

REPORT_NAME = "_nddebug_report"  # where the last report is left in the user's namespace


@magics_class
class NddebugMagics(Magics):
    """The ``%%nddebug`` cell magic."""

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "-n",
        "--repeats",
        type=int,
        default=3,
        help="how many times to run the cell and compare (at least 2; default 3)",
    )
    @magic_arguments.argument(
        "--state",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME",
        help="names of variables the cell changes (a Keras model, optimizer, tf.Variable or a "
        "list of them): restored before every run",
    )
    @magic_arguments.argument(
        "--seed", type=int, default=None, help="set the Python, NumPy, TF and Keras seeds"
    )
    @magic_arguments.argument(
        "-o",
        "--output",
        metavar="FILE",
        default=None,
        help="save the report: a .html name gets the HTML page, any other name the recording "
        "file (nddebug report FILE shows it again)",
    )
    @cell_magic
    def nddebug(self, line: str, cell: str) -> Report:
        """Check the cell for non-determinism: run it -n times with identical state, compare
        every TensorFlow op's outputs bitwise, and show which op made the runs differ.

        The cell runs in the notebook's namespace. tf.functions in the namespace are
        retraced for the check, so their ops are seen even if they ran before. Every run starts
        from the namespace as it was (names the cell binds, items of lists, dicts and sets it
        changes in place). Afterwards the state is as after one ordinary run of the cell, and
        the report is also stored in ``_nddebug_report``.

        ``-o FILE`` is checked before the cell runs (its folder must exist and be writable; an
        existing recording file must be one nddebug can append to) and written after the
        check. If writing fails then, the report is still shown and stored, and the error is
        printed.
        """
        args = magic_arguments.parse_argstring(self.nddebug, line)
        if args.repeats < 2:
            raise UsageError(f"-n must be at least 2 to compare runs, got {args.repeats}")
        if not cell.strip():
            raise UsageError("%%nddebug needs a cell body: the training step to check")
        ns = self.shell.user_ns
        missing = [name for name in args.state if name not in ns]
        if missing:
            raise UsageError(
                f"--state {missing[0]}: no variable named {missing[0]!r} in the namespace"
            )
        values = [ns[name] for name in args.state]
        state = None if not values else values[0] if len(values) == 1 else values
        if args.output:
            _check_output(args.output)  # before the cell runs even once

        step = _CellStep(self.shell, cell)
        report = check(step, repeats=args.repeats, state=state, seed=args.seed)
        ns[REPORT_NAME] = report
        if args.output:
            try:
                _save(report, args.output)
            except (OSError, NddebugError) as exc:
                # The runs are done: keep the report, say what went wrong.
                print(
                    f"nddebug: the report was not saved to {args.output} ({exc}); it is in "
                    f"{REPORT_NAME} (.save(FILE) writes the recording file)",
                    file=sys.stderr,
                )
        return report


class _CellStep:
    """The cell as a step function for :func:`nddebug.check`.

    While a trace is active, every tf.function in the user's namespace is replaced by a fresh
    copy of itself: a function traced before the check would otherwise run as one opaque,
    uninstrumented call. The copies are made once per set of captured ops (check() retraces
    for its capture runs). Outside tracing, when check() lets the step run once more to
    advance the state, the cell runs with the user's own functions.
    """

    def __init__(self, shell: Any, cell: str) -> None:
        self.shell = shell
        source = shell.transform_cell(cell)
        # A file name IPython knows (and, in ipykernel, a real file): tracebacks show the cell's
        # lines, and nddebug's "created at" locations point into the cell.
        filename = shell.compile.cache(source, shell.execution_count, raw_code=cell)
        self.code = compile(source, filename, "exec")
        self._copies: dict[frozenset[str], dict[str, Any]] = {}
        self._names: dict[str, Any] | None = None  # the namespace before the first run
        self._contents: dict[str, Any] = {}  # and its lists', dicts' and sets' items

    def _reset(self) -> None:
        """Start every run from the namespace as the magic found it: the names the cell binds
        (``i += 1``, ``loss = ...``) and the items of the lists, dicts and sets it changes in
        place (``hist.append(i)``). check() runs the cell 5 to 8 times: the notebook was left
        with ``i == 5``, and a step fed ``i`` differed in every run by the magic's own doing
        (probe round 46). Deeper changes (an object's attributes, a list inside a list) are
        not undone."""
        import copy

        ns = self.shell.user_ns
        if self._names is None:
            self._names = dict(ns)
            self._contents = {
                name: copy.copy(value)
                for name, value in ns.items()
                if type(value) in (list, dict, set)
            }
            return
        for name in [n for n in ns if n not in self._names]:
            del ns[name]  # bound by an earlier run
        ns.update(self._names)
        for name, items in self._contents.items():
            value = self._names[name]
            if isinstance(value, list):
                value[:] = items
            else:
                value.clear()
                value.update(items)

    def __call__(self) -> None:
        from nddebug.tracer import Recorder

        self._reset()
        ns = self.shell.user_ns
        active = Recorder.active
        if active is None:
            exec(self.code, ns)
            return
        copies = self._fresh_functions(frozenset(active.capture or ()))
        originals = {name: ns[name] for name in copies if name in ns}
        ns.update(copies)
        try:
            exec(self.code, ns)
        finally:
            for name, fn in copies.items():
                if ns.get(name) is fn:  # unless the cell itself rebound the name
                    if name in originals:
                        ns[name] = originals[name]
                    else:
                        del ns[name]

    def _fresh_functions(self, capture: frozenset[str]) -> dict[str, Any]:
        if capture not in self._copies:
            import tensorflow as tf
            from tensorflow.python.eager.polymorphic_function import polymorphic_function

            copies = {}
            for name, value in list(self.shell.user_ns.items()):
                if isinstance(value, polymorphic_function.Function) and not name.startswith("_"):
                    copies[name] = tf.function(
                        value.python_function,
                        input_signature=value.input_signature,
                        reduce_retracing=getattr(value, "_reduce_retracing", False),
                        jit_compile=False,  # XLA clusters cannot hold nddebug's callbacks
                    )
            self._copies[capture] = copies
        return self._copies[capture]


def _is_html(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in (".html", ".htm")


def _check_output(path: str) -> None:
    """A UsageError (one line) if ``-o`` cannot be written: no such folder, not writable, or
    (for a recording) an existing file nddebug may not append to."""
    if _is_html(path):
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise UsageError(f"-o {path}: no folder {folder} to save it in; nothing was run")
        if not os.access(folder, os.W_OK) or os.path.isdir(path):
            raise UsageError(f"-o {path}: cannot write a file there; nothing was run")
        return
    from nddebug import storage

    try:
        storage.check_appendable(path)
    except NddebugError as exc:
        raise UsageError(f"-o {exc}; nothing was run") from None


def _save(report: Report, path: str) -> None:
    """Write the report to ``-o``: the HTML page, or every run to the recording file (those
    of the XLA-compiled check first, as check(path=...) writes them)."""
    if _is_html(path):
        from nddebug.render import html

        with open(path, "w", encoding="utf-8") as f:
            f.write(html.page(report))
        return
    from nddebug import storage

    runs = []
    for part in (report.as_compiled, report):
        if part is not None:
            runs += part.recordings + part.captures
    storage.save(runs, path)


def load_ipython_extension(ipython: Any) -> None:
    """Register the ``%%nddebug`` magic (``%load_ext nddebug`` calls this)."""
    ipython.register_magics(NddebugMagics)
