"""nddebug's native ops: the digest in one pass over the bytes, and a process-global buffer
that traced graphs append digest rows to, drained by the host once per top-level call. The
tracer mostly uses the fused op (digest an op's outputs and append its row, one op per op);
the separate digest and record ops serve the cases it does not cover.

The C++ source (``nddebug_ops.cc``) ships with the package and is compiled on first use with
the C++ compiler TensorFlow's headers need (``g++`` unless ``$CXX``), against the installed
TensorFlow, into a per-user cache keyed by the TensorFlow version and the source's hash
(``$NDDEBUG_CACHE_DIR``, else ``$XDG_CACHE_HOME/nddebug``, else ``~/.cache/nddebug``).
``python -m nddebug.native build`` builds it ahead of time. Next to the library a sidecar file
(``<library>.json``) holds its size and SHA-256 as built; a library that does not match it (a
truncated copy would kill the process with SIGBUS inside ``tf.load_op_library``), or that has
no sidecar, is rebuilt before it is loaded.

Why optional: a compiler or TensorFlow's headers may be missing. Then the tracer uses the
pure-TF digest and one host callback per op, and the recording says so in a warning.
``NDDEBUG_NATIVE=0`` chooses that path on purpose.

On a GPU all three ops run on the device (the fused op, the digest op for function arguments
and the record op for outputs digested already), so no tensor crosses to the host inside a
step: ``nddebug_digest.cu`` holds the kernels, and
``nddebug_digest.ptx`` beside it is what NVRTC compiles them to (``python -m nddebug.native
ptx`` regenerates it where NVRTC is installed, e.g. ``pip install nvidia-cuda-nvrtc-cu12``).
The library hands the PTX to the CUDA driver, which compiles it for the GPU at hand, so
neither building nor running needs a CUDA toolkit. Where the PTX is missing, or
``NDDEBUG_NATIVE_GPU=0``, a machine with a GPU uses the pure-TF path, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nddebug import digest as dg

ENV = "NDDEBUG_NATIVE"  # "0": never use the native ops
CACHE_ENV = "NDDEBUG_CACHE_DIR"
SOURCE = Path(__file__).with_name("nddebug_ops.cc")
CUDA_SOURCE = Path(__file__).with_name("nddebug_digest.cu")
PTX = Path(__file__).with_name("nddebug_digest.ptx")
GPU_ENV = "NDDEBUG_NATIVE_GPU"  # "0": never digest on the GPU with the native kernels
#: What NVRTC compiles the kernels for: PTX for compute capability 6.0 runs, through the
#: driver's compiler, on every GPU TensorFlow 2.x supports.
NVRTC_OPTIONS = ("--gpu-architecture=compute_60", "-std=c++14")

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "lib": Native | None, "problem": str


class NativeBuildError(RuntimeError):
    """The native library could not be compiled or loaded."""


@dataclass(frozen=True)
class Native:
    """The loaded library: the TF op wrappers and the C functions of the same .so."""

    path: Path
    ops: Any
    clib: Any
    gpu: bool = False  # the fused op has working GPU kernels (the PTX was handed over)

    def digest(self, gate: Any, tensors: list[Any]) -> Any:
        """int64 [len(tensors), 2]: the digests (zeros while ``gate`` is 0)."""
        graph = getattr(gate, "graph", None)
        if graph is None or not hasattr(graph, "_create_op_internal"):
            return self.ops.nddebug_digest(gate=gate, x=tensors)
        types = [t.dtype.as_datatype_enum for t in tensors]
        attrs = {"T": _attr(list={"type": types})}
        return _create(graph, "NddebugDigest", [gate, *tensors], attrs, 1)[0]

    def record(self, op_id: int, out_digests: list[Any], in_digests: list[Any]) -> Any:
        """The op that appends one row to the buffer when a trace is active."""
        digests = [*out_digests, *in_digests]
        graph = getattr(digests[0], "graph", None)
        if graph is None or not hasattr(graph, "_create_op_internal"):
            return self.ops.nddebug_record(digests=digests, op_id=op_id, n_out=len(out_digests))
        attrs = {
            "N": _attr(i=len(digests)),
            "op_id": _attr(i=op_id),
            "n_out": _attr(i=len(out_digests)),
        }
        return _create(graph, "NddebugRecord", digests, attrs, 0)

    def digest_record(
        self,
        op_id: int,
        tensors: list[Any],
        in_digests: list[Any],
        in_static: list[tuple[int, int]] = (),
        in_static_at: list[int] = (),
    ) -> list[Any]:
        """The fused op: while a trace is active, the digests of ``tensors`` (int64 [1, 2]
        each; zeros outside) and one row for ``op_id`` appended to the buffer. ``in_static``
        are input digests known when the graph was built, at positions ``in_static_at`` of
        the row's inputs."""
        static = [int(v) for pair in in_static for v in pair]
        graph = getattr(tensors[0], "graph", None)
        if graph is None or not hasattr(graph, "_create_op_internal"):
            return self.ops.nddebug_digest_record(
                x=tensors,
                in_digests=in_digests,
                M=len(tensors),
                op_id=op_id,
                in_static=static,
                in_static_at=list(in_static_at),
            )
        attrs = {
            "T": _attr(list={"type": [t.dtype.as_datatype_enum for t in tensors]}),
            "N": _attr(i=len(in_digests)),
            "M": _attr(i=len(tensors)),
            "op_id": _attr(i=op_id),
            "in_static": _attr(list={"i": static}),
            "in_static_at": _attr(list={"i": list(in_static_at)}),
        }
        return _create(graph, "NddebugDigestRecord", [*tensors, *in_digests], attrs, len(tensors))

    def set_active(self, on: bool) -> None:
        self.clib.nddebug_set_active(1 if on else 0)

    def is_active(self) -> bool:
        """Whether the buffer is on (a trace() block is recording)."""
        return bool(self.clib.nddebug_is_active())

    def set_simd(self, on: bool) -> bool:
        """Digest with the widest loop this CPU runs well (``True``, the default: AVX-512 on
        x86-64 CPUs with AVX-512 F, DQ and IFMA, else AVX2 where the CPU has it) or the
        portable one; all give the same digest.
        Returns whether a SIMD loop is now in use. For tests and benchmarks that compare
        them."""
        return bool(self.clib.nddebug_set_simd(1 if on else 0))

    #: The digest loops by name, as :meth:`set_loop` takes them.
    LOOPS = ("portable", "avx2", "avx512")

    def loop(self) -> str:
        """The name of the loop that digests now (see :attr:`LOOPS`)."""
        return self.LOOPS[self.clib.nddebug_loop()]

    def set_loop(self, name: str) -> bool:
        """Digest with one named loop of :attr:`LOOPS`. Returns False, and changes nothing,
        where this CPU does not run it. ``set_simd(True)`` goes back to the widest."""
        if name not in self.LOOPS:
            raise ValueError(f"unknown digest loop {name!r}; expected one of {self.LOOPS}")
        return bool(self.clib.nddebug_set_loop(self.LOOPS.index(name)))

    def drain(self) -> list[int]:
        """Every row appended since the last drain, flat, in arrival order."""
        import numpy as np

        ptr = ctypes.POINTER(ctypes.c_int64)()
        n = self.clib.nddebug_drain(ctypes.byref(ptr))
        # Through NumPy: one C loop makes the Python ints (slicing the pointer makes each
        # through ctypes, ~0.3 us a row).
        return np.ctypeslib.as_array(ptr, shape=(n,)).tolist() if n else []

    def drain_split(self) -> tuple[list[int], list[int]]:
        """The same rows as :meth:`drain`, split in two: three ints a row (op id, n_out,
        n_in), and every row's digest values one after the other."""
        import numpy as np

        heads, words = ctypes.POINTER(ctypes.c_int64)(), ctypes.POINTER(ctypes.c_int64)()
        n_words = ctypes.c_int64()
        n = self.clib.nddebug_drain_split(
            ctypes.byref(heads), ctypes.byref(words), ctypes.byref(n_words)
        )
        if not n:
            return [], []
        as_list = np.ctypeslib.as_array
        return (
            as_list(heads, shape=(n,)).tolist(),
            as_list(words, shape=(n_words.value,)).tolist() if n_words.value else [],
        )

    def digest_array(self, array: Any) -> tuple[int, int]:
        """The digest of a host NumPy array, read in place (no copy) by the C++ code."""
        import numpy as np

        a = np.ascontiguousarray(array)
        out = (ctypes.c_int64 * 2)()
        ptr = ctypes.cast(a.ctypes.data, ctypes.c_char_p)
        self.clib.nddebug_digest_bytes(ptr, a.nbytes, out)
        return int(out[0]), int(out[1])

    def digest_bytes(self, data: bytes | memoryview) -> tuple[int, int]:
        """The digest of host bytes, through the same C++ code as the op (for tests)."""
        buf = bytes(data)
        out = (ctypes.c_int64 * 2)()
        self.clib.nddebug_digest_bytes(buf, len(buf), out)
        return int(out[0]), int(out[1])


