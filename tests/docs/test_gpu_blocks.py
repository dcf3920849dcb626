"""The pages' GPU blocks (tools/gpu_check.py): counted, checked without a GPU, shown honestly.

A block marked `<!--pytest.mark.skip(reason="needs GPUs")-->` is never run in CI. These
tests hold what can be held without a GPU:

- every GPU block says how many GPUs it needs (from its command, or `<!--gpus: N-->`);
- `python tools/gpu_check.py --cpu` passes: what each block runs exists, accepts its
  flags, and every file it names exists; and the check fails on a broken copy (a missing
  script, a bad flag, a missing file), once for each;
- the site shows one line under every GPU block (tools/mkdocs_gpu_hook.py): its GPU count
  and "Not yet run on a GPU.", or the run that `make gpu-check` recorded for that command;
- every record in docs/generated/gpu/<part>__<page-stem>.json belongs to a block (or a
  test) its page still has, and the record format survives the tool's own writer and reader.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import figures_testing
import gpu_check
import mkdocs_gpu_hook

BLOCKS = gpu_check.all_blocks()
RECORDS = ROOT / "docs" / "generated" / "gpu"
BADGE = re.compile(r"^(?P<indent> *)\*Needs .*?\. (?P<what>Not yet run on a GPU\.|Run on .*)\*$")
MACHINE = {
    "gpus": 1,
    "gpu": "NVIDIA H200",
    "driver": "570.0",
    "torch": "2.14.1+cu130",
    "cuda": "13.0",
    "nccl": "2.27.7",
}


def fake_run(block: gpu_check.GpuBlock, exit_code: int | None = 0) -> dict:
    """What gpu_mode writes for one block, made up: the format, not a GPU result."""
    return {
        "line": block.lineno,
        "command": block.code,
        "gpus": 1,
        "exit_code": exit_code,
        "timed_out": exit_code is None,
        "wall_s": 4.2,
        "output_tail": "step 20 | loss 6.1\n```",
        "machine": MACHINE,
        "date": "2026-12-01",
    }


# --- the blocks and their GPU counts -------------------------------------------------------
def test_the_tool_finds_every_block_the_testing_page_counts_as_needing_gpus() -> None:
    counted = sum(c.skipped.get("GPUs", 0) for c in figures_testing.count_pages())
    assert len(BLOCKS) == counted > 0


def test_every_gpu_block_has_a_gpu_count() -> None:
    missing = [b.where for b in BLOCKS if gpu_check.need(b) is None]
    assert not missing, "add <!--gpus: N--> above: " + ", ".join(missing)


@pytest.mark.parametrize(
    ("command", "gpus", "nodes"),
    [
        ("python code/scripts/train_tiny_transformer.py --device cuda", 1, 1),
        ("torchrun --nproc_per_node=4 code/scripts/ddp_simulation_train.py", 4, 1),
        ("torchrun --nnodes 2 --nproc-per-node 8 -m tinyscale.ops.multinode x.py", 16, 2),
        ("srun --nodes=2 --ntasks-per-node=1 --gres=gpu:4 python -m tinyscale.ops.gpu_probe", 8, 2),
        ("srun -N1 python -m tinyscale.ops.storage --mib 1", 1, 1),
        ("sbatch code/config/slurm_example_gpu.sbatch --max-steps 3", 8, 2),  # its #SBATCH lines
        ("deepspeed --num_gpus 8 code/scripts/deepspeed_train.py", 8, 1),
        (
            "deepspeed --hostfile code/config/hostfile.example code/scripts/deepspeed_train.py",
            16,
            2,
        ),
        (
            "accelerate launch --num_machines 2 --num_processes 16 code/scripts/accelerate_train.py",
            16,
            2,
        ),
        ("kubectl apply -f code/config/k8s/pytorchjob.yaml", 8, 2),  # pods x nvidia.com/gpu
        ("./build/all_reduce_perf -b 8 -e 1G -f 2 -g 8", 8, 1),
    ],
)
def test_gpu_count_of_a_command(command: str, gpus: int, nodes: int) -> None:
    block = gpu_check.GpuBlock("x.md", 1, "bash", command + "\n")
    assert gpu_check.need(block) == gpu_check.Need(gpus, nodes)


def test_gpu_count_of_a_python_block_and_of_the_page_comment() -> None:
    def count(code: str, marked: int | None = None) -> gpu_check.Need | None:
        return gpu_check.need(gpu_check.GpuBlock("x.md", 1, "python", code, marked))

    assert count("run_on_ranks(f, 2, 'cuda', backend='nccl')\n") == gpu_check.Need(2)
    assert count("demo(world_size=4, backend='nccl')\n") == gpu_check.Need(4)
    assert count("import torch\nx = torch.ones(1, device='cuda')\n") == gpu_check.Need(1)
    assert count("rank = int(os.environ['LOCAL_RANK'])\n") is None  # torchrun started it
    assert count("rank = int(os.environ['LOCAL_RANK'])\n", marked=8) == gpu_check.Need(8)
    text = 'x\n<!--gpus: 8-->\n<!--pytest.mark.skip(reason="needs GPUs")-->\n```python\nx\n```\n'
    assert [b.marked for b in gpu_check.blocks_in_text(text, "x.md")] == [8]


# --- the CPU check -----------------------------------------------------------------------
def test_every_gpu_block_passes_the_cpu_check() -> None:
    """What `python tools/gpu_check.py --cpu` checks, in a process of its own (it imports
    the scripts, DeepSpeed, Accelerate and torchtitan to run their parsers)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "tools/gpu_check.py", "--cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    last = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0 and last == f"{len(BLOCKS)} GPU blocks: every check passed", (
        done.stdout[-3000:] + done.stderr[-2000:]
    )


