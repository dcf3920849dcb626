"""Every number in a page's sentences is tied to data: the prose-number check.

Try it: python tools/prose_numbers.py            (every page; exit 1 on an untied number)
        python tools/prose_numbers.py docs/week-3/moe.md --all   (each number and its tie)

A page's prose is its Markdown outside code: fenced blocks, inline code, snippet
includes, HTML comments and tags, and link targets are left out. In the prose this finds
the numbers that report a measurement or a property of the course's data:

- a number with a unit of time, size, rate or ratio (``12.5 s``, ``3 MiB``, ``0.89×``,
  ``26 %``, ``1,200 tokens/s``, ``1.2M parameters``);
- a decimal (``6.9146``, a loss), a number with a thousands separator (``33,952``), a
  power of ten (``1e-6``, ``10⁻⁸``);
- a word that states a ratio (``halves``, ``twice``, ``a third``, ``most of``,
  ``a hundred times``).

Each one must be tied, in one of four ways (ARCHITECTURE.md §5 states the rule):

- **data**: the same value, to the digits the sentence gives, is in a compared output
  block of the same page or in a generated file the page includes (``docs/generated/``);
- **test**: a test reads the sentence: a string pattern passed to ``said``, ``sentence``
  or ``prose_claims`` in a test file that names the page matches the text around it;
- **rule**: the page's entry in ``tests/docs/prose_rules/<part>.py`` names the phrase and the
  rule it passes by (a definition, a cited source, arithmetic shown on the page);
- **version**: a version number after the name of the software it versions.

Anything else is **untied**, and ``tests/docs/test_prose_numbers.py`` fails on it.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TESTS = ROOT / "tests"
RULES_DIR = TESTS / "docs" / "prose_rules"

# --8<-- [start:rules]
RULES = {
    "definition": "a value the course sets: a preset, a flag, a world size, a formula's constant",
    "source": "a figure from outside this machine, its source named in the same sentence",
    "arithmetic": "derived on the page from numbers beside it, the arithmetic shown",
    "example": "an input the text chooses for a worked example (a 70B model, 8 GPUs)",
    "not a number": "a word or figure that states no quantity: a ratio-looking word (the second"
    " half of a page), an identifier (an arXiv id, a section number)",
}
# --8<-- [end:rules]

UNITS = (
    r"(?:tokens?/s|tok/s|samples?/s|steps?/s|it/s|TFLOP/s|GFLOP/s|PFLOP/s|TFLOPs?|GFLOPs?|"
    r"PFLOPs?|FLOPs?|GB/s|GiB/s|MB/s|MiB/s|Gb/s|Gbit/s|KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB|"
    r"bytes?|bits?|ms|µs|us|ns|s|sec|seconds?|mins?|minutes?|h|hours?|days?|%|×|x|"
    r"times|percent|M|B|k|K|T|"
    r"parameters?|params?|tokens?|words?|characters?|lines?|steps?|"
    r"GPU-hours?|GPU hours?|W|watts?|°C|GHz)"
)
NUMBER = re.compile(
    r"(?<![\w.\-/])"  # not the tail of a name (fp8, ZeRO-3, H200, v2.1)
    r"(?P<num>10[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+|\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
    r"(?P<tail>(?:\s?(?:" + UNITS[3:-1] + r"))(?![\w/])|[a-zA-Z]*)"
)
RATIO_WORDS = re.compile(
    r"\b(?:halves|halved|halve|halving|half|twice|doubles|doubled|doubling|triples|tripled|"
    r"quadruples|quadrupled|a third|two thirds|two-thirds|a quarter|three quarters|"
    r"three-quarters|most of|the majority|an order of magnitude|orders of magnitude|"
    r"(?:ten|a hundred|hundred|a thousand|thousand|two|three|four|five) times|"
    r"[a-z]+fold)\b",
    re.IGNORECASE,
)
# "half precision" names a format, the "second half" of a text is a place
NOT_RATIO = re.compile(
    r"half[- ]precision|(?:first|second|other|top|bottom|left|right|back|front|last) half",
    re.IGNORECASE,
)
SOFTWARE = (
    "torch|PyTorch|Python|DeepSpeed|torchtitan|torchao|NCCL|CUDA|cuDNN|cuBLAS|driver|mkdocs|"
    "Material|pytest-codeblocks|pytest|mermaid|Slurm|SLURM|slurm-wlm|Accelerate|accelerate|"
    "transformers|peft|Kubernetes|macOS|Ubuntu|Debian|triton|Triton|numpy|NumPy|tensorboard|"
    "TensorBoard|wandb|W&B|tokenizers|datasets|Chromium|nbdistributed|version|versions|release|"
    "ROCm|RCCL|gloo|Gloo|MPI|OpenMPI|Open MPI|Docker|Apptainer|Singularity|Helm|kubectl|kind|"
    "Transformer Engine|Megatron-LM|Megatron|cu|PyPI|pip|JAX|Llama|Llama-3|GPT|GPT-2|GPT-3|"
    "Mixtral|DeepSeek|DeepSeek-V3|Qwen|OLMo|Gemma|Mistral|Python's|torch's"
)
VERSION = re.compile(r"(?:\b(?:" + SOFTWARE + r")\s*v?$)|(?:\bv$)")


@dataclass
class Number:
    """One number (or ratio word) in a page's prose, where it is, and what ties it."""

    page: str
    text: str
    line: int
    start: int  # offset in the page's collapsed text
    end: int
    tie: str = ""
    why: str = field(default="", repr=False)