def _attr(**kwargs: Any) -> Any:
    from tensorflow.core.framework import attr_value_pb2

    return attr_value_pb2.AttrValue(**kwargs)


def _create(graph: Any, op_type: str, inputs: list[Any], attrs: dict, n_out: int) -> Any:
    """Create a graph op directly: the generated wrappers' argument checks cost ~0.2 ms per op,
    which adds up to a large part of an instrumented function's first call."""
    import tensorflow as tf

    op = graph._create_op_internal(op_type, inputs, [tf.int64] * n_out, attrs=attrs)
    return op.outputs if n_out else op


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nddebug"


def _flags() -> tuple[list[str], list[str]]:
    import tensorflow as tf

    return list(tf.sysconfig.get_compile_flags()), list(tf.sysconfig.get_link_flags())


def library_path() -> Path:
    """Where the library for this TensorFlow and this source lives (built or not). The name
    holds TensorFlow's version and a hash of the source and TensorFlow's build flags, with
    the folder TensorFlow is installed in left out: the same TensorFlow elsewhere (another
    virtual environment, a GPU machine without TensorFlow's headers) finds a library built
    here in ``$NDDEBUG_CACHE_DIR``."""
    import tensorflow as tf

    compile_flags, link_flags = _flags()
    flags = " ".join([*compile_flags, *link_flags])
    for folder in (tf.sysconfig.get_include(), tf.sysconfig.get_lib()):
        flags = flags.replace(folder, "<tensorflow>")
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(flags.encode())
    return cache_dir() / f"nddebug_ops-tf{tf.__version__}-{h.hexdigest()[:16]}.so"


