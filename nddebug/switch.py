"""Process-wide on/off switches that instrumented graphs read at run time.

A switch is a resource variable with a fixed shared name on the host. A graph reads it with its
own ``VarHandleOp`` + ``ReadVariableOp``, so no graph captures an eager tensor. Capturing one is
not something every function body supports: a ``tf.while_loop`` gradient body cannot capture
a tensor it did not get from the forward loop (TF's while_v2 raises "is in list of
internal_captures but not in internal_capture_to_output", or the gradient loop's condition
gets an input more than it was built with). A handle made inside the graph needs nothing from
outside it, whatever kind of body the graph is.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from nddebug.environment import runtime_started
from nddebug.graph_memo import GraphMemo

_lock = threading.Lock()
#: What every switch's shared variable name starts with.
SWITCH_PREFIX = "nddebug_switch_"


class Switch:
    """A bool kept as int32 0/1 in a named host variable, read by graphs and set eagerly."""

    def __init__(self, name: str) -> None:
        # The process id keeps two processes' switches apart where a resource manager could
        # be shared (it is not today; the name costs nothing).
        self.shared_name = f"{SWITCH_PREFIX}{name}_{os.getpid()}"
        self._handle: Any = None
        self._reads = GraphMemo(f"switch_{name}")
        self._values: dict[tuple[str, bool], Any] = {}  # (device, on) -> eager int32 tensor
        self._pending = False  # the value set before TensorFlow's runtime started (see set)

    def _eager_handle(self) -> Any:
        if self._handle is None:
            with _lock:
                if self._handle is None:
                    import tensorflow as tf
                    from tensorflow.python.eager import context
                    from tensorflow.python.ops import gen_resource_variable_ops as gen

                    handles = []
                    with context.eager_mode():
                        # One per CPU device of the process: a function that tf.distribute
                        # runs on a second logical CPU reads the switch from that device's
                        # resource manager, whatever device its read asks for.
                        for device in _cpu_devices():
                            with tf.device(device):
                                handle = gen.var_handle_op(
                                    dtype=tf.int32,
                                    shape=[],
                                    shared_name=self.shared_name,
                                    container="",
                                )
                                start = tf.constant(int(self._pending), tf.int32)
                                gen.assign_variable_op(handle, start)
                            handles.append((device, handle))
                    self._handle = handles  # kept: the variables live as long as the process
        return self._handle

    def set(self, on: bool) -> None:
        """Switch on or off, for every graph that reads the switch from now on. Before
        TensorFlow's runtime has started, only noted: making the variable would start it, and
        a script may still configure its devices (logical CPUs, a GPU's memory growth) at its
        top, which ``nddebug run --all`` runs inside a block (probe round 43, F4); the
        variable starts with the value when a graph first reads it."""
        import tensorflow as tf
        from tensorflow.python.eager import context
        from tensorflow.python.ops import gen_resource_variable_ops as gen

        if self._handle is None and not runtime_started():
            self._pending = on
            return
        with context.eager_mode():
            for device, handle in self._eager_handle():
                with tf.device(device):
                    value = self._values.get((device, on))
                    if value is None:  # made once: a trace() block switches twice
                        value = self._values[(device, on)] = tf.constant(int(on), tf.int32)
                    gen.assign_variable_op(handle, value)

    def read(self, graph: Any) -> Any:
        """The switch as an int32 scalar tensor of ``graph``, read once per graph (per loop
        iteration in a loop body), outside any control dependencies of the user's code."""
        if graph in self._reads:
            return self._reads[graph]
        import tensorflow as tf
        from tensorflow.python.framework import ops as tf_ops
        from tensorflow.python.ops import gen_resource_variable_ops as gen

        self._eager_handle()  # the variable exists before any graph reads it
        with graph.as_default(), tf_ops.control_dependencies(None), tf.device("/CPU:0"):
            with tf.name_scope("nddebug"):
                handle = gen.var_handle_op(
                    dtype=tf.int32, shape=[], shared_name=self.shared_name, container=""
                )
                value = gen.read_variable_op(handle, tf.int32)
        acd = getattr(graph, "experimental_acd_manager", None)
        if acd is not None:
            # tf.function chains every stateful op without a resource input in program
            # order; the handle would join that chain where the first digest was made, and
            # a digest ordered before an earlier op would close a cycle.
            acd.run_independently(handle.op)
        self._reads[graph] = value
        return value


def _cpu_devices() -> list[str]:
    """This process's CPU devices (logical ones included; not a cluster's other tasks')."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    try:
        here = context.context().host_address_space()
    except Exception:  # noqa: BLE001 - a context that cannot say: the first CPU alone
        here = None
    names = [d.name for d in tf.config.list_logical_devices("CPU")]
    local = [n for n in names if here is None or not n.startswith("/job:") or n.startswith(here)]
    return local or ["/CPU:0"]