def collapse(raw: str) -> tuple[str, list[int]]:
    """The text with every run of whitespace made one space, and for each of its
    characters the offset it came from in ``raw`` (as tests' ``prose()`` reads a page)."""
    out: list[str] = []
    where: list[int] = []
    space = False
    for i, ch in enumerate(raw):
        if ch.isspace():
            space = bool(out)
            continue
        if space:
            out.append(" ")
            where.append(i - 1)
            space = False
        out.append(ch)
        where.append(i)
    return "".join(out), where


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<mark>```+|~~~+)")


def code_spans(raw: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of what is not prose: fenced blocks ("fence", with the fence's
    first line), snippet include lines, HTML comments and tags, inline code, link targets."""
    spans: list[tuple[int, int, str]] = []
    pos = 0
    lines = raw.splitlines(keepends=True)
    open_mark: str | None = None
    start = 0
    for line in lines:
        m = FENCE.match(line)
        if open_mark is None and m:
            open_mark, start = m["mark"], pos
        elif open_mark is not None and m and line.strip().startswith(open_mark[0] * 3):
            if line.strip().strip(open_mark[0]) == "":
                spans.append((start, pos + len(line), "fence"))
                open_mark = None
        elif open_mark is None and line.lstrip().startswith("--8<--"):
            spans.append((pos, pos + len(line), "include"))
        pos += len(line)
    if open_mark is not None:
        spans.append((start, len(raw), "fence"))
    for pattern, kind in (
        (r"<!--.*?-->", "comment"),
        (r"`[^`\n]+`", "code"),
        (r"\]\([^)\s]*(?:\s+\"[^\"]*\")?\)", "link"),
        (r"^\[[^\]]+\]:\s*\S+.*$", "link"),
        (r"</?[a-zA-Z][^>\n]*>", "tag"),
        (r"\{[#.:][^}\n]*\}", "attributes"),
    ):
        for m in re.finditer(pattern, raw, re.S | re.M):
            spans.append((m.start(), m.end(), kind))
    return spans


def covered(spans: list[tuple[int, int, str]], start: int, end: int) -> bool:
    return any(a <= start and end <= b for a, b, _ in spans)


@dataclass
class Page:
    """A page's raw text, collapsed text and the numbers in its outputs and includes."""

    name: str
    raw: str
    text: str
    where: list[int]
    spans: list[tuple[int, int, str]]
    data: set[str]

    @classmethod
    def read(cls, name: str, raw: str | None = None) -> Page:
        raw = (DOCS / name).read_text() if raw is None else raw
        text, where = collapse(raw)
        spans = code_spans(raw)
        return cls(name, raw, text, where, spans, page_data(raw, spans))

    def line_of(self, offset: int) -> int:
        return self.raw.count("\n", 0, self.where[offset]) + 1


DATA_NUMBER = re.compile(r"(?<![\w.])-?(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:e[-+]?\d+)?)")


def page_data(raw: str, spans: list[tuple[int, int, str]]) -> set[str]:
    """Every number printed in a compared output block of the page and in the generated
    files it includes: the data a sentence on the page may repeat."""
    texts: list[str] = []
    for a, b, kind in spans:
        block = raw[a:b]
        if kind == "fence":
            before = raw[max(0, a - 200) : a]
            if "expected-output" in before.rstrip().rsplit("\n\n", 1)[-1] or "--8<--" in block:
                texts.append(block)
        if kind in ("fence", "include"):
            for path in re.findall(r'--8<--\s+"(docs/generated/[^":]+)', block):
                if (ROOT / path).exists() and not path.endswith(".png"):
                    texts.append((ROOT / path).read_text(errors="replace"))
    numbers: set[str] = set()
    for t in texts:
        numbers.update(m[1].replace(",", "") for m in DATA_NUMBER.finditer(t))
    return numbers


