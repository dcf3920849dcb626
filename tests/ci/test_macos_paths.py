"""The code paths a Mac takes, run here on Linux: ranks started by spawn, and a setup that
has nothing to install.

On macOS, run_on_ranks starts each rank as a fresh interpreter (multiprocessing's spawn),
where Linux forks it from a fork server; tools/install_system_packages.sh installs nothing
and says why. Both run in the macOS job too (.github/workflows/macos.yml); these tests keep
them working between its runs.
"""

from __future__ import annotations

import os
import subprocess
import types
from pathlib import Path

import pytest

from helpers import ROOT
from tinyscale.comm import launch

SCRIPT = ROOT / "tools" / "install_system_packages.sh"


@pytest.fixture
def on_macos(monkeypatch: pytest.MonkeyPatch) -> None:
    """launch.py as it runs on macOS: it reads sys.platform to pick how ranks start."""
    monkeypatch.setattr(launch, "sys", types.SimpleNamespace(platform="darwin"))


def test_macos_starts_ranks_with_spawn(on_macos: None) -> None:
    assert launch.process_context().get_start_method() == "spawn"


def test_spawned_ranks_join_and_return_by_rank(on_macos: None) -> None:
    lines = launch.run_on_ranks(launch.whoami, 2)
    assert lines == [f"rank {r} of 2 on gloo: sum of ranks = 1" for r in range(2)]


def fake_commands(folder: Path, **outputs: str) -> dict[str, str]:
    """An environment whose PATH finds these commands first; each prints its text and
    notes that it ran."""
    folder.mkdir()
    for name, text in outputs.items():
        command = folder / name
        command.write_text(f"#!/bin/sh\necho ran >> {folder / (name + '.ran')}\necho {text}\n")
        command.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def test_system_packages_on_macos_install_nothing_and_say_why(tmp_path: Path) -> None:
    env = fake_commands(tmp_path / "bin", uname="Darwin", **{"apt-get": "", "id": "0"})
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "macOS, nothing to install" in done.stderr and "Linux only" in done.stderr
    assert not (tmp_path / "bin" / "apt-get.ran").exists(), "no apt-get, even as root"


def test_system_packages_on_linux_take_the_linux_path(tmp_path: Path) -> None:
    """Not root here (a fake `id`): it may only report what is missing, never install."""
    env = fake_commands(tmp_path / "bin", uname="Linux", **{"apt-get": "", "id": "1000"})
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "macOS" not in done.stdout + done.stderr
    assert not (tmp_path / "bin" / "apt-get.ran").exists()
