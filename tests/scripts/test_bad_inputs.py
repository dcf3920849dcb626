"""Every bad input of the distributed and the workflows scripts, bad_inputs.CASES, in-process.

Each is refused the one way (ARCHITECTURE.md §3): exit code 2, one line on stderr that
names the fix, nothing created, before any process group or any work. And each is shown
as it is: its row of docs/generated/testing/bad_inputs.md (tools/figures_bad_inputs.py),
the table on "How the course is tested", is the row this run makes.
"""

from pathlib import Path

import pytest
from bad_inputs import CASES, Case, make, run

from helpers import ROOT, load_tool

TABLE = ROOT / "docs" / "generated" / "testing" / "bad_inputs.md"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = tmp_path_factory.mktemp("bad-inputs")
    make(made)
    return made


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.command.replace("code/scripts/", ""))
def test_bad_input_is_one_line_naming_the_fix_nothing_created_and_its_row_in_the_table(
    case: Case, folder: Path
) -> None:
    code, err, created = run(case, folder)
    assert code == 2, err
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert case.says in err, err
    assert created == [], "bad input is refused before anything is written"
    tool = load_tool("figures_bad_inputs")
    assert tool.row(case, code, err) in TABLE.read_text(), "run tools/figures_bad_inputs.py"


def test_the_table_has_a_row_per_case_and_no_other() -> None:
    tool = load_tool("figures_bad_inputs")
    rows = TABLE.read_text().removeprefix(tool.HEADER).splitlines()
    assert len(rows) == len(CASES)
    assert [r.split("``")[1] for r in rows] == [case.command for case in CASES]
