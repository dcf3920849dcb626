"""Pages that run side by side share no folder and no port (conftest.py's grouping).

`make test` runs pages on three workers at once. conftest.py keeps only the SLURM pages
together; every other page may run beside any other, which is safe only while no two of
them write the same folder under runs/ or logs/, or listen on the same fixed port.
torchrun's default port is not one of them: each worker sets PET_MASTER_PORT. This test
reads every block that runs and fails on a folder or a port two pages use, naming both.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from helpers import FAILURE_DEMO, ROOT, SHARED_ON_PURPOSE, SLURM_COMMANDS, places, runnable_blocks

# A port a command listens on or connects to. Lines that end in `|| echo "exit code $?"`
# or keep only an error (`| grep -o "...Error`) are failure demos: they stop on their
# input, or at the rendezvous, before they listen or write a file.
PORT = re.compile(
    r"--master[-_]port[ =](\d+)|MASTER_PORT=(\d+)|rdzv[-_]endpoint[ =][\w.]+:(\d+)"
    r"|bind\(\(['\"][\d.]+['\"],\s*(\d+)\)\)"
)
DEEPSPEED_LAUNCHER = re.compile(r"(?:^|[;&|]\s*)deepspeed\s")  # listens on 29500 by default


def ports(command: str) -> set[int]:
    if FAILURE_DEMO.search(command):
        return set()
    found = {int(n) for match in PORT.findall(command) for n in match if n}
    if DEEPSPEED_LAUNCHER.search(command) and "--master_port" not in command:
        found.add(29500)
    return found - {0}  # 0: the OS picks a free port


def uses() -> tuple[dict[str, set[str]], dict[int, set[str]]]:
    """Folder -> pages and port -> pages, over every page outside the SLURM group."""
    by_place: dict[str, set[str]] = defaultdict(set)
    by_port: dict[int, set[str]] = defaultdict(set)
    for page in sorted((ROOT / "docs").rglob("*.md")):
        code = "".join(block.code for block in runnable_blocks(page))
        if SLURM_COMMANDS.search(code):
            continue  # the SLURM group runs its pages one after another
        name = page.relative_to(ROOT).as_posix()
        for line in code.replace("\\\n", " ").splitlines():
            for place in places(line):
                by_place[place].add(name)
            for port in ports(line):
                by_port[port].add(name)
    return by_place, by_port


def test_no_two_pages_write_the_same_folder() -> None:
    by_place, _ = uses()
    assert by_place["runs/lab2"] == {"docs/workshop/lab-2.md"}  # the reading works
    assert by_place["logs/rank_N"] == {"docs/workshop/lab-2.md"}  # and the defaults
    clashes = {
        place: sorted(pages)
        for place, pages in by_place.items()
        if len(pages) > 1 and place not in SHARED_ON_PURPOSE
    }
    assert not clashes, f"pages that may run at once write the same folders: {clashes}"


def test_no_two_pages_listen_on_the_same_port() -> None:
    _, by_port = uses()
    assert by_port[29562] == {"docs/workshop/lab-3.md"}
    clashes = {port: sorted(pages) for port, pages in by_port.items() if len(pages) > 1}
    assert not clashes, f"pages that may run at once use the same ports: {clashes}"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("torchrun --nproc_per_node=2 code/scripts/ddp_simulation_train.py", {"runs/ddp", "logs/rank_N"}),
        ("python code/scripts/deepspeed_train.py --output-dir runs/x/y --log-dir logs/z", {"runs/x", "logs/z"}),
    ],
)  # fmt: skip
def test_places_include_a_scripts_defaults(line: str, expected: set[str]) -> None:
    assert places(line) == expected


def test_ports_count_listeners_not_failure_demos() -> None:
    assert ports("deepspeed --num_gpus 2 code/scripts/deepspeed_train.py") == {29500}
    assert ports("torchrun --rdzv-endpoint=localhost:29400 x.py") == {29400}
    assert ports('MASTER_PORT=29500 python x.py 2>&1 || echo "exit code $?"') == set()
    assert ports("accelerate launch --main_process_port 0 x.py") == set()
    assert (
        places('torchrun x.py --output-dir runs/a 2>&1 | grep -o "DistNetworkError: .*"') == set()
    )
