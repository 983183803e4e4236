"""The example notebook runs end to end in a fresh Jupyter kernel of this environment and
shows what it promises: the CNN reproducible, the crop culprit found by the cell magic (with
its picture and table), and the fix confirmed."""

from __future__ import annotations

import json
import os
import sys

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from tests.helpers import CPU_ONLY, ROOT, subprocess_env

NOTEBOOK = os.path.join(ROOT, "docs", "examples", "find-a-culprit.ipynb")


def _kernel(tmp_path) -> KernelManager:
    """A kernel running this interpreter (the project's venv), whatever kernels are installed."""
    spec_dir = tmp_path / "kernels" / "nddebug-test"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "nddebug test",
        "language": "python",
        # CPU facts (the CNN reproducible, the crop race); the caller's PYTHONPATH is kept.
        "env": {
            "PYTHONPATH": subprocess_env()["PYTHONPATH"],
            "TF_CPP_MIN_LOG_LEVEL": "2",
            **CPU_ONLY,
        },
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return KernelManager(kernel_name="nddebug-test", kernel_spec_manager=ksm)


def _outputs(cell) -> dict[str, str]:
    """The cell's outputs by mime type (text and stream text joined)."""
    out: dict[str, str] = {}
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            out["stream"] = out.get("stream", "") + o["text"]
        for mime, data in o.get("data", {}).items():
            out[mime] = out.get(mime, "") + (data if isinstance(data, str) else json.dumps(data))
    return out


def test_committed_without_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.slow
def test_notebook_runs_and_finds_the_culprit(tmp_path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb,
        km=_kernel(tmp_path),
        timeout=240,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    cells = {c.source.splitlines()[0]: _outputs(c) for c in nb.cells if c.cell_type == "code"}
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors, errors

    cnn = cells["model = mnist_cnn.make_model(seed=0)"]
    assert "nddebug: reproducible" in cnn["text/plain"]
    assert "bitwise identical" in cnn["text/html"] and "<svg" not in cnn["text/html"]

    magic = cells["%%nddebug -n 3 --state det_state"]
    assert "NOT reproducible" in magic["text/plain"]
    assert "Source: CropAndResizeGradImage" in magic["text/plain"]
    html = magic["text/html"]
    # The first source is annotated where it starts (the label's wording follows its side).
    assert "<svg" in html and "starts here" in html
    assert 'class="first-source"' in html and "CropAndResizeGradImage (source" in html
    assert "detection.py" in magic["text/plain"]  # created-at points into the step's source

    table = cells["culprits = _nddebug_report.culprits"]
    assert "CropAndResizeGradImage" in table["text/html"] and "source" in table["text/plain"]
    assert (
        "enable_op_determinism" in cells['print(_nddebug_report.sources.loc[0, "fix"])']["stream"]
    )
    assert cells["tf.config.experimental.enable_op_determinism()"]["text/plain"] == "True"
