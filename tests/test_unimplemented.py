"""An op with no deterministic kernel here ends check() with a report that names it, not with
TensorFlow's traceback. Op determinism is process-wide: a fresh process, on the emulated GPU."""

from __future__ import annotations

from tests.helpers import run_python


def test_check_names_the_op_that_raises_under_op_determinism() -> None:
    result = run_python(
        """
        import json, tensorflow as tf, nddebug
        from nddebug.examples.detection import make_step
        tf.config.experimental.enable_op_determinism()
        step, args, state = make_step()
        report = nddebug.check(step, *args, repeats=2, state=state, emulate_gpu=True)
        e = report.errors[0]
        print(json.dumps({"ok": report.ok, "op": e.op_type, "name": e.op_name,
                          "fix": e.fix, "text": str(report), "html": report._repr_html_()}))
        """
    )
    assert not result["ok"] and result["op"] == "CropAndResizeGradImage"
    assert result["name"].endswith("CropAndResizeGradImage")
    assert "tf.device('/CPU:0')" in result["fix"]
    text = result["text"]
    assert "NOT checked" in text and "op determinism cannot fix it" in text
    assert "Traceback" not in text and "instead:" in text
    html = result["html"]  # the notebook's report says the same
    assert "NOT checked" in html and "raises: CropAndResizeGradImage" in html and "instead:" in html
