"""Week 1's notebook stores the outputs of a real run, and a run today prints the same.

tools/figures_notebook.py executes docs/week-1/notebook.ipynb in place; the site renders
those outputs and the reader's download carries them. This test runs the notebook again
(four workers, about 25 s) and compares every cell's output with the stored one.
"""

import sys
from pathlib import Path

import nbformat
import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import figures_notebook

NOTEBOOK = ROOT / "docs" / "week-1" / "notebook.ipynb"
FIX = "run `python tools/figures_notebook.py` and commit the notebook"


def test_every_code_cell_has_its_stored_output() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "the notebook has no code cell"
    silent = [c.source.splitlines()[0] for c in code if not c.outputs and c.execution_count]
    unrun = [c.source.splitlines()[0] for c in code if c.execution_count is None]
    assert not unrun, f"cells stored without a run: {unrun}; {FIX}"
    # A cell may print nothing (an assignment); most print, so most carry an output.
    assert len(silent) < len(code) / 2, f"most cells stored no output: {silent}; {FIX}"


@pytest.mark.timeout(240)
def test_a_fresh_run_prints_what_the_notebook_stores(tmp_path: Path) -> None:
    copy = tmp_path / "notebook.ipynb"
    copy.write_bytes(NOTEBOOK.read_bytes())
    fresh = figures_notebook.outputs(figures_notebook.execute(copy))
    stored = figures_notebook.outputs(nbformat.read(NOTEBOOK, as_version=4))
    for i, (f, s) in enumerate(zip(fresh, stored, strict=True)):
        assert f == s, f"code cell {i}: a run today prints {f}, the notebook stores {s}; {FIX}"
