"""tinyscale.core.outputs: every place a run writes, checked before any work, one line each.

A folder or a file that exists as what the run writes, or does not exist yet under a
folder the process may write to, passes, and nothing is created. The other kind in the
way (a file where a folder goes, a folder where a file goes), a file among the parents,
and a parent the process may not write to are each one line naming the flag.
"""

import os
from pathlib import Path

import pytest

from helpers import one_line_error
from tinyscale.core.outputs import check_writable


def test_places_that_exist_or_can_be_made_pass_and_nothing_is_created(tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text("{}")
    assert check_writable(tmp_path, "--out") == tmp_path
    assert check_writable(tmp_path / "new" / "deeper", "--out") == tmp_path / "new" / "deeper"
    assert check_writable(tmp_path, "--out", "index.json", file=True) == tmp_path / "index.json"
    check_writable(tmp_path / "old.json", "--report", file=True)  # replaced when written
    check_writable(tmp_path / "new", "--output-dir", "checkpoints")
    assert [p.name for p in tmp_path.iterdir()] == ["old.json"]


def test_the_other_kind_in_the_way_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    (tmp_path / "out" / "adapter.pt").mkdir(parents=True)
    assert one_line_error(check_writable, tmp_path / "a-file", "--out") == (
        f"--out {tmp_path / 'a-file'} is a file, where the run writes a folder: pass another --out"
    )
    assert one_line_error(check_writable, tmp_path / "out", "--report", file=True) == (
        f"--report {tmp_path / 'out'} is a folder, where the run writes a file: pass another "
        "--report"
    )
    out = tmp_path / "out"
    assert one_line_error(check_writable, out, "--output-dir", "adapter.pt", file=True) == (
        f"--output-dir {out}: {out / 'adapter.pt'} is a folder, where the run writes a file: "
        "remove it or pass another --output-dir"
    )


def test_a_file_among_the_parents_or_a_read_only_parent_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a-file").write_text("")
    blocked = tmp_path / "a-file" / "run"
    assert one_line_error(check_writable, blocked, "--output-dir", "checkpoints") == (
        f"--output-dir {blocked} cannot be created or written ({tmp_path / 'a-file'} is not a "
        "folder this process may write to): pass another --output-dir"
    )
    assert one_line_error(check_writable, blocked, "--report", file=True).startswith(
        f"--report {blocked} cannot be created or written"
    )
    # as root, chmod does not stop a write: ask the check what os.access says of a mount
    # that is read-only (EROFS), the case every user meets on a shared, read-only dataset
    read_only = tmp_path / "ro"
    read_only.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != read_only and real(p, mode))
    assert one_line_error(check_writable, read_only / "run", "--out") == (
        f"--out {read_only / 'run'} cannot be created or written ({read_only} is not a folder "
        "this process may write to): pass another --out"
    )
    check_writable(tmp_path / "elsewhere", "--out")
