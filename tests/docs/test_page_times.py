"""Each workshop and Week page says how long it takes, and its core path fits its slot.

tools/page_times.py counts a page's words (snippet includes expanded) and adds the run
time recorded for each of its code blocks in docs/generated/pages/times.json; the mkdocs
hook tools/mkdocs_hooks.py prints the result under the page's title. These tests check
that every block has a recorded time (a changed block needs a new run), that the record
holds no page that is gone, that each workshop page's core path fits the minutes the
session gives it, and that the hook shows what page_times computes.
"""

import json
import re
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import mkdocs_hooks
import page_times

RECORD = ROOT / "docs" / "generated" / "pages" / "times.json"
PAGES = page_times.timed_pages()
WORKSHOP = [p for p in PAGES if p.startswith("workshop/")]


def test_the_timed_pages_are_the_workshop_and_the_weeks() -> None:
    assert set(page_times.SLOTS) <= set(WORKSHOP)
    for n in range(1, 5):
        assert f"week-{n}/index.md" in PAGES


def test_the_record_is_the_one_the_tool_writes() -> None:
    assert RECORD == page_times.RECORD
    pages = json.loads(RECORD.read_text())["pages"]
    assert sorted(pages) == PAGES, "run `python tools/page_times.py --measure` for new pages"
    assert all(s >= 0 for times in pages.values() for s in times.values())


@pytest.mark.parametrize("page", PAGES)
def test_every_block_has_a_measured_run_time(page: str) -> None:
    t = page_times.page_time(page)
    assert not t.missing, (
        f"{page}: blocks at lines {t.missing} have no recorded run time (new or changed "
        f"code): run `python tools/page_times.py --measure docs/{page}`"
    )


@pytest.mark.parametrize("page", sorted(page_times.SLOTS))
def test_a_sessions_core_path_fits_its_slot(page: str) -> None:
    t = page_times.page_time(page)
    slot = page_times.SLOTS[page]
    assert t.core_minutes <= slot, (
        f"{page}: the core path takes {t.core_minutes} min ({t.core_words} words, "
        f"{t.core_run_s:.0f} s of commands), its slot {slot} min: fold a deep dive"
    )
    assert t.core_minutes < t.total_minutes, f"{page}: nothing is folded away from its core path"


@pytest.mark.parametrize("page", sorted(set(WORKSHOP) - set(page_times.SLOTS)))
def test_a_companion_pages_core_path_is_a_sitting(page: str) -> None:
    t = page_times.page_time(page)
    assert t.core_minutes <= page_times.COMPANION_MINUTES, (
        f"{page}: core path {t.core_minutes} min, more than "
        f"{page_times.COMPANION_MINUTES}: fold a deep dive"
    )


def test_the_hook_shows_the_computed_minutes_under_the_title() -> None:
    page = "workshop/lab-1.md"
    record = page_times.load_record()
    t = page_times.page_time(page, record)
    markdown = (page_times.DOCS / page).read_text()
    out = mkdocs_hooks.insert_time(markdown, page, record).splitlines()
    title = next(i for i, s in enumerate(out) if s.startswith("# "))
    line = next(s for s in out[title + 1 :] if s.strip())
    assert f"Core path: about {t.core_minutes} min" in line
    assert f"{t.core_reading_minutes} min reading" in line
    assert f"every fold opened: about {t.total_minutes} min" in line
    assert "session's 35" in line
    untimed = "start/overview.md"
    text = (page_times.DOCS / untimed).read_text()
    assert mkdocs_hooks.insert_time(text, untimed, record) == text


@pytest.mark.parametrize("n", range(1, 5))
def test_each_week_lists_its_pages_and_their_sum(n: int) -> None:
    page = f"week-{n}/index.md"
    record = page_times.load_record()
    text = (page_times.DOCS / page).read_text()
    assert mkdocs_hooks.TABLE_MARK in text, f"{page}: no `{mkdocs_hooks.TABLE_MARK}` table"
    out = mkdocs_hooks.insert_time(text, page, record)
    week = [p for p in PAGES if p.startswith(f"week-{n}/")]
    for p in week:
        assert f"]({p.split('/')[1]})" in out, f"{page}: the table lacks {p}"
    core = sum(page_times.page_time(p, record).core_minutes for p in week)
    assert f"| **The week** | **{core} min** |" in out


def test_the_course_map_adds_up_the_parts() -> None:
    record = page_times.load_record()
    text = (page_times.DOCS / "start/course-map.md").read_text()
    out = mkdocs_hooks.insert_time(text, "start/course-map.md", record)
    assert mkdocs_hooks.COURSE_MARK not in out
    lab1 = [page_times.page_time(p, record) for p in ("workshop/session-a.md", "workshop/lab-1.md")]
    core = sum(t.core_minutes for t in lab1)
    assert re.search(rf"\| Session A \+ Lab 1 \| 2 \| {core} min \|", out)
    assert "| Week 4 |" in out


def test_mkdocs_runs_the_hook() -> None:
    assert "  - tools/mkdocs_hooks.py" in (ROOT / "mkdocs.yml").read_text()


def test_self_check_folds_words_and_includes(tmp_path, monkeypatch) -> None:
    lines = [
        "# T",
        "one two",
        '??? note "Going further: x"',
        "",
        "    three four five",
        "    ```bash",
        "    echo hi",
        "    ```",
        "six",
        '???+ note "open"',
        "    seven",
    ]
    assert page_times.folded_lines(lines) == {2, 3, 4, 5, 6, 7}
    assert page_times.words("<!--pytest.mark.skip-->a b_c d-e it's") == 4
    docs = tmp_path / "docs"
    (docs / "workshop").mkdir(parents=True)
    (tmp_path / "m.py").write_text("# --8<-- [start:s]\nx = 1\n# --8<-- [end:s]\ny = 2\n")
    page = '# T\n\nword\n\n??? note "N"\n\n    ```python\n    --8<-- "m.py:s"\n    ```\n'
    (docs / "workshop" / "p.md").write_text(page)
    monkeypatch.setattr(page_times, "ROOT", tmp_path)
    monkeypatch.setattr(page_times, "DOCS", docs)
    w = page_times.page_words("workshop/p.md")
    assert (w.core, w.total) == (2, 2)  # prose: T, word (the fold's title is out)
    assert (w.core_code, w.total_code) == (0, 3)  # code, in the fold: python, x, 1
    # code is read at half the rate of prose: 2 prose words and 3 code words
    assert w.reading_minutes(core=False) == 2 / 200 + 3 / 100


def test_a_weeks_table_follows_the_navigation() -> None:
    nav = [{"Weeks": [{"Week 2": [{"Intro": "week-2/index.md"}, "week-2/fsdp.md"]}]}]
    order = mkdocs_hooks.nav_pages(nav)
    assert order == ["week-2/index.md", "week-2/fsdp.md"]
    table = mkdocs_hooks.week_table("week-2", page_times.load_record(), order[::-1])
    rows = [r for r in table.splitlines() if r.startswith("| [")]
    assert "(fsdp.md)" in rows[0] and "(index.md)" in rows[1]  # the order given, not a-z
