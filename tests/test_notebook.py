"""The example notebook runs end to end (executed with nbclient, as a reader would run it)."""

from __future__ import annotations

import os

import pytest

from helpers import REPO

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = REPO / "examples" / "quickstart.ipynb"


@pytest.mark.slow
def test_the_quickstart_notebook_runs(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), "commit it unexecuted"
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    text = "\n".join(out.get("text", "") for cell in notebook.cells for out in cell.get("outputs", []))
    stderr = [out.get("text", "") for cell in notebook.cells for out in cell.get("outputs", [])
              if out.get("name") == "stderr"]
    assert not any("IProgress" in t or "TqdmWarning" in t for t in stderr), stderr  # a reader sees no warning
    assert "['rot0', 'rot90', 'rot180', 'rot270', 'invert']" in text  # the run's experiences
    assert "'acc'" in text and "ACC" in text  # the run's scores and the leaderboard's rows printed
    figures = [out for cell in notebook.cells for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
    assert figures, "the R-matrix heatmap was not drawn"
