"""The risk pass (``nddebug.risks.known_risks``) alone, over hand-made recordings: which known
culprits ran, and whether the runs showed them."""

from __future__ import annotations

from nddebug import risks
from nddebug.analysis import compare_recordings
from nddebug.recording import TF1_LOOP, TF1_LOOP_NAME, Event, OpInfo, Recording

CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def _loop_op(op_id: int, name: str, op_type: str) -> OpInfo:
    """An op where a TF1 while loop named 'while' was compared (session.py): an Exit, or the
    gather of a TensorArray the loop filled, with the op types of the loop's frame."""
    return OpInfo(
        op_id,
        name,
        op_type,
        name,
        "g",
        CPU,
        "train.py:7",
        ["float32"],
        [[4]],
        [True],
        function=TF1_LOOP,
        attrs={TF1_LOOP_NAME: "while", "ops_inside": ["ResourceScatterAdd", "Mul", "Exit"]},
    )


def _runs(gathers: list[int]) -> list[Recording]:
    """One recording per run: the loop's Exit is the same in every run, its gather is
    ``gathers[i]`` in run i; both have the same inputs."""
    runs = []
    for value in gathers:
        rec = Recording(digest_algorithm="test", environment={"devices": [CPU]})
        rec.ops[1] = _loop_op(1, "while/Exit_1", "Exit")
        rec.ops[2] = _loop_op(2, "TensorArrayGatherV3", "TensorArrayGatherV3")
        rec.ops[0] = OpInfo(
            0, "eager:run", "__inference_run", "", "", CPU, "train.py:9", [], [], []
        )
        rec.events.append(Event(0, 1, 10, [(5, 0)], [(3, 3)]))
        rec.events.append(Event(1, 2, 10, [(value, 0)], [(3, 3)]))
        rec.events.append(Event(10, 0, 10, [], []))  # the Session.run that ran them
        runs.append(rec)
    return runs


def test_a_known_kernel_in_a_tf1_loop_is_one_risk_seen_wherever_the_loop_differed() -> None:
    """A TF1 loop is compared at each place its values leave it. A ResourceScatterAdd in its
    body was a risk of each of them, and the one at the Exit, which did not differ, said "no
    difference seen" beside the gather that did."""
    differed = _runs([1, 2])
    findings = compare_recordings(differed).findings
    assert {f.key for f in findings if f.role == "source"} == {"TensorArrayGatherV3"}
    (risk,) = [r for r in risks.known_risks(differed, findings) if r.applies]
    assert risk.op_type == "ResourceScatterAdd" and "inside while" in risk.op_name
    assert risk.observed

    # The same loop in runs that agreed: the kernel ran, and nothing showed it.
    same = _runs([1, 1])
    (risk,) = [r for r in risks.known_risks(same, compare_recordings(same).findings) if r.applies]
    assert risk.op_type == "ResourceScatterAdd" and not risk.observed


def test_a_map_fn_random_op_that_was_the_source_is_not_also_said_unseen() -> None:
    """An unseeded random op in a map_fn body: the report named it the source and, of the
    same op, "no difference seen ... but the knowledge base lists it" (the loop's outputs, a
    TensorList, hold nothing digested; probe round 47, F14)."""
    import tensorflow as tf

    import nddebug

    x = tf.reshape(tf.range(24, dtype=tf.float32), [6, 4]) / 10.0

    @tf.function
    def step(x):
        return tf.reduce_sum(tf.map_fn(lambda r: tf.reduce_sum(r) * tf.random.uniform([]), x))

    report = nddebug.check(step, x, repeats=3, quantify=False)
    assert "RandomUniform" in set(report.sources["op_type"]), report
    assert not any("no difference seen" in n for n in report.verdict_notes), report.verdict_notes
