"""Where in the user's code an op was made: the innermost frame outside TensorFlow, Keras,
every other installed library (site-packages: keras-hub, tf-keras, …), the standard library
and nddebug itself (nddebug's examples count as user code). An op made inside a library
called from there (a Keras layer run by ``fit``) also names its name scope, the layer path."""

from __future__ import annotations

import contextlib
import functools
import os
import site
import sys
import sysconfig
import threading
from typing import Any

from nddebug.tracer.registry import REGISTRY

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLES_DIR = os.path.join(_PACKAGE_DIR, "examples") + os.sep


_LIBRARIES = ("tensorflow", "keras", "tf_keras", "absl", "optree", "numpy")


def library_dirs() -> tuple[str, ...]:
    """The folders of installed code (not the user's), as asked by every trace() block: the
    interpreter's paths once, the libraries' folders as far as they are imported now."""
    return _library_dirs(tuple(name in sys.modules for name in _LIBRARIES))


@functools.lru_cache(maxsize=64)
def _library_dirs(imported: tuple[bool, ...]) -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = [_PACKAGE_DIR, paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"]]
    try:
        dirs += [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:  # an embedded interpreter's site module may lack them
        pass
    for name, present in zip(_LIBRARIES, imported, strict=True):
        mod = sys.modules.get(name) if present else None
        if mod is not None and getattr(mod, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(mod.__file__)))
    return tuple(sorted({os.path.abspath(d) + os.sep for d in dirs if d}))


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str, lib_dirs: tuple[str, ...]) -> bool:
    """User code is anything outside TF, Keras, the stdlib and nddebug (but nddebug's
    examples are user code: they stand for a user's training script)."""
    if filename.startswith("<") and not filename.startswith("<ipython-input"):
        return False
    if "__autograph_generated_file" in filename:
        return False  # a temporary copy made by autograph; its name changes every process
    path = os.path.abspath(filename)
    return path.startswith(_EXAMPLES_DIR) or not path.startswith(lib_dirs)


def format_location(filename: str, lineno: int, name: str) -> str:
    return f"{filename}:{lineno} ({name})"


#: Lines of autograph's generated files -> the user's line they came from (file, line,
#: function), for every function autograph converted in the process since the first trace.
_AUTOGRAPH_LINES: dict[tuple[str, int], tuple[str, int, str]] = {}
_autograph_hooked = False


def hook_autograph() -> None:
    """Remember the source map of every function autograph converts. TensorFlow maps the
    frames of a generated file back to the user's line only on the thread that called the
    converted function (its source mappers are per thread): an op a ``MirroredStrategy``
    replica thread made in the user's ``replica_fn`` (converted with the tf.function around
    it) kept the generated file's frame, which no user line matched, and was placed at the
    line that called the step. Installed at the first trace and never removed."""
    global _autograph_hooked
    if _autograph_hooked:
        return
    try:
        from tensorflow.python.autograph.impl import api
    except ImportError:  # another TensorFlow: its own mapping is all there is
        return
    original = api.StackTraceMapper.__init__

    @functools.wraps(original)
    def __init__(self: Any, converted_fn: Any) -> None:
        original(self, converted_fn)
        for loc, origin in (getattr(converted_fn, "ag_source_map", None) or {}).items():
            with contextlib.suppress(AttributeError):
                _AUTOGRAPH_LINES[(loc.filename, loc.lineno)] = (
                    origin.loc.filename,
                    origin.loc.lineno,
                    origin.function_name,
                )

    api.StackTraceMapper.__init__ = __init__
    _autograph_hooked = True


def _user_frame(filename: str, lineno: int, name: str, lib_dirs: tuple[str, ...]) -> Any:
    """A frame as the user's (file, line, function), a generated file's mapped back to its
    source (see :func:`hook_autograph`); None if it is not the user's code."""
    if "__autograph_generated_file" in filename:
        mapped = _AUTOGRAPH_LINES.get((filename, lineno))
        if mapped is None:
            return None
        filename, lineno, name = mapped
    return (filename, lineno, name) if is_user_file(filename, lib_dirs) else None


def graph_location(op: Any, lib_dirs: tuple[str, ...]) -> str:
    """The user frame of a graph op's creation traceback.

    Read by index from the innermost frame: the user frame is usually a few frames out, and
    materialising the whole stack cost ~0.2 ms per op of an instrumented function's tracing."""
    try:
        frames = op.traceback
        n = len(frames)
    except Exception:  # noqa: BLE001
        return ""
    for i in range(n - 1, -1, -1):
        frame = frames[i]
        user = _user_frame(frame.filename, frame.lineno, frame.name, lib_dirs)
        if user is not None:
            where = format_location(*user)
            if _through_model_library(frames, i + 1, n):
                # Made inside a model library called from here: every op of a Keras step
                # would name the same `fit` line; the name scope says which layer made it.
                where += _scope(op)
            return where
    # The same for every op a replica thread makes in this graph: looked up once per graph.
    cache = REGISTRY.graph_cache(op.graph)
    if "<distribution caller>" not in cache:
        cache["<distribution caller>"] = _distribution_caller(lib_dirs)
    caller = cache["<distribution caller>"]
    return caller + _scope(op) if caller else ""


