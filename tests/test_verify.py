"""report.verify(): the recommended fix is applied in fresh processes and checked, for real."""

from __future__ import annotations

import os

import tensorflow as tf

import nddebug
from nddebug import verify
from nddebug.tracer import EMULATE_ENV
from tests.helpers import ROOT

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
ENV = {"PYTHONPATH": ROOT}


def _report(script: str, **env: str) -> nddebug.Report:
    per_run, error = verify.run_script(script, [], {**ENV, **env}, runs=2)
    assert not error, error
    return nddebug.compare([r[0] for r in per_run])


def _crop_report() -> nddebug.Report:
    """The crop step checked in this process (5 repeats: it cannot miss the race)."""
    from nddebug.examples.detection import make_step

    step, args, state = make_step()
    return nddebug.check(step, *args, repeats=5, state=state, advance=False)


def test_op_determinism_is_verified_to_fix_the_crop_script() -> None:
    script = os.path.join(SCRIPTS, "crop_step.py")
    report = _crop_report()
    assert "CropAndResizeGradImage" in set(report.sources["op_type"]), str(report)
    table = report.verify(script=script, runs=2, **ENV)
    crop = table[table["op_type"] == "CropAndResizeGradImage"].to_dict("records")
    assert crop == [
        {
            "op_type": "CropAndResizeGradImage",
            "fix": "op determinism",
            "verdict": "fixed",
            "detail": "2 fresh runs with TF_DETERMINISTIC_OPS=1",
        }
    ]
    # A source whose advice names no fix to apply is not claimed either way.
    assert set(table[table["op_type"] != "CropAndResizeGradImage"]["verdict"]) <= {"not verified"}


def test_seeding_is_verified_to_fix_an_unseeded_random_op() -> None:
    script = os.path.join(SCRIPTS, "random_step.py")
    report = _report(script)
    assert "RandomUniform" in set(report.sources["op_type"]), str(report)
    table = report.verify(script=script, runs=2, **ENV)
    row = table[table["op_type"] == "RandomUniform"].iloc[0]
    assert (row["fix"], row["verdict"]) == ("seeds", "fixed"), table


def test_a_fix_that_raises_on_the_emulated_gpu_is_reported_as_such() -> None:
    script = os.path.join(SCRIPTS, "crop_step.py")
    report = _crop_report()
    table = report.verify(script=script, runs=2, **ENV, **{EMULATE_ENV: "1"})
    row = table[table["op_type"] == "CropAndResizeGradImage"].iloc[0]
    assert row["verdict"] == "raises here", table
    assert "CropAndResizeBackpropImage not available" in row["detail"]


def test_a_check_report_is_verified_in_this_process() -> None:
    """verify() of a check() report re-runs its step here with op determinism switched on
    (the step retraced under it) and switches it back off."""
    from tensorflow.python.framework import config

    report = _crop_report()
    table = report.verify()
    crop = table[table["op_type"] == "CropAndResizeGradImage"].iloc[0]
    assert crop["fix"] == "op determinism" and crop["verdict"] == "fixed", table.to_string()
    assert "in-process" in crop["detail"]
    assert not config.is_op_determinism_enabled()


def test_without_a_step_or_a_script_nothing_is_claimed() -> None:
    report = _crop_report()
    recorded = nddebug.compare(report.recordings)  # recordings alone: no step to re-run
    table = recorded.verify()
    assert set(table["verdict"]) == {"not verified"}
    crop = table[table["op_type"] == "CropAndResizeGradImage"].iloc[0]
    assert "pass script=" in crop["detail"]


def test_seeding_a_dataset_built_before_the_check_is_not_verified_in_process() -> None:
    """Seeds set before each run of an in-process check cannot reach a dataset built before
    it: verify() said "still divergent" for a fix that works in a fresh process (probe round
    36, finding 4). It says it could not verify it here, and how to."""
    ds = tf.data.Dataset.from_tensor_slices(tf.linspace(0.1, 3.3, 32)).shuffle(32).batch(8)
    w = tf.Variable(1.0)

    @tf.function
    def train_step(x):
        w.assign(w * 0.9 + tf.reduce_sum(x * tf.range(8, dtype=tf.float32)) * 0.01)

    def epoch():
        for x in ds:
            train_step(x)

    report = nddebug.check(epoch, state=w, repeats=3)
    assert not report.ok
    rows = report.verify()
    row = rows[rows["op_type"] == "IteratorGetNext"].iloc[0]
    assert row["verdict"] == "not verified", rows.to_string()
    assert "verify with a script" in row["detail"]


def test_a_recheck_that_did_not_compare_everything_does_not_say_fixed() -> None:
    """The function was traced before any seed was set, so verify()'s re-check with seeds
    checked a seeded copy and said "not everything compared": that row said "fixed", about
    the program that runs unseeded (probe round 41, F3). It is "not verified", with why."""
    import numpy as np
    import tensorflow as tf

    import nddebug

    v = tf.Variable(np.ones((64, 8), np.float32))

    @tf.function
    def step():
        v.assign_add(tf.random.normal([64, 8]) * 0.01)
        return tf.reduce_sum(v)

    step()  # traced now, unseeded
    report = nddebug.check(step, state=v, repeats=2)
    assert "RandomStandardNormal" in set(report.sources["op_type"]), str(report)
    row = report.verify().set_index("op_type").loc["RandomStandardNormal"]
    assert row["verdict"] == "not verified", row.to_dict()
    assert "traced before a global seed was set" in row["detail"], row["detail"]


def test_advice_to_fix_the_hash_seed_is_verified_with_it() -> None:
    """Advice that names PYTHONHASHSEED was verified with seeds alone, which cannot change a
    set's order: "still divergent" beside advice that works (probe round 47, F9)."""
    vocabulary = {
        "kind": "other",
        "fix": "Build the vocabulary in a fixed order (sorted), or start every process with the "
        "same PYTHONHASHSEED (nddebug run --hashseed 0).",
    }
    assert verify.fix_for(vocabulary) == "hash seed"
    assert verify.fix_for({"kind": "random", "fix": "Seed the op."}) == "seeds"
    script = os.path.join(SCRIPTS, "hash_order.py")
    report = _report(script, PYTHONHASHSEED="random")  # 20 strings: never one order by chance
    sources = set(report.sources["op_type"])
    assert sources, str(report)
    table = report.verify(script=script, runs=2, **ENV)
    rows = table[table["op_type"].isin(sources)]
    assert set(rows["fix"]) == {"seeds and hash seed"}, table
    assert set(rows["verdict"]) == {"fixed"}, table
    assert "PYTHONHASHSEED=0" in rows.iloc[0]["detail"], table
