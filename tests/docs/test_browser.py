"""The built site in a real headless browser, with no network (ARCHITECTURE.md §5).

Builds the site with `mkdocs build --strict` into a temporary directory (or takes the one
`make test` has just built, named by TINYSCALE_SITE), serves it on 127.0.0.1 and opens
every page in Chromium. A page fails on: a console error, an uncaught
exception, a failed request or an HTTP error status, any request that leaves 127.0.0.1
(blocked: the course must work offline), a mermaid diagram not rendered to an SVG, and a
`--8<--` left in the HTML (an include that did not expand), and a code block whose lines
all fit in 100 characters that still scrolls sideways at 1280 px (every fold opened and
every tab shown, so the hidden blocks are measured too). Screenshots of the home page,
Session A and Lab 1 go to build/screenshots/ for a human to look at.

Material renders each diagram into a *closed* shadow root; an init script makes
attachShadow open them so the test can see the SVG.
"""

from __future__ import annotations

import dataclasses
import html.parser
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage, Page, Request, Response, Route

pytestmark = pytest.mark.browser

# Debian's chromium; elsewhere (GitHub Actions) point TINYSCALE_CHROMIUM at a Chromium binary.
CHROMIUM = os.environ.get("TINYSCALE_CHROMIUM") or shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip(
        "chromium is not installed (Debian: apt-get install chromium)", allow_module_level=True
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
INLINE_SCHEMES = {"data", "blob", "about"}
VIEWPORT = {"width": 1280, "height": 900}
# Page (URL path under the site) -> screenshot, relative to the repository root.
SCREENSHOTS = {
    "": "build/screenshots/home.png",
    "workshop/session-a/": "build/screenshots/session-a.png",
    "workshop/lab-1/": "build/screenshots/lab-1.png",  # module code at 1280 px
}
# The course code's line length (ruff): a block no wider must show whole, without scrolling.
CODE_COLUMNS = 100
BUILD_TIMEOUT_S = 120
LAUNCH_TIMEOUT_MS = 30_000
GOTO_TIMEOUT_MS = 20_000
IDLE_TIMEOUT_MS = 10_000
MERMAID_TIMEOUT_MS = 15_000
PAGES_AT_ONCE = 6

OPEN_SHADOW_ROOTS = """
const attachShadow = Element.prototype.attachShadow;
Element.prototype.attachShadow = function (init) {
  return attachShadow.call(this, Object.assign({}, init, { mode: "open" }));
};
"""
# Material replaces each <pre class="mermaid"> by a <div class="mermaid"> whose shadow
# root holds the SVG (and drops the class from the <pre> while it renders).
COUNT_RENDERED = """() => [...document.querySelectorAll(".mermaid")].filter(
  (el) => (el.shadowRoot || el).querySelector("svg")).length"""
SVG_TEXTS = """() => [...document.querySelectorAll(".mermaid")].map(
  (el) => ((el.shadowRoot || el).querySelector("svg") || {}).textContent || "")"""
# Opens every fold and shows every tab, then lists the code blocks of at most CODE_COLUMNS
# characters a line that scroll sideways (Material gives `pre > code` overflow: auto).
CODE_THAT_SCROLLS = """(columns) => {
  const style = document.createElement("style");
  style.textContent = ".tabbed-block { display: block !important; }";
  document.head.appendChild(style);
  document.querySelectorAll("details").forEach((d) => { d.open = true; });
  const found = [];
  for (const code of document.querySelectorAll(".md-typeset pre:not(.mermaid) > code")) {
    const lines = code.textContent.split("\\n");
    const longest = Math.max(...lines.map((line) => line.length));
    if (longest <= columns && code.scrollWidth > code.clientWidth + 1) {
      found.push(`${longest} columns, ${code.scrollWidth} px in ${code.clientWidth} px: ` +
                 lines.find((line) => line.length === longest).slice(0, 60));
    }
  }
  return found;
}"""
PRE_TEXTS = """() => [...document.querySelectorAll("pre")].map((el) => el.textContent.trim())"""


VOID_ELEMENTS = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
}


