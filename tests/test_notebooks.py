"""The notebooks run top to bottom (nbclient, a real kernel) on the demo's outputs — a
small demo with the API running — and their plots render."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebook_runs_and_plots(path, demo_run, monkeypatch):
    out, result, url = demo_run
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("FEATURELINE_DEMO_DIR", str(out))
    monkeypatch.setenv("REDIS_URL", url)
    notebook = nbformat.read(path, as_version=4)
    # A failing cell raises CellExecutionError naming it.
    NotebookClient(notebook, kernel_name="python3", timeout=300,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} rendered no plot"
