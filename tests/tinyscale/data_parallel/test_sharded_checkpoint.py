"""tinyscale.data_parallel.sharded_checkpoint: ranked checkpoints with a manifest written last, and DCP
sharded checkpoints that reload on another world size, bit for bit.

Launches (gloo, CPU), each a few seconds: ranked save on 2 ranks, a save that crashes
between the rank files and the manifest, a resume on 2 ranks; DCP save on 4, reload on 2
plus a background (async) save on 2, reload on 3. The reload on 1 runs in this process
with no process group. Bad input is checked in this process on copies of the fixtures.
"""

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from tinyscale.comm.launch import RankFailed, run_on_ranks
from tinyscale.core.config import preset
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel import sharded_checkpoint as sc

TIMEOUTS = {"timeout_s": 30.0, "deadline_s": 120.0}  # every wait bounded; a hang fails the test


def one_line_error(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(UsageError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, f"not one line: {message!r}"
    return message


# --- ranked checkpoints -------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A complete step 10 on 2 ranks, then a save of step 20 in which rank 0 dies between
    the rank files and the manifest."""
    ckpt_dir = tmp_path_factory.mktemp("ranked")
    saved = run_on_ranks(sc.ranked_worker, 2, str(ckpt_dir), 10, **TIMEOUTS)
    with pytest.raises(RankFailed) as crash:
        run_on_ranks(sc.ranked_worker, 2, str(ckpt_dir), 20, True, **TIMEOUTS)
    return {"dir": ckpt_dir, "saved": saved, "crash": str(crash.value)}


def test_ranked_layout_and_manifest(ranked: dict[str, Any]) -> None:
    directory = sc.step_dir(ranked["dir"], 10)
    # nothing half-written left behind: no temp files, only the rank files and the manifest
    assert sorted(p.name for p in directory.iterdir()) == [
        "manifest.json",
        "rank_00000.pt",
        "rank_00001.pt",
    ]
    manifest = json.loads((directory / sc.MANIFEST).read_text())
    assert manifest["world_size"] == 2 and manifest["step"] == 10
    for rank, entry in enumerate(manifest["files"]):
        path = sc.rank_file(directory, rank)
        assert entry == sc.file_entry(path)  # name, size and sha256 of the bytes on disk
        assert f"{path.name} ({path.stat().st_size:,} bytes)" in ranked["saved"][rank]


def test_ranked_file_holds_this_ranks_state(ranked: dict[str, Any]) -> None:
    """Weights equal a single-process replica of the same step; RNG and sampler are per rank."""
    directory = sc.step_dir(ranked["dir"], 10)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers: other thread counts sum in another order
    try:
        torch.manual_seed(0)
        model = TinyTransformer(preset("micro"))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.arange(16).view(2, 8)
        model(x, x)[1].backward()
        optimizer.step()
    finally:
        torch.set_num_threads(threads)
    states = [sc.load_ranked(directory, rank=r, world_size=2) for r in (0, 1)]
    for rank, state in enumerate(states):
        assert (state["rank"], state["world_size"], state["step"]) == (rank, 2, 10)
        assert state["sampler"] == {"epoch": 0, "position": 80}
        # bitwise: the file holds exactly the replica's weights
        assert all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items())
        torch.manual_seed(1000 + rank)
        assert torch.equal(state["rng_cpu"], torch.get_rng_state())
    assert not torch.equal(states[0]["rng_cpu"], states[1]["rng_cpu"])


def test_crash_before_manifest_is_never_loaded(ranked: dict[str, Any]) -> None:
    assert "rank 0 exited with code 1" in ranked["crash"]
    crashed = sc.step_dir(ranked["dir"], 20)
    # every rank file of step 20 was written, but no manifest: the save is incomplete
    assert sorted(p.name for p in crashed.iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    assert sc.latest_complete(ranked["dir"]) == sc.step_dir(ranked["dir"], 10)
    message = one_line_error(sc.load_ranked, crashed, rank=0, world_size=2)
    assert "has no manifest.json" in message and "latest_complete" in message


def test_resume_continues_every_ranks_random_stream(ranked: dict[str, Any]) -> None:
    resumed = run_on_ranks(sc.resume_worker, 2, str(ranked["dir"]), **TIMEOUTS)
    for rank, (before, after) in enumerate(zip(ranked["saved"], resumed, strict=True)):
        assert after.startswith(f"rank {rank} resumed step_000010 at sample 80")
        assert before.split("next draw ")[1] == after.split("next draw ")[1]  # same next number


@pytest.fixture
def copy(ranked: dict[str, Any], tmp_path: Path) -> Path:
    """A private copy of the complete checkpoint, to damage."""
    return Path(shutil.copytree(sc.step_dir(ranked["dir"], 10), tmp_path / "step_000010"))


def test_truncated_rank_file_is_named(copy: Path) -> None:
    path = sc.rank_file(copy, 1)
    path.write_bytes(path.read_bytes()[:1000])
    message = one_line_error(sc.load_ranked, copy, rank=1, world_size=2)
    assert str(path) in message and "damaged (1,000 bytes, manifest.json lists" in message
    sc.load_ranked(copy, rank=0, world_size=2)  # the other rank's file is still fine


def test_altered_rank_file_fails_its_sha256(copy: Path) -> None:
    path = sc.rank_file(copy, 0)
    data = bytearray(path.read_bytes())
    data[-100] ^= 1  # one bit, same size
    path.write_bytes(data)
    message = one_line_error(sc.load_ranked, copy, rank=0, world_size=2)
    assert str(path) in message and "its sha256 differs" in message


def test_missing_rank_file_points_at_node_local_disk(copy: Path) -> None:
    sc.rank_file(copy, 1).unlink()
    message = one_line_error(sc.load_ranked, copy, rank=1, world_size=2)
    assert "rank_00001.pt is missing" in message and "every node sees" in message


def test_world_size_mismatch_names_the_fix(copy: Path) -> None:
    for world in (1, 4):
        message = one_line_error(sc.load_ranked, copy, rank=0, world_size=world)
        assert f"saved by 2 ranks but this job has {world}" in message
        assert "relaunch with 2 ranks" in message and "load_dcp" in message


def test_missing_directory_and_incomplete(copy: Path, tmp_path: Path) -> None:
    message = one_line_error(sc.load_ranked, tmp_path / "nope", rank=0, world_size=2)
    assert "not found" in message
    (copy / sc.MANIFEST).unlink()
    assert sc.latest_complete(tmp_path) is None  # the only step directory is incomplete
    assert sc.latest_complete(tmp_path / "nope") is None


def test_manifest_write_failure_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash while writing the manifest leaves no manifest and no temp file."""

    def crash(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(sc.json, "dump", crash)
    with pytest.raises(OSError, match="disk full"):
        sc.write_manifest(tmp_path, {"format": sc.MANIFEST_FORMAT})
    assert list(tmp_path.iterdir()) == []


# --- DCP sharded checkpoints -----------------------------------------------------------------


def _reshard_chain(src: str, dst: str) -> tuple[bool, dict[str, tuple[int, ...]]]:
    """Load a checkpoint saved on another world size, then save it again in the background."""
    template = {n: torch.zeros_like(t) for n, t in sc.demo_params().items()}
    state = sc.load_dcp(sc.shard_state(template, "cpu", sc.SHARDED), src)
    sc.save_dcp(state, dst, background=True).result(timeout=60)
    full, saved = sc.full_tensors(state), sc.demo_params()
    return all(torch.equal(full[n], saved[n]) for n in saved), sc._local_shapes(state)


@pytest.fixture(scope="module")
def dcp_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("dcp")
    w4, w2 = str(root / "w4"), str(root / "w2")
    shapes4 = run_on_ranks(sc.dcp_save_worker, 4, w4, **TIMEOUTS)
    chain = run_on_ranks(_reshard_chain, 2, w4, w2, **TIMEOUTS)
    return {"w4": Path(w4), "w2": Path(w2), "shapes4": shapes4, "chain": chain}


def test_dcp_writes_one_file_per_rank_and_metadata(dcp_dirs: dict[str, Any]) -> None:
    names = sorted(p.name for p in dcp_dirs["w4"].iterdir())
    assert names == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)]
    md = FileSystemReader(dcp_dirs["w4"]).read_metadata()
    files: dict[str, int] = {}
    for index, info in md.storage_data.items():
        files[info.relative_path] = files.get(info.relative_path, 0) + info.length
        if index.fqn in sc.SHARDED:  # chunk r of a sharded tensor lives in rank r's file
            assert info.relative_path == f"__{index.index}_0.distcp"
    for name, nbytes in files.items():  # the files hold the records .metadata lists, no more
        assert (dcp_dirs["w4"] / name).stat().st_size == nbytes
    params = sc.demo_params()
    for name, tensor in params.items():
        chunks = md.state_dict_metadata[name].chunks
        rows = [c.offsets[0] for c in chunks]
        # sharded: 4 chunks of 1/4 of the rows; replicated: written once, by one rank (dedup)
        expected = [r * tensor.shape[0] // 4 for r in range(4)] if name in sc.SHARDED else [0]
        assert rows == expected, name
    for shapes in dcp_dirs["shapes4"]:  # each rank held (and wrote) only its quarter
        assert shapes == {n: (params[n].shape[0] // 4, 16) for n in sc.SHARDED}


def test_dcp_reshard_4_to_2_and_async_save(dcp_dirs: dict[str, Any]) -> None:
    params = sc.demo_params()
    for equal, shapes in dcp_dirs["chain"]:
        assert equal  # bitwise: torch.equal on the whole tensors
        assert shapes == {n: (params[n].shape[0] // 2, 16) for n in sc.SHARDED}
    assert sorted(p.name for p in dcp_dirs["w2"].iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]


def test_dcp_reload_2_on_3_and_on_1(dcp_dirs: dict[str, Any]) -> None:
    on3 = run_on_ranks(sc.dcp_load_worker, 3, str(dcp_dirs["w2"]), **TIMEOUTS)
    # 260 rows on 3 ranks: 87, 87, 86 (torch.chunk's split, like Shard(0))
    assert [shapes["tok_emb.weight"] for _, shapes in on3] == [(87, 16), (87, 16), (86, 16)]
    assert all(equal for equal, _ in on3)
    # one process, no process group: plain tensors receive the whole of every sharded tensor
    template = {n: torch.zeros_like(t) for n, t in sc.demo_params().items()}
    with pytest.warns(UserWarning, match="load in a single process"):
        full = sc.load_dcp(template, dcp_dirs["w2"])
    assert all(torch.equal(full[n], t) for n, t in sc.demo_params().items())


def test_dcp_bad_input(tmp_path: Path, dcp_dirs: dict[str, Any]) -> None:
    message = one_line_error(sc.load_dcp, {}, tmp_path / "nope")
    assert "has no .metadata" in message
    partial = Path(shutil.copytree(dcp_dirs["w4"], tmp_path / "partial"))
    (partial / ".metadata").unlink()  # a save that died before its commit
    assert "has no .metadata" in one_line_error(sc.load_dcp, {}, partial)
