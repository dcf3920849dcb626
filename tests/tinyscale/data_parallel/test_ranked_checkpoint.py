"""tinyscale.data_parallel.ranked_checkpoint: one file per rank and a manifest written last.

Launches (gloo, CPU), each a few seconds, with the Checkpoints page's workers
(tinyscale.data_parallel.checkpoint_demo): a save on 2 ranks, a save that crashes between
the rank files and the manifest, a resume on 2 ranks. Bad input is checked in this
process on copies of the fixture.
"""

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import TIMEOUTS, one_line_error
from tinyscale.comm.launch import RankFailed, run_on_ranks
from tinyscale.core.checkpoint import MANIFEST, RESUME_FIX, latest_checkpoint
from tinyscale.core.config import preset
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel import ranked_checkpoint as rc
from tinyscale.data_parallel.checkpoint_demo import ranked_worker, resume_worker


@pytest.fixture(scope="module")
def ranked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A complete step 10 on 2 ranks, then a save of step 20 in which rank 0 dies between
    the rank files and the manifest."""
    ckpt_dir = tmp_path_factory.mktemp("ranked")
    saved = run_on_ranks(ranked_worker, 2, str(ckpt_dir), 10, **TIMEOUTS)
    with pytest.raises(RankFailed) as crash:
        run_on_ranks(ranked_worker, 2, str(ckpt_dir), 20, True, **TIMEOUTS)
    return {"dir": ckpt_dir, "saved": saved, "crash": str(crash.value)}


def test_ranked_layout_and_manifest(ranked: dict[str, Any]) -> None:
    directory = rc.step_dir(ranked["dir"], 10)
    # nothing half-written left behind: no temp files, only the rank files and the manifest
    assert sorted(p.name for p in directory.iterdir()) == [
        "manifest.json",
        "rank_00000.pt",
        "rank_00001.pt",
    ]
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["world_size"] == 2 and manifest["step"] == 10
    for rank, entry in enumerate(manifest["files"]):
        path = rc.rank_file(directory, rank)
        assert entry == rc.file_entry(path)  # name, size and sha256 of the bytes on disk
        assert f"{path.name} ({path.stat().st_size:,} bytes)" in ranked["saved"][rank]


def test_ranked_file_holds_this_ranks_state(ranked: dict[str, Any]) -> None:
    """Core's training state (no train config) plus the sampler; weights equal a single-process
    replica of the same step; RNG and sampler are per rank."""
    directory = rc.step_dir(ranked["dir"], 10)
    torch.manual_seed(0)  # one thread, as the workers (the test run's setting, conftest.py)
    model = TinyTransformer(preset("micro"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.arange(16).view(2, 8)
    model(x, x)[1].backward()
    optimizer.step()
    states = [rc.load_ranked(directory, rank=r, world_size=2) for r in (0, 1)]
    for rank, state in enumerate(states):
        assert (state["rank"], state["world_size"], state["step"]) == (rank, 2, 10)
        assert state["sampler"] == {"epoch": 0, "position": 80} and state["epoch"] == 0
        assert state["model_config"] == dataclasses.asdict(preset("micro"))
        assert state["train_config"] is None and state["rng_device"] is None  # CPU ranks
        # bitwise: the file holds exactly the replica's weights
        assert all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items())
        torch.manual_seed(1000 + rank)
        assert torch.equal(state["rng_cpu"], torch.get_rng_state())
    assert not torch.equal(states[0]["rng_cpu"], states[1]["rng_cpu"])


def test_crash_before_manifest_is_never_loaded(ranked: dict[str, Any]) -> None:
    assert "rank 0 exited with code 1" in ranked["crash"]
    crashed = rc.step_dir(ranked["dir"], 20)
    # every rank file of step 20 was written, but no manifest: the save is incomplete
    assert sorted(p.name for p in crashed.iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    assert latest_checkpoint(ranked["dir"]) == rc.step_dir(ranked["dir"], 10)
    message = one_line_error(rc.load_ranked, crashed, rank=0, world_size=2)
    assert "has no manifest.json" in message and message.endswith(RESUME_FIX)


def test_resume_continues_every_ranks_random_stream(ranked: dict[str, Any]) -> None:
    resumed = run_on_ranks(resume_worker, 2, str(ranked["dir"]), **TIMEOUTS)
    for rank, (before, after) in enumerate(zip(ranked["saved"], resumed, strict=True)):
        assert after.startswith(f"rank {rank} resumed step_000010 at sample 80")
        assert before.split("next draw ")[1] == after.split("next draw ")[1]  # same next number


@pytest.fixture
def copy(ranked: dict[str, Any], tmp_path: Path) -> Path:
    """A private copy of the complete checkpoint, to damage."""
    return Path(shutil.copytree(rc.step_dir(ranked["dir"], 10), tmp_path / "step_000010"))


def test_truncated_rank_file_is_named_by_every_rank_and_skipped(copy: Path) -> None:
    path = rc.rank_file(copy, 1)
    path.write_bytes(path.read_bytes()[:1000])
    for rank in (0, 1):  # every rank checks every size: all refuse alike, none waits for one
        message = one_line_error(rc.load_ranked, copy, rank=rank, world_size=2)
        assert str(path) in message and "damaged (1,000 bytes, manifest.json lists" in message
    skipped: list[str] = []
    assert latest_checkpoint(copy.parent, report=skipped.append) is None
    assert skipped == [f"skipped step_000010: {message.split('; ')[0]}"]


def test_truncated_manifest_is_one_line_and_skipped(copy: Path) -> None:
    manifest = copy / MANIFEST
    manifest.write_bytes(manifest.read_bytes()[:100])  # a copy of the folder cut short
    message = one_line_error(rc.load_ranked, copy, rank=0, world_size=2)
    assert message == f"{manifest} is damaged (not the JSON a save writes); {RESUME_FIX}"
    skipped: list[str] = []
    assert latest_checkpoint(copy.parent, report=skipped.append) is None
    assert skipped == [f"skipped step_000010: {message.split('; ')[0]}"]


def test_another_models_checkpoint_is_refused_naming_both(copy: Path) -> None:
    wide = dataclasses.replace(preset("micro"), hidden_size=32)
    message = one_line_error(rc.load_ranked, copy, rank=0, world_size=2, expect=wide)
    assert "was trained with hidden_size=16, but the config says hidden_size=32" in message


def test_altered_rank_file_fails_its_sha256(copy: Path) -> None:
    path = rc.rank_file(copy, 0)
    data = bytearray(path.read_bytes())
    data[-100] ^= 1  # one bit, same size
    path.write_bytes(data)
    message = one_line_error(rc.load_ranked, copy, rank=0, world_size=2)
    assert str(path) in message and "its sha256 differs" in message


def test_missing_rank_file_points_at_node_local_disk(copy: Path) -> None:
    rc.rank_file(copy, 1).unlink()
    message = one_line_error(rc.load_ranked, copy, rank=1, world_size=2)
    assert "rank_00001.pt is missing" in message and "every node sees" in message


def test_world_size_mismatch_names_the_fix(copy: Path) -> None:
    for world in (1, 4):
        message = one_line_error(rc.load_ranked, copy, rank=0, world_size=world)
        assert f"saved by 2 ranks but this job has {world}" in message
        assert "relaunch with 2 ranks" in message and "load_dcp" in message


def test_missing_directory_and_incomplete(copy: Path, tmp_path: Path) -> None:
    message = one_line_error(rc.load_ranked, tmp_path / "nope", rank=0, world_size=2)
    assert "not found" in message
    (copy / MANIFEST).unlink()
    assert latest_checkpoint(tmp_path) is None  # the only step directory is incomplete
    assert latest_checkpoint(tmp_path / "nope") is None


def test_manifest_write_failure_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash while writing the manifest leaves no manifest and no temp file."""

    def crash(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(rc.json, "dump", crash)
    with pytest.raises(OSError, match="disk full"):
        rc.write_manifest(tmp_path, {"format": rc.MANIFEST_FORMAT})
    assert list(tmp_path.iterdir()) == []
