"""TF1 graphs run by tf.compat.v1.Session: recorded, compared, and their read/write races named.

Eager execution off is process-wide, so every TF1 program runs in a child process.
"""

from __future__ import annotations

import subprocess
import sys

import nddebug
from tests.helpers import ROOT, run_python, subprocess_env

STEP = """
import json, numpy as np, tensorflow as tf, nddebug
tf.compat.v1.disable_eager_execution()
x = tf.compat.v1.placeholder(tf.float32, [16, 8], name="x")
start = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
w = tf.compat.v1.get_variable("w", initializer=tf.constant(start))
noise = tf.random.uniform([16, 4]) if NOISE else 0.0   # unseeded: a new value every run
loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + noise))
train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
total = tf.reduce_sum(w)
session = tf.compat.v1.Session()
init = tf.compat.v1.global_variables_initializer()
data = {x: np.linspace(-1, 1, 128, dtype=np.float32).reshape(16, 8)}

def step():
    session.run(init)          # the same state before every run
    return session.run([loss, train], data)[0]

plain = step()                 # the graph was built and run before any trace block
runs = []
for label in ("a", "b"):
    with nddebug.trace(label=label) as rec:
        value = step()
    runs.append(rec)
report = nddebug.compare(runs)
with nddebug.trace() as called:
    session.make_callable(total)()
rec = runs[0]
print(json.dumps({
    "plain": float(plain), "traced": float(value),
    "types": sorted({op.op_type for op in rec.ops.values()}),
    "units": [rec.ops[e.op_id].op_type for e in rec.events if e.call == e.seq],
    "ok": report.ok, "verdict": report.summary["verdict"],
    "sources": [[r.op_type, r.kind] for r in report.sources.itertuples()],
    "warnings": report.warnings, "callable": called.warnings,
}))
"""


def test_session_runs_are_recorded_and_compared() -> None:
    """A graph built and run before the block: its Session.runs inside the block record every
    op they execute (the update's new value too), change nothing, and compare as ``ok``."""
    out = run_python(STEP.replace("NOISE", "False"))
    assert out["traced"] == out["plain"]  # recording changes no result
    assert {"MatMul", "Square", "Mean", "ResourceApplyGradientDescent"} <= set(out["types"])
    assert out["units"] == ["Session.run", "Session.run"]  # the initialiser's run and the step's
    assert out["ok"] and out["verdict"] == "reproducible", out
    # A Session callable is not recorded, and the recording says so.
    assert any("Not compared" in w and "make_callable" in w for w in out["callable"])


def test_an_unseeded_random_op_in_a_session_graph_is_the_source() -> None:
    out = run_python(STEP.replace("NOISE", "True"))
    assert not out["ok"]
    assert out["sources"] == [["RandomUniform", "random"]], out


QUEUE = """
import json, numpy as np, tensorflow as tf, nddebug
tf.compat.v1.disable_eager_execution()
data = tf.constant(np.arange(100, dtype=np.float32).reshape(100, 1))
queue = tf.queue.RandomShuffleQueue(200, 0, [tf.float32], shapes=[[1]], seed=SEED)
fill = queue.enqueue_many([data])
total = tf.reduce_sum(queue.dequeue_many(10) * tf.range(10, dtype=tf.float32)[:, None])
runs = []
for label in ("a", "b"):
    with tf.compat.v1.Session() as session:   # a new queue, filled outside the block
        session.run(fill)
        with nddebug.trace(label=label) as rec:
            session.run(total)
    runs.append(rec)
report = nddebug.compare(runs)
print(json.dumps({"ok": report.ok,
                  "sources": [[r.op_type, r.kind] for r in report.sources.itertuples()]}))
"""