def value(token: str) -> float | None:
    token = token.replace(",", "")
    sup = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")
    if token.startswith("10") and any(c in token for c in "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"):
        return 10.0 ** int(token[2:].translate(sup))
    try:
        return float(token)
    except ValueError:
        return None


def in_data(token: str, data: set[str]) -> bool:
    """The token, or the token as a rounding of a value in the data (to its own digits)."""
    plain = token.replace(",", "")
    v = value(plain)
    if v is None or ("." not in plain and abs(v) < 100):
        return False  # a small integer is everywhere; only decimals and big counts
    if plain in data:
        return True
    digits = len(plain.split(".")[1]) if "." in plain else 0
    for d in data:
        try:
            x = float(d)
        except ValueError:
            continue
        if round(x, digits) == v and (("." in d and len(d.split(".")[1]) > digits) or x == v):
            return True
    return False


def candidates(page: Page) -> Iterator[Number]:
    """The measurement-shaped numbers and ratio words in the page's prose."""
    for m in NUMBER.finditer(page.raw):
        if covered(page.spans, m.start(), m.end()):
            continue
        token, tail = m["num"], m["tail"]
        before = page.raw[max(0, m.start() - 40) : m.start()]
        line_start = page.raw.rfind("\n", 0, m.start()) + 1
        if page.raw[line_start : m.start()].lstrip().startswith("#") and not tail.strip():
            continue  # a heading's step number
        if tail and tail[0].isalpha() and not re.fullmatch(r"\s?" + UNITS, tail):
            continue  # 2D, 1F1B, 8B (a model's name), 4th
        if re.fullmatch(r"\d+\.\d+\.\d+.*", token + page.raw[m.end() : m.end() + 4]):
            continue  # 2.14.1: a version
        if VERSION.search(before.rstrip()) and "." in token:
            yield Number(page.name, token, 0, m.start(), m.end(), "version")
            continue
        shaped = (
            bool(tail.strip())
            or "." in token
            or "," in token
            or "e" in token.lower()
            or (token.startswith("10") and len(token) > 2 and not token[2:].isdigit())
        )
        if not shaped:
            continue
        if re.fullmatch(r"\s?[×x]", tail) and re.match(r"\s?[\w(√⌈]", page.raw[m.end() :]):
            tail = ""  # 64 × 2,048: a product, not a ratio
            shaped = "." in token or "," in token or "e" in token.lower()
            if not shaped:
                continue
        yield Number(page.name, token + tail, 0, m.start(), m.start() + len(token) + len(tail))
    for m in RATIO_WORDS.finditer(page.raw):
        if covered(page.spans, m.start(), m.end()):
            continue
        around = page.raw[max(0, m.start() - 12) : m.end() + 12]
        if NOT_RATIO.search(around):
            continue
        yield Number(page.name, m[0], 0, m.start(), m.end())


def raw_to_text(page: Page, offset: int) -> int:
    """The collapsed text's offset of the raw offset (the first at or after it)."""
    lo, hi = 0, len(page.where)
    while lo < hi:
        mid = (lo + hi) // 2
        if page.where[mid] < offset:
            lo = mid + 1
        else:
            hi = mid
    return lo


# --- what the tests read -----------------------------------------------------------

MAX_SENTENCE = 1000  # characters a test's pattern may span on a page to tie its numbers
READERS = {"said", "sentence", "prose_claims", "search", "findall", "fullmatch", "match"}


def literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def test_patterns(tests: Path = TESTS) -> dict[str, list[tuple[str, str]]]:
    """page -> [(pattern, test file)]: every literal pattern that a test file naming the
    page passes to a function that reads text (``said``, ``sentence``, ``re.search``...)."""
    found: dict[str, list[tuple[str, str]]] = {}
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    for path in sorted(tests.rglob("*.py")):
        source = path.read_text()
        named = [p for p in pages if p in source]
        if not named:
            continue
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in READERS:
                continue
            for arg in node.args:
                pattern = literal(arg)
                if pattern and len(pattern) >= 12:
                    for page in named:
                        found.setdefault(page, []).append(
                            (pattern, path.relative_to(ROOT).as_posix())
                        )
    return found