def broken_copy(docs: Path) -> Path:
    """A page made of real GPU blocks, each broken once."""
    by_page = {b.page: b for b in BLOCKS}
    lab2, deepspeed = by_page["workshop/lab-2.md"].code, by_page["week-2/deepspeed-zero.md"].code
    missing_script = lab2.replace("ddp_simulation_train.py", "ddp_simulation_trian.py")
    bad_flag = lab2.replace("--max-steps", "--max-stepz")
    missing_file = deepspeed.replace("zero3.json", "zero4.json")
    assert len({lab2, missing_script, bad_flag}) == 3 and missing_file != deepspeed
    mark = '<!--pytest.mark.skip(reason="needs GPUs")-->'
    page = docs / "part" / "broken.md"
    page.parent.mkdir(parents=True)
    page.write_text(
        "# A broken copy\n\n"
        + "".join(
            f"{mark}\n```bash\n{code}```\n\n" for code in (missing_script, bad_flag, missing_file)
        )
    )
    return page


def test_the_cpu_check_fails_on_a_broken_copy_once_for_each_break(tmp_path: Path) -> None:
    broken_copy(tmp_path)
    found = gpu_check.cpu_check(gpu_check.all_blocks(tmp_path))
    assert len(found) == 3, "\n".join(found)
    script, flag, file = found
    assert script.startswith("part/broken.md:4: ") and "ddp_simulation_trian.py" in script
    assert "does not exist" in script
    assert flag.startswith("part/broken.md:9: ")
    assert "refuses its flags: unrecognized arguments: --max-stepz" in flag
    assert file.startswith("part/broken.md:14: ")
    assert "names code/config/deepspeed/zero4.json, which does not exist" in file


# --- what the site shows -------------------------------------------------------------------
def test_the_hook_is_registered_and_defines_one_event() -> None:
    """mkdocs registers every module-level on_* function of a hook file as an event."""
    assert "  - tools/mkdocs_gpu_hook.py" in (ROOT / "mkdocs.yml").read_text()
    assert [n for n in dir(mkdocs_gpu_hook) if n.startswith("on_")] == ["on_page_markdown"]


def badges(text: str) -> list[re.Match[str]]:
    return [m for line in text.splitlines() if (m := BADGE.match(line))]


@pytest.mark.parametrize("page", sorted({b.page for b in BLOCKS}))
def test_the_site_shows_one_line_under_every_gpu_block(page: str) -> None:
    markdown = (ROOT / "docs" / page).read_text()
    blocks = [b for b in BLOCKS if b.page == page]
    shown = badges(mkdocs_gpu_hook.annotate(markdown, page))
    assert len(shown) == len(blocks)
    path = gpu_check.record_path(page)
    runs = (
        {e["command"] for e in gpu_check.read_record(path)["blocks"]} if path.is_file() else set()
    )
    for block, badge in zip(blocks, shown, strict=True):
        fence_line = markdown.splitlines()[block.lineno - 1]
        assert badge["indent"] == fence_line[: len(fence_line) - len(fence_line.lstrip())]
        ran = badge["what"].startswith("Run on ")
        assert ran == (block.code in runs), f"{block.where}: {badge[0]}"


