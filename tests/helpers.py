"""Helpers the tests share, imported by name (``from helpers import ROOT``).

A module, not conftest.py: each topic folder of tests/ has its own conftest.py for its
fixtures, and ``from helpers import ...`` would depend on which one Python found first.
"""

import functools
import importlib.util
import inspect
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pytest_codeblocks import extract_from_file

from tinyscale.comm.counter import CollectiveCounter
from tinyscale.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
# A fresh timing against a recorded one must land within a factor of it, either way; the
# factor depends on what is timed, and is the widest ratio seen with a margin. What the
# check catches is a benchmark that no longer runs, runs something else, or a unit slip
# (1000x). Seen (TINYSCALE_TIMING_LOG, make test on the 2-core machine, and the same tests
# beside eight other jobs): a step made of sleeps 0.93x to 0.96x; one training step's
# tokens/s 0.12x to 1.9x (one step of bf16 on a CPU); a kernel or a small message of a
# few microseconds 0.18x to 26x (it waits for process wake-ups on a loaded machine).
TIMING_FACTORS = {"sleep": 2.0, "training": 20.0, "microseconds": 40.0}
# run_on_ranks' bounds, spelled out: every wait bounded, so a hang fails the test
TIMEOUTS = {"timeout_s": 30.0, "deadline_s": 120.0}


