""" "How the course is tested" is true of the suite: its tables are rebuilt and compared.

tools/figures_testing.py counts every page's code blocks as pytest-codeblocks collects
them, and the test functions under tests/. The page and the home page include what it
wrote; when a page or a test changes, these tests fail until the tables are rewritten.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from helpers import ROOT, load_tool

FIX = "run `python tools/figures_testing.py` and commit docs/generated/testing/"


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    return load_tool("figures_testing")


def test_the_page_tables_are_those_of_the_pages_today(tool: ModuleType) -> None:
    counts = tool.count_pages()
    assert (tool.OUT / "pages.md").read_text() == tool.pages_table(counts), FIX
    assert (tool.OUT / "summary.md").read_text() == tool.summary(counts), FIX


def test_the_tests_table_is_that_of_the_tests_today(tool: ModuleType) -> None:
    assert (tool.OUT / "tests.md").read_text() == tool.tests_table(), FIX


def test_the_prose_numbers_table_is_that_of_the_pages_today(tool: ModuleType) -> None:
    table = tool.prose_numbers_table()
    assert (tool.OUT / "prose_numbers.md").read_text() == table, FIX
    assert "| **untied** | 0 |" in table  # what tests/docs/test_prose_numbers.py enforces


def test_the_home_page_and_the_testing_page_show_the_totals() -> None:
    include = '--8<-- "docs/generated/testing/summary.md"'
    home = (ROOT / "docs" / "index.md").read_text()
    assert include in home and "(start/testing.md)" in home
    page = (ROOT / "docs" / "start" / "testing.md").read_text()
    for name in ("summary", "pages", "tests", "prose_numbers"):
        assert f'--8<-- "docs/generated/testing/{name}.md"' in page


def test_every_skip_reason_has_a_column_name(tool: ModuleType) -> None:
    from test_skips import REASONS  # the allowed reasons, held in one place

    assert set(tool.SHORT_REASON) <= REASONS
    slurm = [r for r in REASONS - set(tool.SHORT_REASON)]
    assert len(slurm) == 1 and "slurm" in slurm[0].lower()  # the skipif: counted as run


PAGE = """# A page
```bash
echo one
```

<!--pytest-codeblocks:expected-output-->
```text
one
```

<!--pytest.mark.skip(reason="needs GPUs")-->
```bash
nvidia-smi
```

<!--pytest.mark.skipif(1 == 1, reason="needs root and SLURM")-->
```bash
sinfo
```

```python
print(2)
```

```text
not run: a text block
```

--8<-- "docs/generated/lab1/train.txt"
![curve](../generated/lab1/loss_curve.png)
"""


def test_self_check_counts_a_page(tool: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "docs" / "part").mkdir(parents=True)
    page = tmp_path / "docs" / "part" / "page.md"
    page.write_text(PAGE)
    count = tool.count_page(page, docs=tmp_path / "docs")
    assert (count.run, count.compared, count.root_only) == (3, 1, 1)
    assert dict(count.skipped) == {"GPUs": 1}
    assert count.generated == {"lab1/train.txt", "lab1/loss_curve.png"}
    row = tool.pages_table([count]).splitlines()[-1]
    assert row == "| [part/page.md](../part/page.md) | 3 | 1 | 1 | 2 | 1 GPUs |"