def test_a_recorded_run_is_shown_under_its_block_and_only_there(tmp_path: Path) -> None:
    page = "workshop/lab-1.md"
    (block,) = [b for b in BLOCKS if b.page == page]
    markdown = (ROOT / "docs" / page).read_text()
    assert badges(mkdocs_gpu_hook.annotate(markdown, page, tmp_path))[0]["what"] == (
        "Not yet run on a GPU."
    )
    gpu_check.write_record(page, [fake_run(block)], records=tmp_path)
    out = mkdocs_gpu_hook.annotate(markdown, page, tmp_path)
    (badge,) = badges(out)
    assert badge["what"] == (
        "Run on NVIDIA H200 (1 GPU; driver 570.0, torch 2.14.1+cu130, CUDA 13.0, NCCL 2.27.7) "
        "on 2026-12-01: exit 0 after 4.2 s."
    )
    assert "??? note" in out and "step 20 | loss 6.1" in out
    assert "````text" in out  # the output holds ```: a longer fence keeps it in the fold


# --- the records ---------------------------------------------------------------------------
def record_problems(path: Path, docs: Path = ROOT / "docs") -> list[str]:
    """A record must belong to its page: a GPU block it still has, a test it still names."""
    record = gpu_check.read_record(path)
    page = docs / record["page"]
    if not page.is_file() or gpu_check.record_path(record["page"], path.parent) != path:
        return [f"{path.name}: no page {record['page']}"]
    text = page.read_text()
    codes = {b.code for b in gpu_check.page_blocks(page, docs)}
    found = [
        f"{path.name}: a run of a block the page no longer has: {e['command'][:60]!r}"
        for e in record["blocks"]
        if e["command"] not in codes
    ]
    for entry in record["tests"]:
        file = entry["test"].split("::")[0]
        if file not in text or not (ROOT / file).is_file():
            found.append(f"{path.name}: {file} is not named by the page, or is gone")
    return found


def test_every_record_is_read_by_its_page() -> None:
    records = sorted(RECORDS.glob("*.json")) if RECORDS.is_dir() else []
    found = [p for path in records for p in record_problems(path)]
    assert not found, "\n".join(found)


def test_a_record_of_a_block_that_is_gone_fails(tmp_path: Path) -> None:
    page = "workshop/lab-1.md"
    (block,) = [b for b in BLOCKS if b.page == page]
    path = gpu_check.write_record(page, [fake_run(block)], records=tmp_path)
    assert record_problems(path) == []
    record = json.loads(path.read_text())
    record["blocks"][0]["command"] = "python code/scripts/gone.py\n"
    path.write_text(json.dumps(record))
    assert record_problems(path) == [
        "workshop__lab-1.json: a run of a block the page no longer has: "
        "'python code/scripts/gone.py\\n'"
    ]


def test_the_record_format_round_trips_through_the_tools_writer(tmp_path: Path) -> None:
    page = "workshop/lab-2.md"
    first, second = [b for b in BLOCKS if b.page == page]
    test = {"test": "tests/x.py::test_y", "outcome": "passed", "machine": MACHINE}
    path = gpu_check.write_record(
        page, [fake_run(first)], [test | {"date": "2026-12-01"}], records=tmp_path
    )
    assert path == tmp_path / "workshop__lab-2.json"
    assert gpu_check.read_record(path) == {
        "page": page,
        "blocks": [fake_run(first)],
        "tests": [test | {"date": "2026-12-01"}],
    }
    # a later run: the same block's new result replaces the old one; the other block joins
    gpu_check.write_record(page, [fake_run(first, 1), fake_run(second, None)], records=tmp_path)
    record = gpu_check.read_record(path)
    assert [e["exit_code"] for e in record["blocks"]] == [1, None]
    assert len(record["tests"]) == 1


# --- GPU mode: the plan --------------------------------------------------------------------
def test_the_plan_runs_only_what_fits_one_machine() -> None:
    env = gpu_check.run_env(Path("/tmp/gpu-check"))
    plan = {b.where: why for b, why in gpu_check.plan(BLOCKS, 1, env)}
    by_page = {b.page: b.where for b in BLOCKS}
    assert plan[by_page["workshop/lab-1.md"]] is None  # 1 GPU, python: it would run
    assert plan[by_page["week-2/deepspeed-zero.md"]] == "needs 8 GPUs, 1 here"
    assert plan[by_page["week-4/train-any-shape.md"]] == "needs 8 nodes"


def test_the_tests_that_need_cuda_are_found() -> None:
    found = gpu_check.cuda_tests()
    assert (
        "tests/tinyscale/ops/test_fragmentation.py::test_the_real_allocator_gives_the_model_row"
        in found
    )
    assert (
        "tests/tinyscale/ops/test_allocator.py::test_model_matches_the_real_allocator_on_a_gpu"
        in found
    )
    assert not any("without_a_gpu" in t for t in found)  # skipped *with* CUDA: not these