def timing_ratio(fresh: float, recorded: float, what: str) -> float:
    """fresh / recorded, also appended to $TINYSCALE_TIMING_LOG when set (to measure the
    spread that TIMING_FACTORS are chosen from)."""
    ratio = fresh / recorded
    log = os.environ.get("TINYSCALE_TIMING_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"what": what, "ratio": ratio}) + "\n")
    return ratio


def assert_timing(fresh: float, recorded: float, kind: str, what: str) -> None:
    """A fresh timing is within TIMING_FACTORS[kind] of the recorded one, either way."""
    ratio = timing_ratio(fresh, recorded, what)
    factor = TIMING_FACTORS[kind]
    assert 1 / factor < ratio < factor, (
        f"{what}: {ratio:.3g}x the recorded time, outside the {factor}x allowed for {kind}"
    )


def load_script(name: str, folder: str = "code/scripts") -> ModuleType:
    """Import code/scripts/<name>.py as a module (code/scripts is not a package)."""
    path = ROOT / folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tinyscale_scripts.{name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_tool(name: str) -> ModuleType:
    """Import tools/<name>.py, the script that writes some of docs/generated/."""
    return load_script(name, folder="tools")


def torn_copy(checkpoints: Path, out: Path, step: int, name: str) -> Path:
    """A copy of a run's ``checkpoints`` folder under ``out``, with step ``step``'s file
    ``name`` cut to its first 100 bytes (a save killed mid-write); returns ``out``."""
    shutil.copytree(checkpoints, out / "checkpoints")
    path = out / "checkpoints" / f"step_{step:06d}" / name
    path.write_bytes(path.read_bytes()[:100])
    return out


def load_bench(name: str) -> ModuleType:
    """Import benchmarks/<name>.py, with benchmarks/ on the path while it imports its
    siblings (timing, bench_zero): the same model and sizes the benchmark measured."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


# Page code that uses the course's SLURM cluster (one per machine, in build/slurm): such
# pages run one after another, in one group (conftest.py).
SLURM_COMMANDS = re.compile(r"\b(sbatch|srun|scontrol|squeue|scancel|sinfo|sacct|make)\b")


PLACE = re.compile(r"(?<![\w/.\-])(?:runs|logs)/[\w.\-]+")  # a path that starts there
FAILURE_DEMO = re.compile(r"\|\|\s*echo\s+\"exit code|\|\s*grep -o \"\w*Error")
SCRIPT = re.compile(r"code/scripts/(\w+)\.py")
# Folders two pages may share, and why that is safe.
SHARED_ON_PURPOSE = {
    # prepare_assets() writes the tokenizer and corpus atomically (every rank calls it);
    # each page trains into a dump folder of its own (runs/torchtitan/out, .../pp).
    "runs/torchtitan",
}


def script_defaults(name: str) -> tuple[str, ...]:
    """Where a training script writes when its command names no --output-dir/--log-dir."""
    script = load_script(name)
    defaults, flags = getattr(script, "DEFAULTS", None), getattr(script, "FLAGS", ())
    return tuple(getattr(defaults, f, "") if f in flags else "" for f in ("output_dir", "log_dir"))


def places(command: str) -> set[str]:
    """The runs/ and logs/ folders one command line uses (first level below them)."""
    if FAILURE_DEMO.search(command):
        return set()  # the course's rule: bad input writes nothing (its tests check it)
    found = {_first_level(match) for match in PLACE.findall(command)}
    for name in SCRIPT.findall(command):
        output_dir, log_dir = script_defaults(name)
        if output_dir and "--output-dir" not in command:
            found.add(_first_level(output_dir))
        if log_dir and "--log-dir" not in command:
            found.add(_first_level(log_dir + "/rank_0"))  # each rank writes <log_dir>/rank_N
    return found


def _first_level(path: str) -> str:
    parts = path.split("/")
    second = "rank_N" if parts[1].startswith("rank_") else parts[1]
    return f"{parts[0]}/{second}"


def runnable_blocks(page: Path) -> list[Any]:
    """The code blocks of a page that `make test` runs: python, sh and bash, without a
    `skip(` mark. A `skipif(` block counts: CI runs as root, where it runs (SLURM)."""
    return [
        block
        for block in extract_from_file(page)
        if block.syntax in ("python", "sh", "bash") and not any("skip(" in m for m in block.marks)
    ]


def recorded_output(page: str, command: str, docs: Path = ROOT / "docs") -> list[str]:
    """The output docs/<page> shows for the block that contains ``command``, line by line.

    Only an output CI compares: the block must run (no skip mark) and be followed by
    ``<!--pytest-codeblocks:expected-output-->``, so pytest-codeblocks checks that the
    lines returned here are what the command prints today. Tests may then check the
    recorded numbers against the formulas.
    """
    blocks = [b for b in extract_from_file(docs / page) if command in b.code]
    if len(blocks) != 1:
        raise LookupError(f"{page}: {len(blocks)} code blocks contain {command!r}, need 1")
    block = blocks[0]
    if any("skip" in mark for mark in block.marks):
        raise LookupError(
            f"{page} line {block.lineno}: skipped in CI, so its output is not checked"
        )
    if block.expected_output is None:
        raise LookupError(f"{page} line {block.lineno}: no expected-output block: nothing compared")
    return [line.strip() for line in block.expected_output.splitlines()]


# What differs between two runs of the same seeded command, and nothing else: the clock.
# A command's expected output on a page is compared with these masked on both sides
# (the root conftest.py); everything else must match exactly.
TIME_MASKS = (
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"), "<timestamp>"),  # logging's asctime
    (re.compile(r"[\d,]+(?:\.\d+)? tokens/s"), "<speed> tokens/s"),
    (re.compile(r" *[\d,]+\.\d+ (s|MB/s|ms per file)\b"), r" <time> \1"),  # a disk's speed
)


def masked(text: str) -> str:
    """``text`` with its timestamps and speeds replaced by placeholders."""
    for pattern, mask in TIME_MASKS:
        text = pattern.sub(mask, text)
    return text


def one_line_error(fn: Any, *args: Any, **kwargs: Any) -> str:
    """The message of the UsageError ``fn(*args, **kwargs)`` raises, checked to be one line."""
    with pytest.raises(UsageError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, f"not one line: {message!r}"
    return message


def usage_error(call: Callable[[], object]) -> str | None:
    """The message of the UsageError ``call()`` raises, or None when it raises none.

    For misuse checked on ranks, where every rank must go on to the next call alike.
    """
    try:
        call()
    except UsageError as err:
        return str(err)
    return None


class CallTimeline(CollectiveCounter):
    """A CollectiveCounter that also writes down when things happen around its calls.

    ``events`` is one list, in the order things happened on this rank: ``("call", i)``
    when ``calls[i]`` is made, ``("wait", i)`` when the work it returned is waited for,
    and whatever the test appends itself (``("grad", name)`` from a gradient hook).
    ``async_op[i]`` is whether ``calls[i]`` was made with ``async_op=True``. Calls made
    through ``batch_isend_irecv`` are counted, not written down.
    """

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, Any]] = []
        self.async_op: list[bool] = []

    def _wrap(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        counted, signature = super()._wrap(op, original), inspect.signature(original)

        @functools.wraps(original)  # __wrapped__ is torch's: dist.P2POp unwraps it
        def timed(*args: Any, **kwargs: Any) -> Any:
            i = len(self.calls)
            work = counted(*args, **kwargs)
            if len(self.calls) == i:  # paused(): not counted, not written down
                return work
            self.events.append(("call", i))
            self.async_op.append(bool(signature.bind(*args, **kwargs).arguments.get("async_op")))
            return work if work is None else _TimedWork(work, i, self.events)

        timed.counted_by_tinyscale = True  # type: ignore[attr-defined]
        return timed


class _TimedWork:
    """A collective's work handle whose ``wait()`` is written into the timeline first."""

    def __init__(self, work: Any, i: int, events: list[tuple[str, Any]]) -> None:
        self._work, self._i, self._events = work, i, events

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._events.append(("wait", self._i))
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def prose(page: str) -> str:
    """docs/<page> with its whitespace collapsed: a sentence reads alike across line breaks."""
    return " ".join((ROOT / "docs" / page).read_text().split())


def said(text: str, pattern: str) -> tuple[str, ...]:
    """The groups of the one place in ``text`` that ``pattern`` matches: what a page says.

    Fails when the sentence is gone or said twice: then the test no longer knows what the
    page claims, and must be updated with the page.
    """
    found = re.findall(pattern, text)
    assert len(found) == 1, f"{len(found)} matches of {pattern!r}: the sentence moved"
    return found[0] if isinstance(found[0], tuple) else (found[0],)


def fails_when_changed(check: Any, text: str, old: str, new: str) -> None:
    """``check(text)`` passes, and fails once ``old`` is replaced by ``new``: it can fail."""
    assert text.count(old) == 1, f"{old!r} is not said once"
    check(text)
    with pytest.raises(AssertionError):
        check(text.replace(old, new))
