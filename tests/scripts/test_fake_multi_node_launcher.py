"""Lab 3, code/scripts/fake_multi_node_launcher.py: simulated nodes, real torchrun agents.

Each run is the launcher (or two bash shells) as a subprocess with a timeout, on a free
port, OMP_NUM_THREADS=1, a few training steps:

- a node whose rank crashes: the launcher stops the other node, exits 1, names the error,
  and leaves no process of the job behind.
- the launcher's own --timeout: every agent and worker stopped, nothing left behind.
- bad input: one `error:` line, exit code 2, nothing started or written (in-process).

Lab 3's page runs the 2 x 2 job (its printed table of every rank's variables, and each
rank's log) and the node that never comes (node 0's agent times out at the rendezvous),
and compares what they print: those runs are not repeated here.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, load_script
from tinyscale.core.errors import run_cli

LAUNCHER = "code/scripts/fake_multi_node_launcher.py"
PAGE = ROOT / "docs" / "workshop" / "lab-3.md"
LAB3 = ROOT / "docs" / "generated" / "lab3"
# The page's two terminals: the same torchrun line, each after its own export.
PAGE_PORT = "29562"
EXPORT = "export NODE_RANK={k} MASTER_ADDR=127.0.0.1 MASTER_PORT=" + PAGE_PORT
TORCHRUN = (
    "torchrun --nnodes 2 --node-rank $NODE_RANK --nproc-per-node 1 --master-addr $MASTER_ADDR "
    "--master-port $MASTER_PORT code/scripts/ddp_simulation_train.py --max-steps 3 "
    "--output-dir runs/lab3/by-hand --log-dir runs/lab3/by-hand/logs"
)
# Startup of 2-4 torchrun agents and their workers on 2 shared cores, plus a few steps.
RUN_TIMEOUT_S = 180


def launch(tmp: Path, *args: str, script_args: tuple[str, ...] = ("--max-steps", "3")):
    cmd = [
        sys.executable, LAUNCHER, *args, "--log-dir", str(tmp / "nodes"), "--",
        *script_args, "--output-dir", str(tmp / "run"), "--log-dir", str(tmp / "run" / "logs"),
    ]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    return done, time.monotonic() - t0


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (a test's unique tmp path)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in args and str(os.getpid()) != cmdline.parent.name:
            found.append(args)
    return found


def test_the_page_shows_the_two_terminals_word_for_word() -> None:
    """The page's block that runs both terminals at once is executed by pytest-codeblocks;
    this checks that it types exactly the lines a reader types in each terminal."""
    page = PAGE.read_text()
    for k in (0, 1):
        assert EXPORT.format(k=k) in page, "the page shows this export"
    assert page.count(TORCHRUN) >= 2, "and this torchrun line, in both terminals"


def test_a_crashing_node_stops_the_others_and_is_named(tmp_path: Path) -> None:
    done, seconds = launch(
        tmp_path, "--nnodes", "2",
        script_args=("--max-steps", "20", "--fail-rank", "1", "--fail-step", "2"),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "node 1: exit code 1: [rank1]: RuntimeError: injected failure on rank 1 at step 2"
        in done.stdout
    )
    # node 0 is stopped by the launcher, unless its own worker noticed the dead peer first
    assert re.search(r"^node 0: (stopped \(another node failed\)|exit code 1)", done.stdout, re.M)
    assert seconds < RUN_TIMEOUT_S - 30
    assert not processes_mentioning(str(tmp_path)), "no agent or worker left behind"


def test_the_launchers_timeout_stops_every_agent_and_worker(tmp_path: Path) -> None:
    done, seconds = launch(
        tmp_path, "--nnodes", "2", "--timeout", "20", script_args=("--epochs", "100")
    )
    assert done.returncode == 1
    assert "node 0: stopped (--timeout 20 s)" in done.stdout
    assert "node 1: stopped (--timeout 20 s)" in done.stdout
    assert "GROUP_RANK" in done.stdout, "the workers had started: we stopped running workers"
    assert 20 <= seconds < 60
    assert not processes_mentioning(str(tmp_path)), "no agent or worker left behind"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--nnodes", "2", "--node-rank", "2"], "NODE_RANK 2 does not fit NNODES 2: node ranks are 0..1, counted from 0 (the first node is 0)"),
        (["--nnodes", "2", "--node-rank", "-1"], "NODE_RANK -1 does not fit NNODES 2: node ranks are 0..1, counted from 0 (the first node is 0)"),
        (["--nnodes", "0"], "--nnodes 0 --nproc-per-node 1: both must be at least 1"),
        (["--nnodes", "2", "--node-rank", "1"], "--node-rank > 0 joins node 0's rendezvous: give its --master-port"),
        (["--timeout", "0"], "--timeout must be positive"),
        (["--script", "nope.py"], "--script nope.py not found: run from the repository root"),
        (["--script", "code/scripts"], "--script code/scripts is a folder: pass a Python file, e.g. code/scripts/ddp_simulation_train.py"),
        (["--master-addr", "192.0.2.1", "--master-port", "29500"], "cannot listen on MASTER_ADDR:MASTER_PORT 192.0.2.1:29500: not an address of ours; node 0 hosts the rendezvous, so use one of its addresses and a free port"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_code_2(
    args: list[str], error: str, tmp_path: Path, capsys
) -> None:
    launcher = load_script("fake_multi_node_launcher")
    assert run_cli(launcher.main, [*args, "--log-dir", str(tmp_path / "nodes")]) == 2
    assert capsys.readouterr().err == f"error: {error}\n"
    assert not (tmp_path / "nodes").exists(), "nothing written"


@pytest.mark.parametrize(
    ("log_dir", "error"),
    [
        ("a-file", "--log-dir T/a-file cannot be created or written (T/a-file is not a folder this process may write to): pass another --log-dir"),
        ("a-file/nodes", "--log-dir T/a-file/nodes cannot be created or written (T/a-file is not a folder this process may write to): pass another --log-dir"),
        ("nodes", "--log-dir T/nodes: T/nodes/node_1.log is a folder, where the run writes a file: remove it or pass another --log-dir"),
    ],
)  # fmt: skip
def test_a_blocked_log_dir_is_one_line_before_any_agent_starts(
    log_dir: str, error: str, tmp_path: Path, capsys
) -> None:
    """A file where --log-dir goes, or above it, or a folder where a node's log goes."""
    (tmp_path / "a-file").write_text("")
    (tmp_path / "nodes" / "node_1.log").mkdir(parents=True)
    before = sorted(tmp_path.rglob("*"))
    launcher = load_script("fake_multi_node_launcher")
    assert run_cli(launcher.main, ["--log-dir", str(tmp_path / log_dir)]) == 2
    assert capsys.readouterr().err == f"error: {error.replace('T/', f'{tmp_path}/')}\n"
    assert sorted(tmp_path.rglob("*")) == before, "nothing written"