def sidecar_path(library: Path) -> Path:
    """The file that records the library's size and SHA-256 as built."""
    return library.with_name(library.name + ".json")


def _fingerprint(path: Path | str) -> dict[str, Any]:
    data = Path(path).read_bytes()
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def damage(library: Path) -> str:
    """Why the cached library must not be loaded ("" if it is whole): missing, no sidecar,
    or a size or hash other than the sidecar's (a truncated or overwritten file)."""
    if not library.exists():
        return "not built"
    sidecar = sidecar_path(library)
    try:
        want = json.loads(sidecar.read_text(encoding="utf-8"))
        size, digest = int(want["size"]), str(want["sha256"])
    except FileNotFoundError:
        return f"{library} has no size/hash record ({sidecar.name}): not verifiable"
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return f"{library}'s size/hash record {sidecar.name} is unreadable ({exc})"
    try:
        have = _fingerprint(library)
    except OSError as exc:
        return f"{library} is unreadable ({exc})"
    if have["size"] != size:
        return f"{library} is {have['size']} bytes, {size} when built: truncated or damaged"
    if have["sha256"] != digest:
        return f"{library} does not match the SHA-256 recorded when it was built: damaged"
    return ""


def build(force: bool = False) -> Path:
    """Compile the library unless the cache holds it whole (see :func:`damage`); returns its
    path.

    Atomic: the compiler writes a temporary file in the cache directory that is renamed into
    place, then its size and hash go to the sidecar file (also renamed into place), and a lock
    file makes concurrent processes wait for one build instead of racing. A damaged library
    is rebuilt; where that is impossible the error says it was damaged.
    """
    target = library_path()
    why = "" if force else damage(target)
    if not force and not why:
        return target
    cxx = os.environ.get("CXX") or "g++"
    if shutil.which(cxx) is None:
        cached = f"the cached library is unusable ({why}) and " if target.exists() else ""
        raise NativeBuildError(f"{cached}no C++ compiler ({cxx}) on PATH to build it")
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.with_suffix(".lock")):
        if not force and not damage(target):
            return target  # another process built it while we waited
        compile_flags, link_flags = _flags()
        fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=target.parent)
        os.close(fd)
        cmd = [cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-w", *compile_flags]
        cmd += [str(SOURCE), "-o", tmp, *link_flags]
        fd, tmp_sidecar = tempfile.mkstemp(suffix=".json.tmp", dir=target.parent)
        os.close(fd)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise NativeBuildError(
                    f"{cxx} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}"
                )
            Path(tmp_sidecar).write_text(json.dumps(_fingerprint(tmp)), encoding="utf-8")
            os.chmod(tmp_sidecar, 0o644)  # mkstemp's 0600: readable wherever the library is
            # The library first: a crash between the renames leaves a library whose sidecar
            # does not match it, which the next process rebuilds.
            os.replace(tmp, target)
            os.replace(tmp_sidecar, sidecar_path(target))
        finally:
            for leftover in (tmp, tmp_sidecar):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)
    return target


