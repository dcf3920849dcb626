"""No Markdown shows through on the built site: every fence and fold was rendered.

An unindented line inside a fold (`??? success "Solution"`) ends the fold early; the rest
of its content then renders as a paragraph, and a code fence in it shows as literal
backticks. mkdocs builds such a page without a warning, so this test reads the built
HTML (the site `make test` has just built, named by TINYSCALE_SITE, or a fresh build):
outside <pre>, <code>, <script> and <style>, no text may hold a fence (three backticks or
tildes) or a fold's `???`/`!!!` marker.
"""

from __future__ import annotations

import html.parser
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

LEAKS = re.compile(r"```|~~~|^\s*(?:\?\?\?\+?|!!!) ", re.M)
RAW = {"pre", "code", "script", "style", "textarea"}


class Leaks(html.parser.HTMLParser):
    """Text outside code that still holds Markdown block syntax."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0  # how many RAW elements we are inside
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs) -> None:
        self.depth += tag in RAW

    def handle_endtag(self, tag: str) -> None:
        self.depth -= tag in RAW and self.depth > 0

    def handle_data(self, data: str) -> None:
        if self.depth == 0 and LEAKS.search(data):
            self.found.append(" ".join(data.split())[:120])


def leaks(html_text: str) -> list[str]:
    parser = Leaks()
    parser.feed(html_text)
    return parser.found


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = os.environ.get("TINYSCALE_SITE")
    if built:
        assert (Path(built) / "index.html").is_file(), f"TINYSCALE_SITE={built} holds no site"
        return Path(built)
    out = tmp_path_factory.mktemp("site")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=300)
    return out


def test_no_markdown_shows_on_any_page(site: Path) -> None:
    pages = sorted(site.rglob("index.html"))
    assert len(pages) > 40, f"{site} holds {len(pages)} pages: not the course's site"
    found = [
        f"{page.parent.relative_to(site).as_posix()}: {leak!r}"
        for page in pages
        for leak in leaks(page.read_text())
    ]
    assert not found, "Markdown left unrendered (a line outdented in a fold?):\n" + "\n".join(found)


def test_the_check_sees_a_fence_that_escaped_its_fold() -> None:
    broken = (
        '<details class="success"><summary>Solution</summary><p>Run:</p></details>'
        "<p>```python\nprint(1)\n```</p>"
    )
    assert leaks(broken) == ["```python print(1) ```"]
    fine = "<details><pre><code>```python\n</code></pre></details><p>a ``` b</p>"
    assert leaks(fine) == ["a ``` b"]
    assert leaks("<pre>```</pre><code>???</code><p>??? note</p>") == ["??? note"]
