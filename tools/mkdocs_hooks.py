"""mkdocs hooks (mkdocs.yml `hooks:`): each timed page shows how long it takes.

Under its title, every workshop and Week page gets one line: the minutes of its core
path (reading plus running its commands) and of the whole page, folds included. A Week's
introduction replaces the comment `<!-- page-times -->` with a table of its pages. The
figures come from tools/page_times.py: words counted now, run times as recorded.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import page_times

TABLE_MARK = "<!-- page-times -->"
COURSE_MARK = "<!-- course-times -->"
# The course map's rows: a part of the course and its pages (relative to docs/).
PARTS = {
    "Session A + Lab 1": ["workshop/session-a.md", "workshop/lab-1.md"],
    "Session B + Lab 2": ["workshop/session-b.md", "workshop/lab-2.md"],
    "Session C + Lab 3": ["workshop/session-c.md", "workshop/lab-3.md"],
    "Workshop companion pages": [
        "workshop/accelerate.md",
        "workshop/checkpoints.md",
        "workshop/deepspeed.md",
        "workshop/kubernetes.md",
    ],
    **{f"Week {n}": [f"week-{n}/"] for n in range(1, 5)},
}


def time_line(page: str, t: page_times.PageTime) -> str:
    """The line under a page's title."""
    slot = page_times.SLOTS.get(page)
    fits = f" of the session's {slot}" if slot else ""
    return (
        f'<p class="page-time" markdown>**Core path: about {t.core_minutes} min**{fits} '
        f"({t.core_reading_minutes} min reading, {t.core_running_minutes} min running its "
        f"commands). The whole page, every fold opened: about {t.total_minutes} min.</p>"
    )


def nav_pages(nav: list | dict | str | None) -> list[str]:
    """The pages of mkdocs.yml's nav, in reading order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in nav_pages(v)]
    return [p for item in nav or [] for p in nav_pages(item)]


def week_table(
    folder: str, record: dict[str, dict[str, float]], order: list[str] | None = None
) -> str:
    """A Week's pages with their minutes, in the order of the site's navigation."""
    rows = ["| Page | Core path | Whole page |", "| --- | --- | --- |"]
    core = total = 0
    week = [p for p in page_times.timed_pages() if p.startswith(folder + "/")]
    rank = {p: i for i, p in enumerate(order or [])}
    for page in sorted(week, key=lambda p: rank.get(p, len(rank))):
        t = page_times.page_time(page, record)
        name = Path(page).name
        title = (page_times.DOCS / page).read_text().splitlines()[0].lstrip("# ").strip()
        rows.append(f"| [{title}]({name}) | {t.core_minutes} min | {t.total_minutes} min |")
        core, total = core + t.core_minutes, total + t.total_minutes
    rows.append(f"| **The week** | **{core} min** | **{total} min** |")
    return "\n".join(rows)


def course_table(record: dict[str, dict[str, float]]) -> str:
    """The course map's table: minutes per part, core path and whole pages."""
    rows = ["| Part | Pages | Core path | Whole pages |", "| --- | ---: | ---: | ---: |"]
    timed = page_times.timed_pages()
    for part, wanted in PARTS.items():
        pages = [p for p in timed if p.startswith(tuple(wanted))]  # a page or a folder/
        times = [page_times.page_time(p, record) for p in pages]
        core = sum(t.core_minutes for t in times)
        total = sum(t.total_minutes for t in times)
        rows.append(f"| {part} | {len(pages)} | {core} min | {total} min |")
    return "\n".join(rows)


def insert_time(
    markdown: str, page: str, record: dict[str, dict[str, float]], order: list[str] | None = None
) -> str:
    """The page's markdown with its time line under the title (and a Week's table)."""
    if COURSE_MARK in markdown:
        markdown = markdown.replace(COURSE_MARK, course_table(record))
    if page not in page_times.timed_pages():
        return markdown
    lines = markdown.splitlines()
    title = next((i for i, s in enumerate(lines) if s.startswith("# ")), None)
    if title is not None:
        lines.insert(title + 1, "\n" + time_line(page, page_times.page_time(page, record)))
    out = "\n".join(lines) + "\n"
    if TABLE_MARK in out:
        out = out.replace(TABLE_MARK, week_table(str(Path(page).parent), record, order))
    return out


def on_page_markdown(markdown: str, page, config, files) -> str:
    order = nav_pages(config["nav"])
    return insert_time(markdown, page.file.src_uri, page_times.load_record(), order)
