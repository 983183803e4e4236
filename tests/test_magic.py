"""The %%nddebug cell magic in a real IPython shell (in a fresh process: the shell is a
process-wide singleton)."""

from __future__ import annotations

import pytest

from tests.helpers import run_python


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("magic") / "report.html"
    code = """
        import json, sys
        import nddebug
        no_ipython_on_import = "IPython" not in sys.modules

        from IPython.core.error import UsageError
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "nddebug")
        setup = shell.run_cell('''
        import keras, numpy as np, tensorflow as tf

        def build():
            keras.utils.set_random_seed(0)
            m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                                  keras.layers.Dropout(0.5), keras.layers.Dense(1)])
            opt = keras.optimizers.Adam()

            @tf.function
            def train(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(m(x, training=True) - y))
                grads = tape.gradient(loss, m.trainable_variables)
                opt.apply_gradients(zip(grads, m.trainable_variables))
                return loss

            return m, opt, train

        model, opt, train = build()
        twin, twin_opt, twin_train = build()
        rng = np.random.default_rng(0)
        x, y = rng.random((16, 6), dtype=np.float32), rng.random((16, 1), dtype=np.float32)
        train(x, y)  # a notebook that already trained: both functions are traced before
        twin_train(x, y)

        w = tf.Variable(tf.zeros([3]), name="w")
        v = tf.Variable(tf.ones([3]), name="v")

        # No global seed (build() set one): the op below seeds itself at random. Under a
        # global seed it draws a seeded stream, and check() compares that from its start.
        tf.random.set_seed(None)

        @tf.function
        def noisy_step():
            w.assign_add(tf.random.uniform([3]))  # unseeded: differs in every run
            v.assign(v * 2.0)
            return tf.reduce_sum(w) + tf.reduce_sum(v)

        noisy_step()  # traced before the check, as in a notebook that already trained
        ''')
        assert setup.success, setup.error_in_exec
        user_function = shell.user_ns["noisy_step"]

        shell.user_ns.update(calls=0, seen=[])
        # The cell's Python state changes too: every run starts from it as it was.
        cell = "calls += 1\\nseen.append(calls)\\nloss = train(x, y * calls)\\n"
        ok = shell.run_cell_magic("nddebug", "-n 2 --state model opt", cell)
        ns = shell.user_ns
        ns["twin_train"](ns["x"], ns["y"])
        mine = ns["model"].weights + ns["opt"].variables
        theirs = ns["twin"].weights + ns["twin_opt"].variables
        one_step = all((a.numpy() == b.numpy()).all() for a, b in zip(mine, theirs))
        data, _ = shell.display_formatter.format(ok)

        bad = shell.run_cell_magic(
            "nddebug", "-n 2 --state w --state v -o __OUT__", "total = noisy_step()\\n"
        )
        sources = bad.sources

        errors = {}
        for line in ["-n 1", "-n x", "--state opt nope", "--repeats"]:
            try:
                shell.run_cell_magic("nddebug", line, "x\\n")
            except UsageError as e:
                errors[line] = str(e)
        try:
            shell.run_cell_magic("nddebug", "-n 2", "  \\n")
        except UsageError as e:
            errors["empty cell"] = str(e)

        print(json.dumps({
            "no_ipython_on_import": no_ipython_on_import,
            "ok": ok.ok,
            "ok_types": sorted({op.op_type for op in ok.recordings[0].ops.values()}),
            "ok_warnings": ok.warnings,
            "one_step": one_step,
            "loss_set": "loss" in shell.user_ns,
            "python_state": [shell.user_ns["calls"], shell.user_ns["seen"]],
            "stored": shell.user_ns["_nddebug_report"] is bad,
            "mimes": sorted(data),
            "html_verdict": "nddebug: reproducible</h3>" in data["text/html"],
            "bad_ok": bad.ok,
            "sources": list(sources["op_type"]),
            "source_location": sources["location"].iloc[0] if len(sources) else "",
            "bad_warnings": bad.warnings,
            "variables": sorted(
                bad.culprits.query("op_type == 'VariableState'")["op_name"]
            ),
            "function_restored": shell.user_ns["noisy_step"] is user_function,
            "page": open("__OUT__", encoding="utf-8").read(),
            "errors": errors,
        }))
        """
    return run_python(code.replace("__OUT__", str(out)))


def test_import_does_not_load_ipython(result) -> None:
    assert result["no_ipython_on_import"]


def test_deterministic_keras_cell_is_reproducible_and_advances_one_step(result) -> None:
    assert result["ok"], result
    # The step was traced before the magic; its copy was instrumented, so its ops were seen.
    assert {"MatMul", "ReluGrad"} <= set(result["ok_types"]), result
    assert not any("uninstrumented" in w or "no state=" in w for w in result["ok_warnings"])
    # Weights and optimizer slots bitwise as after one ordinary step of the user's function.
    assert result["one_step"], "the model must be as after one ordinary training step"
    assert result["loss_set"], "the cell runs in the user's namespace"
    # As after one run of the cell: check() ran it 5 times, each from the namespace as it was.
    assert result["python_state"] == [1, [1]], result["python_state"]
    assert result["mimes"] == ["text/html", "text/plain"] and result["html_verdict"]


def test_random_cell_names_the_source_inside_a_pretraced_function(result) -> None:
    assert not result["bad_ok"] and result["stored"]
    # The function was traced before the magic; it was retraced, so its ops were seen.
    assert result["sources"] == ["RandomUniform"], result
    assert "noisy_step" in result["source_location"]
    assert not any("uninstrumented" in w for w in result["bad_warnings"]), result["bad_warnings"]
    # Both --state variables were restored and compared: w took the noise, v did not.
    assert result["variables"] == ["w:0"], result
    assert result["function_restored"], "the user's own tf.function is back in the namespace"
    page = result["page"]  # -o FILE.html
    assert page.startswith("<!doctype html>") and "<svg" in page and "RandomUniform" in page


def test_usage_errors_are_one_clear_line(result) -> None:
    errors = result["errors"]
    assert errors["-n 1"] == "-n must be at least 2 to compare runs, got 1"
    assert "invalid int value: 'x'" in errors["-n x"]
    assert errors["--state opt nope"] == "--state nope: no variable named 'nope' in the namespace"
    assert "expected one argument" in errors["--repeats"]
    assert errors["empty cell"] == "%%nddebug needs a cell body: the training step to check"
    assert all("\n" not in e for e in errors.values())