def test_a_shuffle_queue_dequeue_is_an_input_pipeline_source() -> None:
    """A TF1 RandomShuffleQueue filled before the block hands out another batch in each
    session without a seed: the dequeue is named as the input pipeline (the queue is not
    digested; before, it was 'state differed' or a non-deterministic kernel). Seeded, the
    sessions agree."""
    out = run_python(QUEUE.replace("SEED", "None"))
    assert not out["ok"]
    assert out["sources"] == [["QueueDequeueManyV2", "input pipeline"]], out
    assert run_python(QUEUE.replace("SEED", "1"))["ok"]


ROUTED = """
import json, numpy as np, tensorflow as tf, nddebug
tf.compat.v1.disable_v2_behavior()     # TF1 control flow (Switch) and TensorArrayV3
v = tf.compat.v1.get_variable("v", initializer=tf.ones([4]), use_resource=True)
start = tf.compat.v1.placeholder(tf.float32, [4])
set_v = v.assign(start)
flag = tf.compat.v1.placeholder(tf.bool, [])
picked = tf.cond(flag, lambda: v.read_value() * 2.0, lambda: v.read_value() * 3.0)
with tf.control_dependencies([picked]):
    later = v.read_value() * 1.5       # v differs between the runs: a source of its own
noise = tf.random.uniform([4, 3])      # unseeded: a source
ta = tf.TensorArray(tf.float32, size=4, clear_after_read=False).unstack(noise)
total = tf.reduce_sum(picked) + tf.reduce_sum(later) + tf.reduce_sum(ta.read(2))
runs = []
for label, value in (("a", 1.0), ("b", 2.0)):
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(set_v, {start: np.full(4, value, np.float32)})
        with nddebug.trace(label=label) as rec:
            session.run(total, {flag: label == "a"})
    runs.append(rec)
report = nddebug.compare(runs)
print(json.dumps({"rows": [[r.op_type, r.op_name, r.role] for r in report.culprits.itertuples()]}))
"""


def test_handles_routed_by_a_cond_and_tensor_arrays_are_not_writes() -> None:
    """A TF1 cond routes the variable's handle through Switch ops, whose predicate differed:
    they hand the handle on and change nothing, so the read after them, of a variable that
    held other values in each run, is still a source. A TensorArray (a resource in TF1)
    read only hands on what the random op put into it."""
    rows = run_python(ROUTED)["rows"]
    sources = {(t, n) for t, n, role in rows if role == "source"}
    assert any(t == "ReadVariableOp" and not n.startswith("cond") for t, n in sources), rows
    assert ("RandomUniform", "random_uniform/RandomUniform") in sources, rows
    reads = [role for t, _, role in rows if t == "TensorArrayReadV3"]
    assert reads == ["propagated"], rows


COND_READ = """
import json, numpy as np, tensorflow as tf, nddebug
tf.compat.v1.disable_v2_behavior()
v = tf.compat.v1.get_variable("v", initializer=tf.ones([4]), use_resource=True)
bump = v.assign_add(tf.random.uniform([4]), read_value=False)   # unseeded: the source
flag = tf.compat.v1.placeholder(tf.bool, [])
read = tf.cond(flag, lambda: v.read_value() * 2.0, lambda: v.read_value() * 3.0)
runs = []
for label in ("a", "b"):
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        with nddebug.trace(label=label) as rec:
            session.run(bump)                        # one Session.run writes v ...
            session.run(read, {flag: True})          # ... a later one reads it in a cond
    runs.append(rec)
report = nddebug.compare(runs)
print(json.dumps({"rows": [[r.op_type, r.op_name, r.role] for r in report.culprits.itertuples()]}))
"""


def test_a_read_in_a_cond_after_a_divergent_write_is_propagated() -> None:
    """The read inside a TF1 cond gets the variable's handle through a Switch: it is the
    same variable the earlier Session.run wrote differently, so the read only carries that
    difference (before, it was a second source, 'the variable already held a different
    value')."""
    rows = run_python(COND_READ)["rows"]
    sources = [t for t, _, role in rows if role == "source"]
    assert sources == ["RandomUniform"], rows
    reads = [role for t, n, role in rows if t == "ReadVariableOp" and n.startswith("cond")]
    assert reads == ["propagated"], rows


