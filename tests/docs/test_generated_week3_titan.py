"""docs/generated/week3/titan_pp*: torchtitan's pipeline runs recorded by
tools/figures_week3_torchtitan_pp.py, checked against torchtitan's rules and the run CI
does on the pipeline-torchtitan page.

- the 1F1B run is the page's run: the same losses, to the last printed digit;
- every run's stages are torchtitan's split of 6 layers (+ embedding and output, weighed
  as one layer each) and its rank placement, which is our stage_placement;
- PP 2 x FSDP 2: pp outermost, so ranks 0, 1 hold stage 0 and ranks 2, 3 stage 1;
- the text fragments the page includes say what the JSON says.
"""

import json
import re

import pytest

from helpers import ROOT, load_tool, recorded_output

pytest.importorskip("torchtitan", reason="torchtitan is in the cluster extra: make setup")

# torchtitan's modules are imported in the tests that use them, not here: importing them
# costs seconds of CPU, and every pytest worker imports this file to collect it.

from tinyscale.pipeline_parallel.torch_pipeline import stage_placement

GENERATED = ROOT / "docs" / "generated" / "week3"
SCHEDULES = {
    "1F1B": ("1f1b", 2),
    "Interleaved1F1B": ("interleaved", 4),
    "ZBVZeroBubble": ("zbv", 4),
}


@pytest.fixture(scope="module")
def runs() -> dict:
    return json.loads((GENERATED / "titan_pp.json").read_text())["runs"]


def test_1f1b_run_is_the_pages_run(runs: dict) -> None:
    page = recorded_output("week-3/pipeline-torchtitan.md", "--config tinyscale_pp 2>&1")
    found = (re.match(r"rank 1: step: +\d+ +loss: +([\d.]+)", line) for line in page)
    assert runs["1F1B"]["losses"] == [float(m[1]) for m in found if m]


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_stages_follow_torchtitans_split_and_our_placement(runs: dict, schedule: str) -> None:
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    name, stages = SCHEDULES[schedule]
    run = runs[schedule]
    assert [s["modules"] for s in run["stages"]] == _generate_llm_fqn_per_model_part(
        stages, 6, 1, 1
    )
    for rank in range(2):
        held = [i for i, s in enumerate(run["stages"]) if s["pp_rank"] == rank]
        assert sorted(stage_placement(name, rank=rank, pp=2)) == held
    assert len(run["losses"]) == 6 and run["losses"][-1] < run["losses"][0]


def test_pp_times_fsdp_puts_pp_outermost(runs: dict) -> None:
    run = runs["PP 2 x FSDP 2"]
    assert run["processes"] == 4 and "pp=2, dp_replicate=1, dp_shard=2" in run["mesh"]
    assert [sorted(s["ranks"]) for s in run["stages"]] == [[0, 1], [2, 3]]
    assert len(run["losses"]) == 6 and run["losses"][-1] < run["losses"][0]


def test_fragments_say_what_the_json_says(runs: dict) -> None:
    brief = load_tool("figures_week3_torchtitan_pp").brief
    table = (GENERATED / "titan_pp_schedules.txt").read_text()
    for schedule in SCHEDULES:
        losses = " ".join(f"{v:>7.5f}" for v in runs[schedule]["losses"])
        assert re.search(rf"^{schedule} +{re.escape(losses)}$", table, re.M), schedule
        for stage in runs[schedule]["stages"]:
            assert brief(stage["modules"]) in table
    fsdp = (GENERATED / "titan_pp_fsdp.txt").read_text()
    assert " ".join(f"{v:.5f}" for v in runs["PP 2 x FSDP 2"]["losses"]) in fsdp
    assert "stage 0 on ranks [0, 1]: tok_embeddings + layers 0-2" in fsdp


def test_caption_names_the_recording_machine() -> None:
    machine = json.loads((GENERATED / "titan_pp.json").read_text())["machine"]
    page = " ".join((ROOT / "docs" / "week-3" / "pipeline-torchtitan.md").read_text().split())
    assert f"course's build machine ({machine};" in page
