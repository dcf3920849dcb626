"""The storage page's sizes in prose are the tool's defaults, and its words about the recorded
write are true of it.

- the laptop run writes what `tinyscale.ops.storage.compare` writes by default: a total of
  64 MiB, once as one file and once as 1024 small files;
- "dozens of times slower": the recorded small-file write against the big one (the output
  block beside it on the page).
"""

from __future__ import annotations

import inspect
import re

import pytest

from helpers import fails_when_changed, prose, said
from tinyscale.ops.storage import compare

PAGE = "operations/storage.md"
MIB, KIB = 2**20, 2**10


def check_sizes(text: str) -> None:
    total, files, size = said(
        text, r"(\d+) MiB as one file, then as (\d+) files of (\d+) KiB, in a scratch directory"
    )
    defaults = inspect.signature(compare).parameters
    assert int(total) * MIB == defaults["total_bytes"].default
    assert int(files) == defaults["small"].default
    assert int(size) * KIB * int(files) == int(total) * MIB


def check_slower(text: str) -> None:
    small, big = said(
        text,
        r"The same bytes, dozens of times slower\*\* as small files \(([\d.]+) s against "
        r"([\d.]+) s above\)",
    )
    recorded = dict(re.findall(r"(\d+) file\(s\) of +\d+ KiB: +([\d.]+) s", text))
    assert (recorded["1024"], recorded["1"]) == (small, big)
    assert 24 <= float(small) / float(big) < 144, "dozens"


@pytest.mark.parametrize("check", [check_sizes, check_slower])
def test_the_pages_words_are_true_of_the_tool_and_its_run(check) -> None:
    check(prose(PAGE))


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [
        (check_sizes, "then as 1024 files of 64 KiB", "then as 512 files of 64 KiB"),
        (check_slower, "(3.757 s against", "(0.757 s against"),
    ],
)
def test_self_check_a_changed_number_fails(check, old: str, new: str) -> None:
    fails_when_changed(check, prose(PAGE), old, new)