@contextlib.contextmanager
def _file_lock(path: Path) -> Any:
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic rename alone keeps the cache consistent
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def gpu_kernels_wanted() -> bool:
    """Whether a machine with a GPU should digest on it with the native kernels (asked per
    op on a GPU machine: the PTX's presence is looked up once)."""
    return os.environ.get(GPU_ENV, "1") != "0" and _ptx_shipped()


@functools.cache
def _ptx_shipped() -> bool:
    return PTX.exists()


def _open(path: Path) -> Native:
    import tensorflow as tf

    ops = tf.load_op_library(str(path))
    # dlopen of the same path returns the library TF loaded: the C functions share its buffer.
    clib = ctypes.CDLL(str(path))
    clib.nddebug_drain.restype = ctypes.c_int64
    clib.nddebug_drain.argtypes = [ctypes.POINTER(ctypes.POINTER(ctypes.c_int64))]
    clib.nddebug_drain_split.restype = ctypes.c_int64
    clib.nddebug_drain_split.argtypes = [
        ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
        ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
        ctypes.POINTER(ctypes.c_int64),
    ]
    clib.nddebug_set_active.argtypes = [ctypes.c_int]
    clib.nddebug_set_simd.argtypes = [ctypes.c_int]
    clib.nddebug_set_simd.restype = ctypes.c_int
    clib.nddebug_set_loop.argtypes = [ctypes.c_int]
    clib.nddebug_set_loop.restype = ctypes.c_int
    clib.nddebug_loop.restype = ctypes.c_int
    clib.nddebug_digest_bytes.argtypes = [
        ctypes.c_char_p,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int64),
    ]
    clib.nddebug_set_ptx.argtypes = [ctypes.c_char_p]
    clib.nddebug_is_active.restype = ctypes.c_int
    gpu = dg.gpu_present() and gpu_kernels_wanted()
    if gpu:
        clib.nddebug_set_ptx(PTX.read_bytes())
    return Native(path, ops, clib, gpu)


