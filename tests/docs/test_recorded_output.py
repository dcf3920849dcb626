"""helpers.recorded_output returns only an output that CI compares with a fresh run, and
the time masks of that comparison hide the clock and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import ROOT, masked, recorded_output

PAGE = """# A page

```bash
echo compared
```

<!--pytest-codeblocks:expected-output-->
```text
compared
```

<!--pytest.mark.skip(reason="needs GPUs")-->
```bash
echo skipped
```

<!--pytest-codeblocks:expected-output-->
```text
skipped
```

```bash
echo shown only
```

```text
shown only
```
"""


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    (tmp_path / "page.md").write_text(PAGE)
    return tmp_path


def test_the_output_of_a_block_that_runs_is_returned(docs: Path) -> None:
    assert recorded_output("page.md", "echo compared", docs) == ["compared"]


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("echo skipped", "skipped in CI"),
        ("echo shown only", "no expected-output block"),
        ("echo", "3 code blocks"),
        ("echo missing", "0 code blocks"),
    ],
)
def test_an_output_ci_does_not_compare_is_refused(docs: Path, command: str, reason: str) -> None:
    with pytest.raises(LookupError, match=reason):
        recorded_output("page.md", command, docs)


LINE = "2026-11-22 08:31:56,188 rank 0/2 | step 20 | loss 6.0625 | 35,931 tokens/s over 2 ranks"


def test_the_masks_hide_the_clock_and_nothing_else() -> None:
    later = LINE.replace("08:31:56,188", "09:02:11,004").replace("35,931", "9,120.5")
    assert masked(later) == masked(LINE)
    for changed in ("loss 6.0626", "step 21", "rank 1/2", "over 4 ranks"):
        other = LINE.replace(
            {"loss 6.0626": "loss 6.0625", "step 21": "step 20", "rank 1/2": "rank 0/2",
             "over 4 ranks": "over 2 ranks"}[changed], changed
        )  # fmt: skip
        assert masked(other) != masked(LINE), changed


def test_the_storage_report_masks_its_times_and_keeps_its_counts() -> None:
    line = "    1 file(s) of  65536 KiB:  0.077 s,   870.9 MB/s,  77.056 ms per file"
    slower = "    1 file(s) of  65536 KiB: 12.345 s,     5.4 MB/s, 12345.678 ms per file"
    assert masked(slower) == masked(line)
    assert masked(line.replace("65536 KiB", "32768 KiB")) != masked(line)
    assert masked(line.replace("1 file(s)", "2 file(s)")) != masked(line)


MARKER = "<!--pytest-codeblocks:expected-output-->"
RUNS = ("python", "bash", "sh")


def attached_outputs(page: Path) -> tuple[int, int]:
    """(expected-output markers on the page, blocks that run and carry one)."""
    from pytest_codeblocks import extract_from_file

    blocks = extract_from_file(page)
    attached = [b for b in blocks if b.expected_output is not None and b.syntax in RUNS]
    return page.read_text().count(MARKER), len(attached)


@pytest.mark.parametrize(
    "page", sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
)
def test_every_expected_output_belongs_to_a_block_that_runs(page: str) -> None:
    """A marker separated from its block (say, by an admonition) is compared with nothing."""
    markers, attached = attached_outputs(ROOT / "docs" / page)
    assert markers == attached, f"{markers - attached} expected output(s) follow no block that runs"


def test_self_check_a_detached_output_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    block, output = "```bash\necho hi\n```\n\n", f"{MARKER}\n```\nhi\n```\n"
    page.write_text(block + output)
    assert attached_outputs(page) == (1, 1)
    page.write_text(
        block + '??? note "between"\n    ```python title="x.py"\n    x = 1\n    ```\n\n' + output
    )
    assert attached_outputs(page) == (1, 0)