class _MermaidSources(html.parser.HTMLParser):
    """The source text of each diagram a built page asks for (elements of class "mermaid")."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []
        self._depth = 0  # nesting depth inside the current diagram element; 0 outside

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._depth:
            self._depth += tag not in VOID_ELEMENTS
        elif "mermaid" in (dict(attrs).get("class") or "").split():
            self._depth = 1
            self.sources.append("")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        pass  # <br/>, <img .../>: no content, no depth

    def handle_endtag(self, tag: str) -> None:
        if self._depth and tag not in VOID_ELEMENTS:
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._depth:
            self.sources[-1] += data


def mermaid_sources(html_text: str) -> list[str]:
    parser = _MermaidSources()
    parser.feed(html_text)
    return [source.strip() for source in parser.sources]


def build_site(root: Path, site_dir: Path) -> None:
    """`mkdocs build --strict` into site_dir, with the interpreter that runs the tests."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)]
    try:
        proc = subprocess.run(
            cmd, cwd=root, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"mkdocs build took more than {BUILD_TIMEOUT_S} s", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(
            f"mkdocs build --strict failed ({proc.returncode}):\n{proc.stderr[-4000:]}",
            pytrace=False,
        )


def site_pages(site_dir: Path) -> list[str]:
    """URL paths of every page of a built site: "", "start/overview/", ..."""
    paths = []
    for index in site_dir.rglob("index.html"):
        folder = index.parent.relative_to(site_dir).as_posix()
        paths.append("" if folder == "." else folder + "/")
    return sorted(paths)


@dataclasses.dataclass
class Watch:
    """Collects what goes wrong while one page loads."""

    found: list[str] = dataclasses.field(default_factory=list)
    reported: set[str] = dataclasses.field(default_factory=set)  # URLs already in `found`

    def attach(self, page: Page) -> None:
        page.route("**/*", self.route)
        page.on("console", self.console)
        page.on("pageerror", lambda exc: self.found.append(f"uncaught error: {exc}"))
        page.on("requestfailed", self.request_failed)
        page.on("response", self.response)
        page.on("crash", lambda _: self.found.append("page crashed"))

    def route(self, route: Route) -> None:
        url = route.request.url
        parts = urlsplit(url)
        if parts.scheme in INLINE_SCHEMES or parts.hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            self.reported.add(url)
            self.found.append(f"external request (blocked): {url}")
            route.abort()

    def console(self, msg: ConsoleMessage) -> None:
        where = msg.location.get("url", "")
        if msg.type == "error" and where not in self.reported:  # not the same failure twice
            self.found.append(f"console error: {msg.text} ({where})")

    def request_failed(self, request: Request) -> None:
        if request.url not in self.reported:
            self.found.append(f"request failed: {request.url} ({request.failure})")

    def response(self, response: Response) -> None:
        if response.status >= 400:
            self.reported.add(response.url)
            self.found.append(f"HTTP {response.status}: {response.url}")


def start(page: Page, url: str) -> Response | None:
    """Begin loading a page; the browser goes on loading it while we check the others."""
    return page.goto(url, wait_until="commit", timeout=GOTO_TIMEOUT_MS)


def finish(page: Page, response: Response | None, html_text: str, found: list[str]) -> None:
    """Let a started page settle, and check its includes and diagrams."""
    for raw in ("--8<--", "--8&lt;--"):
        for line in html_text.splitlines():
            if raw in line:
                found.append(f"{raw!r} left in the HTML (an include did not expand): {line[:120]}")
    if response is None or response.status != 200:
        found.append(f"navigation returned {response.status if response else 'nothing'}")
    page.wait_for_load_state("load", timeout=GOTO_TIMEOUT_MS)
    try:
        page.wait_for_load_state("networkidle", timeout=IDLE_TIMEOUT_MS)
    except sync_api.TimeoutError:
        found.append(f"network still busy after {IDLE_TIMEOUT_MS / 1000:.0f} s")

    sources = mermaid_sources(html_text)
    if not sources:
        return
    try:
        page.wait_for_function(
            f"() => ({COUNT_RENDERED})() >= {len(sources)}", timeout=MERMAID_TIMEOUT_MS
        )
    except sync_api.TimeoutError:
        rendered = page.evaluate(COUNT_RENDERED)
        as_text = [s.splitlines()[0] for s in sources if s in page.evaluate(PRE_TEXTS)]
        found.append(
            f"{rendered} of {len(sources)} mermaid diagrams rendered to SVG after "
            f"{MERMAID_TIMEOUT_MS / 1000:.0f} s; left as text: {as_text}"
        )
    for text in page.evaluate(SVG_TEXTS):
        if "Syntax error" in text:
            found.append(f"mermaid drew an error instead of a diagram: {text[:120]!r}")


def check_pages(
    site_dir: Path, base_url: str, screenshots: dict[str, Path]
) -> dict[str, list[str]]:
    """Open every page of a built site served at base_url; return the problems per page."""
    problems: dict[str, list[str]] = {}
    paths = site_pages(site_dir)
    for wanted in screenshots:
        if wanted not in paths:
            problems[wanted] = ["page missing from the built site (wanted for a screenshot)"]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=LAUNCH_TIMEOUT_MS
        )
        try:
            context = browser.new_context(viewport=VIEWPORT, service_workers="block")
            context.set_default_timeout(GOTO_TIMEOUT_MS)  # no wait without a limit
            context.add_init_script(OPEN_SHADOW_ROOTS)
            # A few pages load at once: while we wait on one, the browser works on the others.
            for first in range(0, len(paths), PAGES_AT_ONCE):
                batch = []
                for path in paths[first : first + PAGES_AT_ONCE]:
                    watch, page = Watch(), context.new_page()
                    watch.attach(page)
                    started, response = True, None
                    try:
                        response = start(page, base_url + path)
                    except sync_api.Error as exc:
                        watch.found.append(f"browser: {str(exc).splitlines()[0]}")
                        started = False
                    batch.append((path, watch, page, started, response))
                for path, watch, page, started, response in batch:
                    try:
                        if started:
                            html_text = (site_dir / path / "index.html").read_text(encoding="utf-8")
                            finish(page, response, html_text, watch.found)
                        if path in screenshots:
                            screenshots[path].parent.mkdir(parents=True, exist_ok=True)
                            page.screenshot(path=screenshots[path], timeout=GOTO_TIMEOUT_MS)
                        if started:
                            for block in page.evaluate(CODE_THAT_SCROLLS, CODE_COLUMNS):
                                watch.found.append(f"code scrolls sideways at 1280 px: {block}")
                    except sync_api.Error as exc:
                        watch.found.append(f"browser: {str(exc).splitlines()[0]}")
                    finally:
                        page.close()
                    if watch.found:
                        problems.setdefault(path, []).extend(watch.found)
            context.close()
        finally:
            browser.close()
    return problems