def _race_recording(tmp_path, delay: str) -> nddebug.Recording:
    path = str(tmp_path / f"{delay}.nddebug")
    proc = subprocess.run(
        [sys.executable, f"{ROOT}/tests/scripts/tf1_race.py", path],
        env=subprocess_env({"TF1_DELAY": delay}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rec,) = nddebug.load(path)
    return rec


def test_a_read_racing_a_write_in_one_session_run_is_named(tmp_path) -> None:
    """The read and the increment are unordered in the graph; the two processes ran them in
    opposite orders. The read is the source, of kind race, and the advice orders them."""
    first, second = _race_recording(tmp_path, "write"), _race_recording(tmp_path, "read")
    for rec in (first, second):  # found from the graph alone, in every run
        assert any("ReadVariableOp reads a variable that AssignAddVariableOp" in w
                   for w in rec.warnings), rec.warnings  # fmt: skip
    report = nddebug.compare([first, second])
    assert not report.ok
    src = report.sources.iloc[0]
    assert (src["op_type"], src["kind"]) == ("ReadVariableOp", "race"), str(report)
    assert "AssignAddVariableOp" in src["explanation"]
    assert "tf.control_dependencies" in src["fix"]
    assert "tf1_race.py" in src["location"]


def test_the_seed_004_job_under_nddebug_run() -> None:
    """The Keras 2 / TF 1.13 job of seed 004, rebuilt for TF 2.21, in 3 fresh processes. Its
    decayed learning rate reads `iterations` while the same Session.run increments it: nddebug
    names that race from the graph in every run. Whether a process reads before or after the
    increment is the executor's choice (measured: 3 of 10 processes read after it when traced),
    so either the race is the one source, and nothing else is blamed, or the runs agree and
    the race is a risk: a run that did not show it is not shown reproducible."""
    proc = subprocess.run(
        [sys.executable, "-m", "nddebug", "run", "--all", "-n", "3",
         f"{ROOT}/nddebug/examples/keras2_session.py"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-3000:]
    assert "Read/ReadVariableOp reads a variable that AssignAddVariableOp also writes" in out
    if "NOT reproducible — 3 runs" in out:
        assert "  1 source op(s)" in out, out
        assert "Source: ReadVariableOp (Read/ReadVariableOp) — race" in out, out
    else:
        assert "NOT shown reproducible: a known non-deterministic op ran — 3 runs" in out, out
        assert "no difference seen in 3 runs for ReadVariableOp" in out, out


COND_V2_NOISE = """
import json, numpy as np, tensorflow as tf, nddebug
tf.compat.v1.disable_eager_execution()
tf.compat.v1.enable_control_flow_v2()  # tf.cond builds an If whose branches are functions
x = tf.constant(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
flag = tf.compat.v1.placeholder(tf.bool, [])
picked = tf.cond(flag, lambda: x * tf.random.uniform([3, 4]), lambda: x * 2.0)  # unseeded
total = tf.reduce_sum(picked * 3.0)
runs = []
with tf.compat.v1.Session() as session:
    for label in ("a", "b"):
        with nddebug.trace(label=label) as rec:
            session.run(total, {flag: True})
        runs.append(rec)
report = nddebug.compare(runs)
rows = [[r.op_type, r.role, r.explanation] for r in report.culprits.itertuples()]
print(json.dumps({"rows": rows}))
"""


def test_a_branch_whose_ops_a_session_does_not_record_stays_the_source() -> None:
    """A TF1 graph's branches are functions whose ops Session.run does not record: a random
    op inside one shows only in its If's outputs, which stays the source (elsewhere a loop or
    branch is never one, as the ops of its bodies are recorded)."""
    rows = run_python(COND_V2_NOISE)["rows"]
    sources = [(t, why) for t, role, why in rows if role == "source"]
    assert [t for t, _ in sources] == ["If"], rows
    assert "cannot compare" not in sources[0][1] and "entered" not in sources[0][1], rows


UPDATES = """
import json, numpy as np, tensorflow as tf, nddebug
tf.compat.v1.disable_eager_execution()
v = tf.compat.v1.get_variable(
    "v", initializer=tf.constant(np.linspace(0.1, 1.0, 1000).astype("float32")),
    use_resource=True)
if ONE_UPDATE:
    a1 = a2 = v.assign_add(tf.fill([1000], 1e-3) + tf.fill([1000], 7.77e-1), read_value=False)
elif ORDERED:
    a1 = v.assign_add(tf.fill([1000], 1e-3), read_value=False)
    with tf.control_dependencies([a1]):
        a2 = v.assign_add(tf.fill([1000], 7.77e-1), read_value=False)
else:
    a1 = v.assign_add(tf.fill([1000], 1e-3), read_value=False)
    a2 = v.assign_add(tf.fill([1000], 7.77e-1), read_value=False)
init = tf.compat.v1.global_variables_initializer()
session = tf.compat.v1.Session()
import subprocess, sys
busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BUSY)]
runs = []
try:
    for _ in range(RUNS):
        session.run(init)
        with nddebug.trace() as rec:
            session.run([a1, a2])
        runs.append(rec)
finally:
    for p in busy:
        p.kill()
report = nddebug.compare(runs)
print(json.dumps({
    "verdict": report.verdict, "warnings": report.warnings,
    "risks": sorted({r.op_type for r in report.risks.itertuples()}),
}))
"""


def test_two_unordered_updates_of_one_variable_are_a_risk_where_they_did_not_show() -> None:
    """Two assign_adds of one variable in one Session.run with nothing ordering them: the
    value left depends on their order (float sums; a probe saw 3 different final values in
    30 plain runs). Runs where it did not show were "reproducible": only a read racing a
    write was looked for. Now the race is a risk whether it shows or not (where it shows,
    the runs differ); one update of the sum stays reproducible."""
    out = run_python(_updates(one=False, ordered=False))
    assert out["verdict"] in (
        "NOT shown reproducible: a known non-deterministic op ran",
        "NOT reproducible",
    ), out
    assert out["risks"] == ["AssignAddVariableOp"], out
    assert any("update the same variable in the same Session.run" in w for w in out["warnings"])
    out = run_python(_updates(one=True, ordered=False))
    assert out["verdict"] == "reproducible", out


def _updates(one: bool, ordered: bool, runs: int = 2, busy: int = 0) -> str:
    return (
        UPDATES.replace("ONE_UPDATE", str(one))
        .replace("ORDERED", str(ordered))
        .replace("RUNS", str(runs))
        .replace("BUSY", str(busy))
    )


def test_an_update_another_ordered_update_follows_is_compared_through_its_inputs() -> None:
    """Two assign_adds of one variable, the second ordered after the first. nddebug read
    the value after the first, and nothing orders that read before the second (a TF1 op a
    session has run must not change): on a loaded machine it saw the second too, and
    identical runs compared "NOT reproducible" at the first update. Now only the last
    update's value is read back; the machine is loaded here too."""
    out = run_python(_updates(one=False, ordered=True, runs=16, busy=2))
    assert out["verdict"] == "reproducible", out


# A dynamic_rnn-style recurrence with v1 control flow (control flow v2 off, as in TF1): a
# tf.compat.v1.while_loop over a TensorArray, its gradient loop, and Adam. No op can be
# recorded inside a loop's frame: nddebug could not instrument such a Session.run at all
# (and the search for unordered variable accesses never ended on its cycles).
LOOP = """
import hashlib, json, numpy as np, tensorflow as tf, nddebug
tf.compat.v1.disable_v2_behavior()
T, B = 12, 8
rng = np.random.default_rng(0)
x = tf.constant(rng.standard_normal((T, B, 6)).astype(np.float32))
y = tf.constant(rng.standard_normal((T, B, 10)).astype(np.float32))
start = (rng.standard_normal((16, 10)) * 0.3).astype(np.float32)
w = tf.compat.v1.get_variable("w", initializer=tf.constant(start), use_resource=True)
inputs = tf.TensorArray(tf.float32, size=T).unstack(x)
acc = tf.compat.v1.get_variable("acc", [], use_resource=True, initializer=tf.zeros_initializer())

def body(t, h, outputs):
    z = tf.tanh(tf.matmul(tf.concat([inputs.read(t), h], 1), w))
    if MODE == "dropout":
        z = tf.nn.dropout(z, rate=0.3)  # unseeded, inside the loop
    if MODE == "nested":
        _, z = tf.compat.v1.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a * 0.9), [0, z])
    if MODE == "accumulate":  # unseeded, into a variable read in a later Session.run
        with tf.control_dependencies([acc.assign_add(tf.random.uniform([]))]):
            z = tf.identity(z)
    return t + 1, z, outputs.write(t, z)

start_vars = [tf.constant(0), tf.zeros([B, 10]), tf.TensorArray(tf.float32, size=T)]
_, _, outputs = tf.compat.v1.while_loop(lambda t, h, o: t < T, body, start_vars)
loss = tf.reduce_mean((outputs.stack() - y) ** 2)
train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
bump = w.assign_add(tf.random.uniform([16, 10]) * 1e-3)  # unseeded, outside the loop
acc_value = acc.read_value()
session = tf.compat.v1.Session()
init = tf.compat.v1.global_variables_initializer()

def step():
    session.run(init)
    if MODE == "bump":
        session.run(bump)  # a divergent update the loop reads in the next run
    value = session.run([loss, train])[0]
    session.run(acc_value)
    return value, hashlib.sha256(session.run(w).tobytes()).hexdigest()

plain = step()
runs = []
for label in ("a", "b"):
    with nddebug.trace(label=label) as rec:
        traced = step()
    runs.append(rec)
report = nddebug.compare(runs)
rows = report.culprits
print(json.dumps({
    "plain": [float(plain[0]), plain[1]], "traced": [float(traced[0]), traced[1]],
    "ok": report.ok, "verdict": report.summary["verdict"],
    "sources": [[r.op_type, r.kind] for r in report.sources.itertuples()],
    "roles": sorted({(r.op_type, r.op_name, r.role) for r in rows.itertuples()}),
    "why": [f.explanation for f in report.comparison.findings if f.role == "source"],
    "warnings": report.warnings,
}))
"""


def test_a_tf1_while_loop_is_compared_at_its_outputs_and_changes_nothing() -> None:
    """The loops run unrecorded, are said to, and compare equal; training is bitwise that of
    the plain program; no read inside the loop is called racing the update after it."""
    out = run_python(LOOP.replace("MODE", '"clean"'))
    assert out["traced"] == out["plain"]
    assert out["ok"] and out["verdict"] == "reproducible", out
    said = [w for w in out["warnings"] if "tf.compat.v1.while_loop frames" in w]
    assert len(said) == 1 and "gradients/while, while" in said[0], out["warnings"]
    assert not any("nothing ordering them" in w for w in out["warnings"]), out["warnings"]


def test_nested_tf1_loops_and_their_gradients_are_compared_at_their_outputs() -> None:
    """An inner loop's Exit is inside the outer loop's frame, and the gradient loop takes
    the forward loop's count from inside it: digesting either made the instrumentation of
    the whole Session.run fail, and nothing of it was compared (probe round 46)."""
    out = run_python(LOOP.replace("MODE", '"nested"'))
    assert out["traced"] == out["plain"]
    assert out["ok"] and out["verdict"] == "reproducible", out
    assert not any("could not instrument" in w for w in out["warnings"]), out["warnings"]


def test_a_variable_a_tf1_loop_wrote_is_named_with_the_loop_where_it_is_read() -> None:
    """The loop adds unseeded noise to a variable read in a later Session.run: the read was
    blamed on "state carried over between runs", which the initializer had ruled out (probe
    round 46, F3)."""
    out = run_python(LOOP.replace("MODE", '"accumulate"'))
    assert not out["ok"]
    assert ["ReadVariableOp", "random"] in out["sources"], out
    (why,) = [w for w in out["why"] if "TF1 while loop 'while'" in w and "written inside" in w]
    assert "RandomUniform" in why and "carried over" not in why, out["why"]


def test_an_unseeded_op_inside_a_tf1_loop_is_named_with_the_loop() -> None:
    """The forward loop's outputs reach the step through its TensorArray: the gather that
    reads it is the source, of kind random, named with the loop and its RandomUniform; the
    gradient loop, fed by what differed, only propagated."""
    out = run_python(LOOP.replace("MODE", '"dropout"'))
    assert not out["ok"]
    assert out["sources"] == [["TensorArrayGatherV3", "random"]], out
    assert "TF1 while loop 'while'" in out["why"][0] and "RandomUniform" in out["why"][0]
    exits = {role for op_type, _, role in out["roles"] if op_type == "Exit"}
    assert exits == {"propagated"}, out["roles"]


def test_a_tf1_loop_reading_a_divergent_update_only_propagated() -> None:
    """The loop reads the weights an earlier Session.run updated with unseeded noise: the
    noise is the source; the loop's outputs, from identical inputs, only carry it on."""
    out = run_python(LOOP.replace("MODE", '"bump"'))
    assert not out["ok"]
    assert out["sources"] == [["RandomUniform", "random"]], out
    assert ("TensorArrayGatherV3", "TensorArrayStack/TensorArrayGatherV3", "propagated") in [
        tuple(r) for r in out["roles"]
    ], out["roles"]


# v1 control flow's cond (Switch/Merge, one branch dead), then what follows it; and a CPU
# culprit of the knowledge base in a TF1 graph.
AFTER_COND = """
import json, numpy as np, tensorflow as tf, nddebug
tf.compat.v1.disable_v2_behavior()
x = tf.constant(np.arange(8, dtype=np.float32))
pick = tf.compat.v1.placeholder_with_default(True, [])
c = tf.compat.v1.cond(pick, lambda: x * 2.0, lambda: x - 1.0)
d = tf.sqrt(tf.abs(c) + 1.0)
if NOISE:
    d = tf.cast(tf.random.categorical(tf.reshape(d, [1, 8]), 16), tf.float32)  # unseeded
total = tf.reduce_sum(d)
zeros = tf.zeros_initializer()
v = tf.compat.v1.get_variable("v", [4096, 64], use_resource=True, initializer=zeros)
idx = tf.constant(np.random.RandomState(0).randint(0, 4096, 65536).astype(np.int32))
rows = tf.constant(np.random.RandomState(1).randn(65536, 64).astype(np.float32))
with tf.control_dependencies([tf.compat.v1.scatter_add(v, idx, rows)]):
    scattered = tf.reduce_sum(v.read_value() * 1.0)
session = tf.compat.v1.Session()
out = {}
for name, fetch in (("cond", total), ("scatter", scattered)):
    runs = []
    for label in ("a", "b", "c"):
        session.run(v.initializer)
        with nddebug.trace(label=label) as rec:
            session.run(fetch)
        runs.append(rec)
    report = nddebug.compare(runs)
    out[name] = {
        "ok": report.ok, "verdict": report.summary["verdict"],
        "types": sorted({op.op_type for op in runs[0].ops.values()}),
        "sources": [[r.op_type, r.kind, r.device] for r in report.sources.itertuples()],
        "risks": [[r.op_type, r.device] for r in report.risks.itertuples()],
    }
print(json.dumps(out))
"""


def test_the_ops_after_a_tf1_cond_are_recorded_and_a_culprit_there_named() -> None:
    """A record read its inputs' digests, and one branch of a TF1 cond is dead: the Merge's
    record never ran, nor any record after it, and a run that differed after the cond was
    "reproducible", ok True (probe round 46, F2)."""
    clean = run_python(AFTER_COND.replace("NOISE", "False"))["cond"]
    assert {"Sqrt", "Sum", "Merge"} <= set(clean["types"]), clean
    assert clean["ok"] and clean["verdict"] == "reproducible", clean
    noisy = run_python(AFTER_COND.replace("NOISE", "True"))["cond"]
    assert not noisy["ok"]
    assert [s[:2] for s in noisy["sources"]] == [["Multinomial", "random"]], noisy


def test_a_cpu_culprit_in_a_tf1_graph_is_matched_on_the_cpu() -> None:
    """Unplaced TF1 ops were "on ?": a CPU ResourceScatterAdd with duplicate indices was kind
    "other" with the advice to restore state (which was restored), or "reproducible" when
    the runs happened to agree (probe round 46, F7)."""
    out = run_python(AFTER_COND.replace("NOISE", "False"))["scatter"]
    assert not out["ok"], out
    named = out["sources"] or out["risks"]  # differed in these runs, or listed as a risk
    assert [s[0] for s in named] == ["ResourceScatterAdd"], out
    assert all(s[-1].endswith("CPU:0") for s in named), out
    if out["sources"]:
        assert out["sources"][0][1] == "numerical", out


REF_VARIABLES = """
import json, numpy as np, tensorflow as tf, nddebug
tf.compat.v1.disable_v2_behavior()
rng = np.random.RandomState(0)
x = tf.constant(rng.randn(64, 32).astype(np.float32))
y = tf.constant(rng.randn(64, 1).astype(np.float32))
w1 = tf.compat.v1.get_variable("w1", [32, 64], use_resource=False,
                               initializer=tf.constant_initializer(rng.randn(32, 64) * 0.2))
w2 = tf.compat.v1.get_variable("w2", [64, 1], use_resource=False,
                               initializer=tf.constant_initializer(rng.randn(64, 1) * 0.2))
loss = tf.reduce_mean((tf.matmul(tf.tanh(tf.matmul(x, w1)), w2) - y) ** 2)
train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
init = tf.compat.v1.global_variables_initializer()
session = tf.compat.v1.Session()
runs = []
for label in ("a", "b"):
    session.run(init)
    with nddebug.trace(label=label) as rec:
        for _ in range(3):
            session.run([loss, train])
    runs.append(rec)
report = nddebug.compare(runs)
reads = [op.op_id for op in runs[0].ops.values() if op.op_name in ("w1/read", "w2/read")]
print(json.dumps({
    "verdict": report.summary["verdict"],
    "read_digests": sorted({str(d) for e in runs[0].events if e.op_id in reads for d in e.digests}),
    "warnings": report.warnings,
}))
"""


def test_reads_of_tf1_reference_variables_are_not_digested() -> None:
    """A read of a reference variable is its buffer, which ApplyAdam changes in place,
    sometimes before the read's digest ran: identical runs differed at `w/read`, "a new
    finding", in 5 of 9 runs (probe round 46, F4). The reads are not digested, and the run
    says what it could not compare."""
    out = run_python(REF_VARIABLES)
    assert set(out["read_digests"]) <= {"None"}, out  # no digest of a read, if recorded at all
    assert out["verdict"] == "no difference seen, but not everything compared", out
    said = [w for w in out["warnings"] if "reference variables" in w]
    assert said and "nor their reads are compared" in said[0], out["warnings"]
