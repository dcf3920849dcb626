"""The macOS job runs the Mac page's commands, word for word (it cannot run on this machine).

.github/workflows/macos.yml sets the course up on GitHub's Apple-silicon runner and runs
the commands docs/start/mac.md shows: Labs 1-3 on the CPU, and Lab 1 on MPS only where
the runner can use MPS. These tests read both files: the job must be valid, run on an
Apple-silicon runner, run every lab command the page shows and no other, guard its MPS run,
and leave out the pages' recorded outputs (their digits are x86's).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from pytest_codeblocks import extract_from_file

from helpers import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "macos.yml"
PAGE = ROOT / "docs" / "start" / "mac.md"
CHECK = Path(sys.executable).parent / "check-jsonschema"
LABS = {  # the script each lab runs, as the page and the job name it
    "Lab 1": "code/scripts/train_tiny_transformer.py",
    "Lab 2": "code/scripts/ddp_simulation_train.py",
    "Lab 3": "code/scripts/fake_multi_node_launcher.py",
}
MAC_ONLY = "needs an Apple-silicon Mac"  # the page's skip reason (tests/docs/test_skips.py)


def job() -> dict:
    (only,) = yaml.safe_load(WORKFLOW.read_text())["jobs"].values()
    return only


def steps() -> list[dict]:
    return job()["steps"]


def run_lines() -> list[str]:
    """Every line of every `run:` of the job, stripped."""
    return [line.strip() for step in steps() for line in step.get("run", "").splitlines()]


def lab_commands(lines: list[str]) -> set[str]:
    """The lines that run one of the labs' scripts."""
    return {line for line in lines if any(script in line for script in LABS.values())}


def page_blocks() -> list:
    """Every bash block of the page, the skipped (Mac-only) ones too."""
    return [b for b in extract_from_file(PAGE) if b.syntax == "bash"]


def page_lines() -> list[str]:
    return [line.strip() for block in page_blocks() for line in block.code.splitlines()]


def test_the_workflow_matches_githubs_schema() -> None:
    done = subprocess.run(
        [str(CHECK), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_it_runs_on_an_apple_silicon_runner() -> None:
    runner = job()["runs-on"]
    m = re.fullmatch(r"macos-(\d+)", runner)
    assert m, f"runs-on {runner!r}: name a macOS runner, e.g. macos-14"
    assert int(m[1]) >= 14, "macos-13 and older are Intel Macs; macos-14 is Apple silicon"


def test_it_sets_up_as_a_learner_does() -> None:
    """Python 3.11 and `make setup`, with PyPI's torch (no CPU-only index, no pinned torch)."""
    (python,) = [s for s in steps() if s.get("uses", "").startswith("actions/setup-python@")]
    assert str(python["with"]["python-version"]).startswith("3.11")
    assert "make setup" in run_lines()
    runs = " ".join(run_lines())
    assert "apt-get" not in runs and "brew " not in runs and "torch==" not in runs
    for scope in (yaml.safe_load(WORKFLOW.read_text()), job(), *steps()):
        assert "TORCH_PIP_ARGS" not in scope.get("env", {})


def test_it_runs_each_lab_and_exactly_the_pages_commands() -> None:
    """No copy drift: the lab commands of the job are those of the page, and all of them."""
    page, ran = lab_commands(page_lines()), lab_commands(run_lines())
    for lab, script in LABS.items():
        assert any(script in line for line in ran), f"the job runs no {lab} ({script})"
    assert ran == page, (
        f"only on the page: {sorted(page - ran)}\nonly in the job: {sorted(ran - page)}"
    )
    assert any(line.startswith("torchrun --nproc_per_node=2 ") for line in ran)


def test_the_mps_run_is_guarded_and_its_skip_says_why() -> None:
    (step,) = [s for s in steps() if "--device mps --output-dir" in s.get("run", "")]
    script = step["run"]
    ask = script.index("torch.backends.mps.is_available()")
    run = script.index("--device mps --output-dir")
    assert ask < run, "ask whether MPS is available before the MPS run"
    assert re.search(r"^\s*if \[ \"\$available\" != True \]", script, re.M)
    assert 'echo "skipped Lab 1 on MPS: $reason"' in script
    # bash accepts the script as written (an if/elif/else that GitHub runs with bash -e)
    done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_page_shows_the_mps_command_as_a_skipped_mac_tab() -> None:
    text = PAGE.read_text()
    mps = [b for b in page_blocks() if "--device mps --output-dir" in b.code]
    assert len(mps) == 1
    assert any(f'reason="{MAC_ONLY}"' in mark for mark in mps[0].marks)
    tab = text[: text.index(mps[0].code.splitlines()[0])].rsplit("=== ", 1)[1]
    assert tab.startswith('"Mac (MPS)"'), "the MPS command sits in a Mac (MPS) tab"
    twin = mps[0].code.replace("--device mps", "--device cpu").replace("lab1-mps", "lab1-cpu")
    cpu = [b for b in page_blocks() if b.code == twin]
    assert len(cpu) == 1 and not cpu[0].marks, "beside it, its CPU twin, which runs in CI"
    tab = text[: text.index(twin.splitlines()[0])].rsplit("=== ", 1)[1]
    assert tab.startswith('"Laptop (CPU, gloo)"')


def test_its_tests_leave_out_the_pages_recorded_outputs() -> None:
    """The recorded digits are x86's (AVX2 kernels): a Mac rounds the last ones otherwise."""
    (line,) = [line for line in run_lines() if line.startswith("pytest ")]
    words = line.split()
    assert "--codeblocks" not in words
    assert not any(w == "docs" or w.startswith("docs/") for w in words)
    paths = [w for w in words if w.startswith("tests/")]
    assert "tests/ci/test_macos_workflow.py" in paths
    for path in paths:
        assert (ROOT / path).exists(), f"the job names {path}, which does not exist"


def test_it_writes_a_summary_even_when_a_step_fails() -> None:
    (summary,) = [s for s in steps() if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    assert summary.get("if") == "always()"
    for said in ("MPS available", "Lab 1 on the CPU", "Lab 1 on MPS", "Lab 2", "Lab 3"):
        assert said in summary["run"]


# Where a run of the macOS job would be recorded (its summary, copied from GitHub).
MAC_RECORD = ROOT / "docs" / "generated" / "mac"


def test_the_page_says_the_job_has_not_run_until_a_record_exists() -> None:
    """No record of a macOS run is kept: the page must say nothing has passed on a Mac."""
    text = " ".join(PAGE.read_text().split())
    unrun = ["Not yet run on a Mac", "the job has not run yet", "has not yet run on GitHub"]
    if MAC_RECORD.exists() and any(MAC_RECORD.iterdir()):
        assert not any(s in text for s in unrun), "a record exists: say what it shows"
    else:
        missing = [s for s in unrun if s not in text]
        assert not missing, f"no macOS run is recorded, yet the page lacks {missing}"
        assert "run on it in full" not in text
