"""Every file under docs/generated/ has a writer in tools/ and a reader in tests/.

A recorded output is only as good as the two ends that hold it: a script that wrote it
from a real run (`make figures` runs tools/make_figures.py and every tools/figures_*.py),
and a test that checks it against the code today. The rule, read from the sources:

- writer: a script in tools/ names the file's folder and the file's name;
- reader: a test file under tests/ names them too; a plot (``.png``) is read through the
  data it is drawn from, a file of the same folder and stem (``loss_curve.png`` ←
  ``loss_curve.json``) or the one that ``PLOTTED_FROM`` names.
"""

from __future__ import annotations

from pathlib import Path

from helpers import ROOT

GENERATED = ROOT / "docs" / "generated"
PLOTTED_FROM = {  # plots whose data file has another stem
    "lab1/loss_curve.png": "lab1/metrics.jsonl",
    "week1/ddp_bucket_sweep.png": "week1/ddp_bench.json",
}
HERE = Path(__file__).resolve()
# Folders of one record per page (`make gpu-check`): the writer and the reader name the
# folder and the pattern of the names (tools/gpu_check.py, tests/docs/test_gpu_blocks.py).
PER_PAGE = {"gpu": "<part>__<page-stem>.json"}


def names(source: str, relative: str) -> bool:
    """Does this source name the generated file: its folder and its name, as strings?"""
    folder, name = relative.rsplit("/", 1)
    if folder in PER_PAGE and name.endswith(".json"):
        name = PER_PAGE[folder]
    quoted = (f'"{relative}', f'"{folder}"', f"/{folder}/", f'"{folder}/')
    return any(q in source for q in quoted) and (f'"{name}"' in source or f"/{name}" in source)


def problems(generated: Path, tools: list[str], tests: list[str]) -> list[str]:
    found = []
    files = sorted(p.relative_to(generated).as_posix() for p in generated.rglob("*") if p.is_file())
    for rel in files:
        if not any(names(src, rel) for src in tools):
            found.append(f"{rel}: no script in tools/ writes it")
        data = [rel]
        if rel.endswith(".png"):
            stem = rel.removesuffix(".png")
            data = [PLOTTED_FROM.get(rel, "")] + [f"{stem}{ext}" for ext in (".json", ".jsonl")]
            data = [d for d in data if d and (generated / d).is_file()]
            if not data:
                found.append(f"{rel}: a plot with no data file beside it (write {stem}.json)")
                continue
        if not any(names(src, d) for d in data for src in tests):
            found.append(f"{rel}: no test reads {data[0]}")
    return found


def sources(folder: Path, pattern: str) -> list[str]:
    return [p.read_text("utf-8") for p in sorted(folder.rglob(pattern)) if p.resolve() != HERE]


def test_every_generated_file_has_a_writer_and_a_reader() -> None:
    tools = sources(ROOT / "tools", "*.py")
    tests = sources(ROOT / "tests", "*.py")
    found = problems(GENERATED, tools, tests)
    assert not found, "\n".join(found)


def test_self_check_finds_an_unwritten_file_an_unread_file_and_a_bare_plot(
    tmp_path: Path,
) -> None:
    for rel in (
        "lab9/train.txt",
        "lab9/notes.txt",
        "lab9/curve.png",
        "lab9/ok.png",
        "lab9/ok.json",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    tools = ['OUT / "lab9" / "train.txt"; OUT / "lab9" / "curve.png"; ', 'D / "lab9" / "ok.png"']
    tools.append('(OUT / "lab9" / "ok.json").write_text(data)')
    tests = ['GENERATED / "lab9" / "train.txt"', 'read("docs/generated/lab9/ok.json")']
    assert problems(tmp_path, tools, tests) == [
        "lab9/curve.png: a plot with no data file beside it (write lab9/curve.json)",
        "lab9/notes.txt: no script in tools/ writes it",
        "lab9/notes.txt: no test reads lab9/notes.txt",
    ]


def test_self_check_a_record_per_page_is_named_by_its_pattern(tmp_path: Path) -> None:
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "week-1__collectives.json").write_text("{}")
    both = ['RECORDS = GENERATED / "gpu"  # gpu/<part>__<page-stem>.json']
    assert problems(tmp_path, both, both) == []
    assert problems(tmp_path, ['OUT / "gpu"'], both) == [
        "gpu/week-1__collectives.json: no script in tools/ writes it"
    ]
