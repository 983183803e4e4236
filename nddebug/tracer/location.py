"""Where in the user's code an op was made: the innermost frame outside TensorFlow, Keras,
the standard library and nddebug itself (nddebug's examples count as user code)."""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from typing import Any

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLES_DIR = os.path.join(_PACKAGE_DIR, "examples") + os.sep


def library_dirs() -> tuple[str, ...]:
    dirs = [_PACKAGE_DIR, sysconfig.get_paths()["stdlib"]]
    for name in ("tensorflow", "keras", "tf_keras", "absl", "optree", "numpy"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(mod.__file__)))
    return tuple(d + os.sep for d in dirs)


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
        if is_user_file(frame.filename, lib_dirs):
            return format_location(frame.filename, frame.lineno, frame.name)
    return ""


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
