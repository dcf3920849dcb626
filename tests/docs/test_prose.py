"""Numbers in the pages' sentences are the numbers of the recordings they describe.

Each test reads one sentence from a page, takes its numbers, and computes them again from
the generated file the sentence is about, rounded as the page rounds. A recording that
is regenerated with different numbers fails here until the sentence is rewritten.
"""

from __future__ import annotations

import json
import re

import pytest

from helpers import ROOT, recorded_output

DOCS = ROOT / "docs"
GENERATED = DOCS / "generated"


def sentence(page: str, pattern: str) -> re.Match[str]:
    text = " ".join((DOCS / page).read_text().split())  # one line: sentences wrap
    found = re.search(pattern, text)
    assert found, f"{page}: no sentence matches {pattern!r}: was it rewritten?"
    return found


def test_lab1_layers_answer() -> None:
    m = sentence(
        "workshop/lab-1.md",
        r"trained at (?P<ratio>\d+(?:\.\d+)?)× the tokens/s of the default: each of its steps cost "
        r"about (?P<cost>\d+(?:\.\d+)?) times as much\. When the 2-layer run finished "
        r"\((?P<secs>\d+(?:\.\d+)?) s on a 2-core CPU\), the 4-layer run was only near step "
        r"(?P<step>\d+), between its evaluations at step (?P<lo>\d+) \(held-out loss "
        r"(?P<loss_lo>\d+(?:\.\d+)?)\) and step (?P<hi>\d+) \((?P<loss_hi>\d+(?:\.\d+)?)\): about "
        r"level with the 2-layer model's final (?P<final2>\d+(?:\.\d+)?), not ahead of it",
    )
    table = (GENERATED / "lab1" / "layers_2_vs_4.md").read_text()
    rows = {r[0]: r for r in re.findall(r"^\| (\d) \| [\d,]+ \| \d+(?:\.\d+)? \| (\d+(?:\.\d+)?) \| ([\d,]+) \| (\d+(?:\.\d+)?) s \|$", table, re.M)}  # fmt: skip
    two, four = rows["2"], rows["4"]
    speed2, speed4 = (float(r[2].replace(",", "")) for r in (two, four))
    assert float(m["ratio"]) == round(speed4 / speed2, 2)
    assert float(m["cost"]) == round(speed2 / speed4, 1)
    assert float(m["secs"]) == float(two[3])
    assert float(m["final2"]) == round(float(two[1]), 2)
    heldout = json.loads((GENERATED / "lab1" / "layers_2_vs_4.json").read_text())["4"]["heldout"]
    reached = 414 * float(two[3]) / float(four[3])  # the 4-layer step at the 2-layer's end
    assert int(m["step"]) == round(reached)
    before = max((r for r in heldout if r["step"] <= reached), key=lambda r: r["step"])
    after = min((r for r in heldout if r["step"] > reached), key=lambda r: r["step"])
    assert (int(m["lo"]), int(m["hi"])) == (before["step"], after["step"])
    assert float(m["loss_lo"]) == round(before["loss"], 2)
    assert float(m["loss_hi"]) == round(after["loss"], 2)
    # "about level, not ahead": where the 4-layer curve crosses the 2-layer's final loss,
    # it is within a hundredth of it at the step it reached
    at = before["loss"] + (after["loss"] - before["loss"]) * (reached - before["step"]) / (
        after["step"] - before["step"]
    )
    assert 0 <= at - float(two[1]) < 0.01, f"4 layers at step {reached:.0f}: {at:.3f}"
    ends = sentence(
        "workshop/lab-1.md", r"ends lower \((?P<a>\d+(?:\.\d+)?) against (?P<b>\d+(?:\.\d+)?)\)"
    )
    assert (float(ends["a"]), float(ends["b"])) == (
        round(float(four[1]), 2),
        round(float(two[1]), 2),
    )