def creation_location(op: Any, frame: Any, lib_dirs: tuple[str, ...]) -> str:
    """:func:`graph_location` for an op being made now, read from the live stack from
    ``frame`` (the frame that invoked the op callbacks, inside TensorFlow's op creation)
    outwards: the frames op.traceback holds, without asking TensorFlow for them. Reading
    that traceback (each frame converted from C++) was ~0.2 ms of every op of an
    instrumented function's first call; walking live frames costs microseconds. Where no
    frame is the user's (a replica thread), the traceback's reading decides."""
    through_library = False
    while frame is not None:
        code = frame.f_code
        user = _user_frame(code.co_filename, frame.f_lineno, code.co_name, lib_dirs)
        if user is not None:
            where = format_location(*user)
            return where + _scope(op) if through_library else where
        through_library = through_library or _outside_tf(code.co_filename)
        frame = frame.f_back
    return graph_location(op, lib_dirs)


def _scope(op: Any) -> str:
    scope = str(getattr(op, "name", "")).rpartition("/")[0]
    return f" in {scope}" if scope else ""


_DISTRIBUTE = f"{os.sep}tensorflow{os.sep}python{os.sep}distribute{os.sep}"


def _distribution_caller(lib_dirs: tuple[str, ...]) -> str:
    """The user's line for an op made on a thread that runs no user code: a replica thread of
    ``MirroredStrategy`` tracing Keras's train step, whose stack starts in ``threading`` and
    holds only TensorFlow and Keras frames. The thread that called the strategy (``fit``, or
    a loop's ``strategy.run``) waits inside ``tensorflow/python/distribute`` meanwhile: its
    innermost user frame is the line that made the op run."""
    me = threading.get_ident()
    for ident, top in sys._current_frames().items():
        if ident == me:
            continue
        frame, waits = top, False
        while frame is not None:
            name = frame.f_code.co_filename
            waits = waits or _DISTRIBUTE in name
            if waits and is_user_file(name, lib_dirs):
                return format_location(name, frame.f_lineno, frame.f_code.co_name)
            frame = frame.f_back
    return ""


@functools.cache
def _tf_dir() -> str:
    mod = sys.modules.get("tensorflow")
    path = getattr(mod, "__file__", None) if mod is not None else None
    return os.path.dirname(os.path.abspath(path)) + os.sep if path else "\0"


def _through_model_library(frames: Any, start: int, end: int) -> bool:
    """Whether the frames from ``start`` to ``end`` pass through a library other than
    TensorFlow itself (Keras, keras-hub, …), where the line alone does not say which part of
    the model made the op."""
    for k in range(start, end):
        if _outside_tf(frames[k].filename):
            return True
    return False


@functools.lru_cache(maxsize=4096)
def _outside_tf(filename: str) -> bool:
    """Whether a frame's file is a real file outside TensorFlow (asked for every frame of
    every op's traceback: a Keras op's stack is ~40 frames of a few dozen files)."""
    return not filename.startswith("<") and not os.path.abspath(filename).startswith(_tf_dir())


def eager_location(lib_dirs: tuple[str, ...]) -> tuple[str, str]:
    """Where in user code an eager op ran, and the same without the directory (stable across
    machines, so it can key the op)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename, lib_dirs):
            name = os.path.basename(code.co_filename)
            return (
                format_location(code.co_filename, frame.f_lineno, code.co_name),
                format_location(name, frame.f_lineno, code.co_name),
            )
        frame = frame.f_back
    return "", ""


def library_callers(lib_dirs: tuple[str, ...]) -> str:
    """The library functions between the user's code and a function call it led to, outermost
    first (``"TensorFlowTrainer.fit > TensorFlowTrainer.evaluate > ..."``), without
    TensorFlow's and nddebug's own frames; "" when the user's code made the call itself.
    Keras's train and test functions are both ``multi_step_on_iterator``, called from one line
    of the user's code (``model.fit``): only this tells a validation call from a step."""
    names: list[str] = []
    skip = _not_library()
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename, lib_dirs):
            break
        if not code.co_filename.startswith(skip):
            names.append(getattr(code, "co_qualname", code.co_name))
        frame = frame.f_back
    return " > ".join(reversed(names))


#: The Keras methods whose frame holds the model as ``self`` when they call its train, test
#: or predict function.
_KERAS_LOOPS = frozenset({"fit", "evaluate", "predict"})


def keras_steps_per_execution() -> int:
    """The ``steps_per_execution`` of the Keras model whose ``fit``, ``evaluate`` or
    ``predict`` is running on this thread (0 where none is): how many batches one call of its
    train function takes at most. Asked once per call site, never per op."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in _KERAS_LOOPS and "keras" in frame.f_code.co_filename:
            k = getattr(frame.f_locals.get("self"), "steps_per_execution", None)
            with contextlib.suppress(TypeError, ValueError):
                return max(1, int(k))
        frame = frame.f_back
    return 0


@functools.cache
def _not_library() -> tuple[str, ...]:
    """Frames that are not a library's calling code: TensorFlow's own, nddebug's, the
    stdlib's (threading, contextlib), and code with no file."""
    dirs = [_PACKAGE_DIR, sysconfig.get_paths()["stdlib"]]
    tf = sys.modules.get("tensorflow")
    if tf is not None and getattr(tf, "__file__", None):
        dirs.append(os.path.dirname(os.path.abspath(tf.__file__)))
    return (*(d + os.sep for d in dirs), "<")
