"""The facts about a run's environment that decide whether it can be reproduced."""

from __future__ import annotations

import functools
import os
import platform
import random
import sys
from typing import Any

_SWITCHES = (
    "TF_DETERMINISTIC_OPS",
    "TF_CUDNN_DETERMINISTIC",
    "TF_USE_CUDNN_AUTOTUNE",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_XLA_FLAGS",
    "XLA_FLAGS",
    "PYTHONHASHSEED",
    "HOROVOD_FUSION_THRESHOLD",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
)


def runtime_started() -> bool:
    """Whether TensorFlow's runtime (its eager context, hence its devices and thread pools)
    has started. Until then asking for devices or making a variable would start it, and a
    script may still configure them at its top, which ``nddebug run --all`` runs inside a
    block (probe round 43, F4)."""
    from tensorflow.python.eager import context

    return getattr(context.context(), "_context_handle", None) is not None


def capture() -> dict[str, Any]:
    """Versions, devices, determinism switches, thread settings and seeds, as plain data."""
    env = dict(_fixed())
    env["devices"] = devices()
    env["env"] = {k: os.environ[k] for k in _SWITCHES if k in os.environ}
    # The script that recorded it, by file name (the same on every machine): runs of two
    # scripts appended to one file are told apart (see analysis.compare_recordings).
    env["program"] = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    # Which process: `nddebug run` orders the blocks of a script's child processes, which
    # save into the same file, after its own (see cli._by_origin).
    env["pid"] = os.getpid()
    task = _cluster_task()
    if task is not None:
        env["cluster_task"] = task  # which worker of a multi-worker job recorded this
    env["op_determinism"] = op_determinism_enabled()
    env["threads"] = dict(_threads())
    env["seeds"] = _seeds()
    from nddebug import emulate

    # Under nddebug.emulate_gpu() the report's advice is the GPU's: the run rehearses a GPU.
    env["emulated_device"] = "GPU" if emulate.is_active() else ""
    return env


_threads_fixed: dict[str, int] = {}


def _threads() -> dict[str, int]:
    """TensorFlow's thread pool sizes: fixed once its runtime has started (setting them then
    raises), so read once from then on (each read builds the whole ConfigProto)."""
    if _threads_fixed:
        return _threads_fixed
    import tensorflow as tf

    threads = {
        "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
    }
    if runtime_started():
        _threads_fixed.update(threads)
    return threads


@functools.lru_cache(maxsize=1)
def _fixed() -> dict[str, Any]:
    """What cannot change while the process runs (versions, the build, the devices, once
    TensorFlow has made them), looked up once: every trace() block captures the environment,
    and on a GPU these lookups cost a noticeable part of a short step."""
    import numpy as np
    import tensorflow as tf

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.node(),
        "tensorflow": tf.__version__,
        "numpy": np.__version__,
    }
    try:
        import keras

        env["keras"] = keras.__version__
    except ImportError:
        pass
    build = {}
    try:
        info = tf.sysconfig.get_build_info()
        build = {
            k: str(v)
            for k, v in info.items()
            if k in ("cuda_version", "cudnn_version", "is_cuda_build")
        }
    except Exception:  # noqa: BLE001 - build info is optional
        pass
    env["build"] = build
    env["onednn"] = onednn_enabled()
    return env


_devices_fixed: list[str] = []


def devices() -> list[str]:
    """TensorFlow's logical devices, once its runtime has made them; [] before. Listing them
    makes them, and a script may still configure them (logical CPUs for a MirroredStrategy,
    a GPU's memory growth) at its top, which ``nddebug run --all`` puts inside a block: it
    then raised "Virtual devices cannot be modified after being initialized" (probe round
    43, F4). A block that starts first fills them in when it ends (tracer.block)."""
    if _devices_fixed:
        return list(_devices_fixed)
    import tensorflow as tf

    if not runtime_started():
        return []
    _devices_fixed[:] = [d.name for d in tf.config.list_logical_devices()]
    return list(_devices_fixed)


def onednn_enabled() -> bool:
    """Whether TensorFlow's CPU ops run oneDNN's kernels (``_MklMatMul`` for ``MatMul``, ...).
    They round differently from the Eigen kernels, and TensorFlow turns them on by default only
    on some CPUs, so two machines with the same versions may still compute differently."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except Exception:  # noqa: BLE001 - a build without the query: assume not
        return False


def op_determinism_enabled() -> bool:
    """Whether TensorFlow's op determinism is on now (enable_op_determinism or
    TF_DETERMINISTIC_OPS)."""
    try:
        from tensorflow.python.framework import config as tf_config

        return bool(tf_config.is_op_determinism_enabled())
    except Exception:  # noqa: BLE001
        return os.environ.get("TF_DETERMINISTIC_OPS", "") in ("1", "true", "True")


def _seeds() -> dict[str, Any]:
    from tensorflow.python.framework import random_seed

    seeds: dict[str, Any] = {}
    try:
        from tensorflow.python.eager import context

        seeds["tf_global_seed"] = context.global_seed()
    except Exception:  # noqa: BLE001
        seeds["tf_global_seed"] = getattr(random_seed, "_DEFAULT_GRAPH_SEED", None)
    seeds["python_random_state_hash"] = hash(random.getstate()) & 0xFFFFFFFF
    return seeds


def _cluster_task() -> dict[str, Any] | None:
    """The task of TF_CONFIG (e.g. {"type": "worker", "index": 1}), if it names one."""
    import json

    try:
        task = json.loads(os.environ.get("TF_CONFIG", "") or "{}").get("task")
    except (ValueError, AttributeError):
        return None
    return task if isinstance(task, dict) else None