def test_a_port_in_use_is_refused_before_any_agent_starts(tmp_path: Path, capsys) -> None:
    launcher = load_script("fake_multi_node_launcher")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = run_cli(launcher.main, ["--master-port", str(port), "--log-dir", str(tmp_path)])
    assert code == 2
    assert capsys.readouterr().err == (
        f"error: cannot listen on MASTER_ADDR:MASTER_PORT 127.0.0.1:{port}: in use; node 0 hosts "
        "the rendezvous, so use one of its addresses and a free port\n"
    )


def test_an_unreachable_master_addr_is_an_error_in_bounded_time(tmp_path: Path, capsys) -> None:
    """Node 1 joining a rendezvous at TEST-NET-1 (192.0.2.1): nobody ever answers there."""
    launcher = load_script("fake_multi_node_launcher")
    args = ["--node-rank", "1", "--master-addr", "192.0.2.1", "--master-port", "29500"]
    t0 = time.monotonic()
    code = run_cli(launcher.main, [*args, "--rdzv-timeout", "3", "--log-dir", str(tmp_path / "n")])
    assert code == 2 and time.monotonic() - t0 < 30
    assert capsys.readouterr().err == (
        "error: nobody answers at MASTER_ADDR:MASTER_PORT 192.0.2.1:29500 after 3 s: "
        "start node 0 first, and set MASTER_ADDR to its address\n"
    )
    assert not (tmp_path / "n").exists()


# --- the recorded outputs of tools/figures_lab3.py scaling / missing ------------------------
def test_recorded_scaling_table_is_that_of_its_runs() -> None:
    data = json.loads((LAB3 / "scaling.json").read_text())
    rows = (LAB3 / "scaling.md").read_text().splitlines()[2:]
    base = data["runs"]["1"]["tokens_per_second"]
    assert [int(r.split("|")[1]) for r in rows] == [1, 2, 4]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        run = data["runs"][cells[0]]
        assert int(cells[1]) == run["world_size"] == int(cells[0])  # one process per node
        assert run["global_batch_size"] == 32 and run["steps"] == data["steps"]
        assert float(cells[4].replace(",", "")) == round(run["tokens_per_second"])
        assert cells[5] == f"{run['tokens_per_second'] / base:.2f}x"
    merged = (LAB3 / "log_merge.txt").read_text()
    assert "| 0 | ok |" in merged and "| 1 | ok |" in merged


def test_recorded_missing_node_is_the_rendezvous_timeout() -> None:
    text = (LAB3 / "node_missing.txt").read_text()
    assert "node 0: exit code 1: torch.distributed.DistStoreError: Timed out after" in text
    assert "1/2 clients joined." in text and "/work/" not in text


def test_node_rank_and_nnodes_from_the_environment_are_checked_too(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a scheduler would export them: NNODES=2 NODE_RANK=2 is one node too many."""
    launcher = load_script("fake_multi_node_launcher")
    monkeypatch.setenv("NNODES", "2")
    monkeypatch.setenv("NODE_RANK", "2")
    assert run_cli(launcher.main, ["--log-dir", str(tmp_path / "n")]) == 2
    assert capsys.readouterr().err.startswith("error: NODE_RANK 2 does not fit NNODES 2:")
    monkeypatch.setenv("NODE_RANK", "one")
    assert run_cli(launcher.main, ["--log-dir", str(tmp_path / "n")]) == 2
    assert (
        capsys.readouterr().err
        == "error: NODE_RANK='one' is not a whole number: export NODE_RANK=0, 1, ...\n"
    )