def format_problems(problems: dict[str, list[str]]) -> str:
    return f"problems on {len(problems)} pages:\n" + "\n".join(
        f"{path or '(home)'}:\n" + "\n".join(f"  - {p}" for p in found)
        for path, found in sorted(problems.items())
    )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site_dir(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site `make test` built a moment ago (TINYSCALE_SITE), or a fresh build."""
    built = os.environ.get("TINYSCALE_SITE")
    if built:
        assert (Path(built) / "index.html").is_file(), f"TINYSCALE_SITE={built} holds no site"
        return Path(built)
    site = tmp_path_factory.mktemp("site")
    build_site(root, site)
    return site


@pytest.fixture(scope="module")
def base_url(site_dir: Path) -> Iterator[str]:
    class Handler(_QuietHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(site_dir), **kwargs)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.timeout(600)  # 70 pages, each laid out twice (folds shut, then open)
def test_every_page_renders_offline(root: Path, site_dir: Path, base_url: str) -> None:
    assert site_pages(site_dir), "the built site has no pages"
    screenshots = {path: root / shot for path, shot in SCREENSHOTS.items()}
    problems = check_pages(site_dir, base_url, screenshots)
    if problems:
        pytest.fail(format_problems(problems), pytrace=False)
    for shot in screenshots.values():
        assert shot.stat().st_size > 0, f"empty screenshot {shot}"


def test_mermaid_sources_parser() -> None:
    page = (
        '<pre class="mermaid"><code>graph LR\n  A --&gt; B</code></pre>'
        '<p class="x">text</p><div class="mermaid other"><svg><g></g></svg>seq</div>'
    )
    assert mermaid_sources(page) == ["graph LR\n  A --> B", "seq"]
    assert mermaid_sources("<pre><code>graph LR</code></pre>") == []
