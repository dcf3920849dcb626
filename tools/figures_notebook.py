"""Execute Week 1's notebook in place, so its page and its download show real outputs.

Run:  python tools/figures_notebook.py        (part of `make figures`)

The notebook starts four workers and sends them cell after cell. Its outputs are the same
from run to run (what ranks print, not timings), so they are stored in the .ipynb itself:
the site renders them, and a reader who downloads the notebook sees what it printed
before running it. tests/docs/test_notebook.py runs it again and compares.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "week-1" / "notebook.ipynb"
TIMEOUT_S = 120  # per cell: a stuck collective fails the run instead of blocking it


def execute(path: Path = NOTEBOOK) -> nbformat.NotebookNode:
    """The notebook, run top to bottom in its own folder, without per-cell timestamps."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": path.parent}}
    )
    client.execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # wall-clock times: they differ every run
    return nb


# A rank's error keeps its type, not its words: when the mismatched-collective cell times
# out, gloo words the same failure by what each rank was doing at that moment (a receive,
# a send, a closed connection), and on a loaded machine that can change from run to run.
ERROR_TEXT = re.compile(r"(\w+Error): .*")


def outputs(nb: nbformat.NotebookNode) -> list[list[dict]]:
    """What each code cell printed or returned, for comparing two runs."""
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outs = [{k: v for k, v in o.items() if k != "execution_count"} for o in cell.outputs]
        for out in outs:
            if "text" in out:
                out["text"] = ERROR_TEXT.sub(r"\1: ...", out["text"])
        found.append(outs)
    return found


def main() -> None:
    nbformat.write(execute(), NOTEBOOK)
    print(f"wrote {NOTEBOOK.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