def test_lab3_scaling_sentence() -> None:
    m = sentence(
        "workshop/lab-3.md",
        r"barely beat one \((?P<two>\d+(?:\.\d+)?)× in this recording\), four are slower than one "
        r"\((?P<four>\d+(?:\.\d+)?)×\).*?Lab 2's quieter run of 2 processes reached (?P<lab2>\d+(?:\.\d+)?)×",
    )
    scaling = (GENERATED / "lab3" / "scaling.md").read_text()
    ratios = dict(re.findall(r"^\| (\d) \|.*\| (\d+(?:\.\d+)?)x \|$", scaling, re.M))
    assert (m["two"], m["four"]) == (ratios["2"], ratios["4"])
    runs = json.loads((GENERATED / "lab2" / "world_sizes.json").read_text())["runs"]
    speedup = runs["2"]["tokens_per_second"] / runs["1"]["tokens_per_second"]
    assert float(m["lab2"]) == round(speedup, 1)


def test_zero_peak_sentence() -> None:
    m = sentence(
        "week-2/zero-from-scratch.md",
        r"N = 4 that is (?P<zero3>\d+(?:\.\d+)?) MiB against (?P<ddp>\d+(?:\.\d+)?) MiB for DDP",
    )
    rows = json.loads((GENERATED / "week2" / "zero_memory.json").read_text())["rows"]
    peak = {(r["world"], r["stage"]): r["peak"] for r in rows}
    # in the figure's unit: its axis is "model-state MiB per rank"
    assert float(m["zero3"]) == round(peak[4, 3] / 2**20, 2)
    assert float(m["ddp"]) == round(peak[4, 0] / 2**20, 2)


def test_session_b_fused_sentence() -> None:
    m = sentence(
        "workshop/session-b.md",
        r"the fused GELU is (?P<gelu>\d+(?:\.\d+)?)× faster than GELU by hand and the fused AdamW "
        r"(?P<adamw>\d+(?:\.\d+)?)× faster than the loop",
    )
    table = (GENERATED / "session_b" / "fused_kernels.txt").read_text()
    speedups = dict(re.findall(r"^(.+?)\s+[\d,]+\s+(\d+(?:\.\d+)?)x$", table, re.M))
    assert m["gelu"] == speedups["F.gelu (1 fused kernel)"]
    assert m["adamw"] == speedups["AdamW fused=True (one kernel)"]


def test_guide_lab1_time() -> None:
    m = sentence(
        "start/guide.md", r"\((?P<secs>\d+(?:\.\d+)?) s in the run the Lab 1 page records\)"
    )
    done = re.search(r"^done: \d+ steps in (\d+(?:\.\d+)?) s", (GENERATED / "lab1" / "train.txt").read_text(), re.M)  # fmt: skip
    assert done and m["secs"] == done[1]


def test_a_changed_number_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Self-check: the same test on a page whose number was edited fails."""
    guide = DOCS / "start" / "guide.md"
    said = sentence("start/guide.md", r"\((?P<secs>\d+(?:\.\d+)?) s in the run")["secs"]
    page = guide.read_text().replace(f"({said} s in", "(45 s in")
    assert page != guide.read_text()
    read = type(guide).read_text
    monkeypatch.setattr(
        type(guide), "read_text", lambda self, *a, **k: page if self == guide else read(self)
    )
    with pytest.raises(AssertionError, match=rf"'45' == '{re.escape(said)}'"):
        test_guide_lab1_time()


def test_storage_small_files_sentence() -> None:
    m = sentence(
        "operations/storage.md",
        r"dozens of times slower\*\* as small files \((?P<small>\d+\.\d+) s against "
        r"(?P<big>\d+\.\d+) s above\)",
    )
    shown = "\n".join(recorded_output("operations/storage.md", "cat runs/storage.txt"))
    times = re.findall(r"file\(s\) of +\d+ KiB: +(\d+\.\d+) s", shown)
    assert times == [m["big"], m["small"]]
    assert 12 <= float(m["small"]) / float(m["big"]) < 100  # "dozens of times"
