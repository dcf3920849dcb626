"""The GitHub workflows are valid and say what they do (they cannot run on this machine).

check-jsonschema validates them against GitHub's workflow schema, which it ships (no
network). Then what a reader relies on: four jobs side by side (none waits for another),
the SLURM job really runs as root, every path and make target they name exists, and the
torch they install is the Makefile's.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
CHECK = Path(sys.executable).parent / "check-jsonschema"


def validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    cmd = [str(CHECK), "--builtin-schema", "vendor.github-workflows", *map(str, paths)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def test_every_workflow_matches_githubs_schema() -> None:
    assert [p.name for p in WORKFLOWS] == ["ci.yml", "macos.yml", "pages.yml"]
    done = validate(*WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_validator_fails_on_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("name: x\non: push\njobs:\n  a:\n    steps:\n      - run: echo\n")
    done = validate(broken)  # no runs-on
    assert done.returncode != 0 and "runs-on" in done.stdout + done.stderr


def test_ci_runs_four_jobs_side_by_side() -> None:
    jobs = load("ci.yml")["jobs"]
    assert set(jobs) == {"lint-build-unit", "pages", "slurm", "browser"}
    assert not any("needs" in job for job in jobs.values()), "the jobs run in parallel"
    runs = {name: " ".join(s.get("run", "") for s in job["steps"]) for name, job in jobs.items()}
    assert "make lint" in runs["lint-build-unit"] and "make build" in runs["lint-build-unit"]
    assert "--codeblocks" in runs["pages"] and " docs" in runs["pages"]
    assert "-m browser" in runs["browser"]


def test_the_slurm_job_runs_as_root() -> None:
    """The SLURM blocks and tests skip unless root: the job installs and runs under sudo."""
    steps = load("ci.yml")["jobs"]["slurm"]["steps"]
    runs = [s.get("run", "") for s in steps]
    assert any(r.startswith("sudo bash tools/install_system_packages.sh") for r in runs)
    test_step = next(r for r in runs if "pytest" in r)
    assert test_step.startswith("sudo -E") and "tests/cluster" in test_step
    assert "docs/workshop/session-c.md" in test_step


@pytest.mark.parametrize("name", ["ci.yml", "macos.yml", "pages.yml"])
def test_what_the_workflows_name_exists(name: str) -> None:
    text = (ROOT / ".github" / "workflows" / name).read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"\bmake ([a-z-]+)", text):
        assert re.search(rf"^{target}:", makefile, re.M), f"make {target}: no such target"
    for path in re.findall(r"\b((?:tests|docs|tools|code)/[\w./-]+)", text):
        assert (ROOT / path).exists(), f"{name} names {path}, which does not exist"


def test_torch_comes_from_the_makefile() -> None:
    """The workflows pin no torch of their own: make setup installs the Makefile's."""
    for path in WORKFLOWS:
        assert "torch==" not in path.read_text(), path.name
    assert re.search(r"^TORCH_VERSION \?= 2\.14\.1$", (ROOT / "Makefile").read_text(), re.M)