def enabled() -> bool:
    """Whether the native path may be used at all (``NDDEBUG_NATIVE=0`` turns it off)."""
    return os.environ.get(ENV, "1") != "0"


def load() -> Native | None:
    """The native library, built on first use; None where the pure-TF path must run (disabled,
    a GPU present without the GPU kernels, or the build failed: see :func:`problem`)."""
    if not enabled() or (dg.gpu_present() and not gpu_kernels_wanted()):
        return None
    with _lock:
        if "lib" not in _state:
            try:
                lib = _open(build())
                _state["problem"] = ""
                if lib.gpu:
                    why = _probe_gpu(lib)
                    if why:
                        lib = dataclasses.replace(lib, gpu=False)
                        _state["problem"] = f"the GPU digest kernels do not work here ({why})"
                _state["lib"] = lib
            except Exception as exc:  # noqa: BLE001 - any failure means the pure-TF path
                _state["lib"] = None
                _state["problem"] = f"{type(exc).__name__}: {exc}"
        lib = _state["lib"]
        if lib is not None and dg.gpu_present() and not lib.gpu:
            return None  # GPU ops need the kernels: the whole graph takes the pure-TF path
        return lib


def _probe_gpu(lib: Native) -> str:
    """Why the GPU kernels cannot be used ("" when they digest one tensor as the host does):
    a driver that cannot load the PTX, or no libcuda, shows here once, not in the user's step.
    Runs when the library is first loaded, normally as the first block switches the buffer
    on; where a block is already recording, it is skipped (its row and its eager ops would
    land in that block), and a failing kernel raises in the traced op instead."""
    import numpy as np
    import tensorflow as tf

    if lib.is_active():
        return ""
    value = np.array([1.5, -0.0, 3.0], np.float32)
    try:
        lib.set_active(True)
        try:
            with tf.device("/GPU:0"):
                (d,) = lib.digest_record(0, [tf.constant(value)], [])
            got = tuple(int(v) for v in d.numpy()[0])
        finally:
            lib.set_active(False)
            lib.drain()
    except Exception as exc:  # noqa: BLE001 - whatever fails, the pure-TF path still works
        return f"{type(exc).__name__}: {str(exc).strip()[:300]}"
    want = dg.digest_numpy(value)
    return "" if got == want else f"the GPU kernel digested a test tensor as {got}, not {want}"


def problem() -> str:
    """Why the native library could not be used ("" if it was, or was not wanted)."""
    wanted = enabled() and (not dg.gpu_present() or gpu_kernels_wanted())
    return _state.get("problem", "") if wanted else ""


def compile_ptx(nvrtc: str | None = None) -> str:
    """``nddebug_digest.cu`` compiled to PTX by NVRTC (``nvrtc``: the library's path; else the
    one pip's ``nvidia-cuda-nvrtc-cu12`` installed, else the system's)."""
    path = nvrtc or _find_nvrtc()
    if not path:
        raise NativeBuildError("NVRTC not found: pip install nvidia-cuda-nvrtc-cu12")
    lib = ctypes.CDLL(path)
    prog = ctypes.c_void_p()
    src = CUDA_SOURCE.read_bytes()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, CUDA_SOURCE.name.encode(), 0, None, None):
        raise NativeBuildError("nvrtcCreateProgram failed")
    opts = [o.encode() for o in NVRTC_OPTIONS]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc:
        raise NativeBuildError(f"NVRTC failed ({rc}): {log.value.decode(errors='replace')}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode()


def nvrtc_release(nvrtc: str) -> str:
    """The NVRTC library's release, e.g. ``"12.5"`` (PTX from different releases differs)."""
    lib = ctypes.CDLL(nvrtc)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def _find_nvrtc() -> str | None:
    import ctypes.util
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec else []:
        for found in sorted(Path(root).glob("cuda_nvrtc/lib/libnvrtc.so*")):
            if "builtins" not in found.name:
                return str(found)
    return ctypes.util.find_library("nvrtc")