def load_rules() -> dict[str, list[tuple[str, str]]]:
    """page -> [(phrase, rule)] from tests/docs/prose_rules/*.py (one file per part)."""
    rules: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(RULES_DIR.glob("*.py")):
        namespace: dict = {}
        exec(compile(path.read_text(), str(path), "exec"), namespace)
        for page, entries in namespace["PROSE_RULES"].items():
            rules.setdefault(page, []).extend(entries)
    return rules


@dataclass
class Report:
    numbers: list[Number]
    stale_rules: list[tuple[str, str, str]]  # (page, phrase, why)

    @property
    def untied(self) -> list[Number]:
        return [n for n in self.numbers if not n.tie]

    def counts(self) -> dict[str, int]:
        out = {"data": 0, "test": 0, "rule": 0, "version": 0, "untied": 0}
        for n in self.numbers:
            out[n.tie or "untied"] += 1
        return out


def check_page(
    page: Page,
    patterns: list[tuple[str, str]],
    rules: list[tuple[str, str]],
) -> tuple[list[Number], list[tuple[str, str, str]]]:
    numbers = list(candidates(page))
    for n in numbers:
        n.line = page.raw.count("\n", 0, n.start) + 1
        n.start, n.end = raw_to_text(page, n.start), raw_to_text(page, n.end)
    matched: list[tuple[int, int, str]] = []
    for pattern, where in patterns:
        try:
            regex = re.compile(pattern)
        except re.error:
            continue
        for m in regex.finditer(page.text):
            # a sentence or two; a greedy `.*` meant for one log line spans a whole page
            if 12 <= m.end() - m.start() <= MAX_SENTENCE:
                matched.append((m.start(), m.end(), where))
    stale: list[tuple[str, str, str]] = []
    ruled: list[tuple[int, int, str]] = []
    for phrase, rule in rules:
        if rule not in RULES:
            stale.append((page.name, phrase, f"unknown rule {rule!r}; one of {sorted(RULES)}"))
            continue
        hits = [m.start() for m in re.finditer(re.escape(phrase), page.text)]
        if not hits:
            stale.append((page.name, phrase, "the phrase is not on the page"))
        for h in hits:
            ruled.append((h, h + len(phrase), rule))
    used = set()
    for n in numbers:
        if n.tie:
            continue
        token = n.text.split()[0] if n.text[0].isdigit() else ""
        token = re.match(r"[\d,.]+(?:e[-+]?\d+)?", token)
        if token and in_data(token[0].rstrip(".,"), page.data):
            n.tie, n.why = "data", "in an output or generated file of the page"
            continue
        for a, b, where in matched:
            if a <= n.start and n.end <= b:
                n.tie, n.why = "test", where
                break
        if n.tie:
            continue
        for a, b, rule in ruled:
            if a <= n.start and n.end <= b:
                n.tie, n.why = "rule", rule
                used.add((a, b))
                break
    for phrase, rule in rules:
        if rule not in RULES:
            continue
        spans = [(m.start(), m.end()) for m in re.finditer(re.escape(phrase), page.text)]
        if spans and not any(s in used for s in spans):
            stale.append((page.name, phrase, "ties no number the check needs a rule for"))
    return numbers, stale


def pages() -> list[str]:
    return sorted(
        p.relative_to(DOCS).as_posix()
        for p in DOCS.rglob("*.md")
        if "generated" not in p.relative_to(DOCS).parts
    )


def check(names: list[str] | None = None, texts: dict[str, str] | None = None) -> Report:
    """Check the pages (all by default); ``texts`` replaces a page's text (a broken copy)."""
    patterns = test_patterns()
    rules = load_rules()
    numbers: list[Number] = []
    stale: list[tuple[str, str, str]] = []
    for name in names or pages():
        page = Page.read(name, (texts or {}).get(name))
        found, bad = check_page(page, patterns.get(name, []), rules.get(name, []))
        numbers += found
        stale += bad
    for name in rules:
        if not (DOCS / name).exists():
            stale.append((name, "", "no such page"))
    return Report(numbers, stale)


def main(argv: list[str]) -> int:
    show_all = "--all" in argv
    names = [a.removeprefix("docs/") for a in argv if not a.startswith("--")]
    report = check(names or None)
    for n in report.numbers:
        if show_all or not n.tie:
            print(f"docs/{n.page}:{n.line}: {n.text!r} {n.tie or 'UNTIED'} {n.why}")
    for page, phrase, why in report.stale_rules:
        print(f"docs/{page}: rule {phrase!r}: {why}")
    print(report.counts())
    return 1 if report.untied or report.stale_rules else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
