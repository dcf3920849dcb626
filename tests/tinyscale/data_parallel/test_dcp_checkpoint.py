"""tinyscale.data_parallel.dcp_checkpoint: DCP sharded checkpoints that reload on another
world size, bit for bit.

Launches (gloo, CPU), each a few seconds, with the Checkpoints page's workers
(tinyscale.data_parallel.checkpoint_demo): a save on 4 ranks, a reload on 2 plus a
background (async) save on 2, a reload on 3. The reload on 1 runs in this process with no
process group.
"""

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from helpers import TIMEOUTS, one_line_error
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.checkpoint import MANIFEST, RESUME_FIX, latest_checkpoint
from tinyscale.data_parallel.checkpoint_demo import (
    SHARDED,
    _local_shapes,
    dcp_load_worker,
    dcp_save_worker,
    demo_params,
)
from tinyscale.data_parallel.dcp_checkpoint import (
    DCP_FORMAT,
    full_tensors,
    load_dcp,
    save_dcp,
    shard_state,
)


def _reshard_chain(src: str, dst: str) -> tuple[bool, dict[str, tuple[int, ...]]]:
    """Load a checkpoint saved on another world size, then save it again in the background."""
    template = {n: torch.zeros_like(t) for n, t in demo_params().items()}
    state = load_dcp(shard_state(template, "cpu", SHARDED), src)
    save_dcp(state, dst, background=True).result(timeout=60)
    full, saved = full_tensors(state), demo_params()
    return all(torch.equal(full[n], saved[n]) for n in saved), _local_shapes(state)


@pytest.fixture(scope="module")
def dcp_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("dcp")
    w4, w2 = str(root / "w4"), str(root / "w2")
    shapes4 = run_on_ranks(dcp_save_worker, 4, w4, **TIMEOUTS)
    chain = run_on_ranks(_reshard_chain, 2, w4, w2, **TIMEOUTS)
    return {"w4": Path(w4), "w2": Path(w2), "shapes4": shapes4, "chain": chain}


def test_dcp_writes_one_file_per_rank_and_metadata(dcp_dirs: dict[str, Any]) -> None:
    names = sorted(p.name for p in dcp_dirs["w4"].iterdir())
    assert names == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)] + [MANIFEST]
    manifest = json.loads((dcp_dirs["w4"] / MANIFEST).read_text())  # written last, by rank 0
    assert manifest["format"] == DCP_FORMAT and [e["file"] for e in manifest["files"]] == names[:-1]
    for entry in manifest["files"]:  # .metadata and every file it names, with its size
        assert entry["bytes"] == (dcp_dirs["w4"] / entry["file"]).stat().st_size
    md = FileSystemReader(dcp_dirs["w4"]).read_metadata()
    files: dict[str, int] = {}
    for index, info in md.storage_data.items():
        files[info.relative_path] = files.get(info.relative_path, 0) + info.length
        if index.fqn in SHARDED:  # chunk r of a sharded tensor lives in rank r's file
            assert info.relative_path == f"__{index.index}_0.distcp"
    for name, nbytes in files.items():  # the files hold the records .metadata lists, no more
        assert (dcp_dirs["w4"] / name).stat().st_size == nbytes
    params = demo_params()
    for name, tensor in params.items():
        chunks = md.state_dict_metadata[name].chunks
        rows = [c.offsets[0] for c in chunks]
        # sharded: 4 chunks of 1/4 of the rows; replicated: written once, by one rank (dedup)
        expected = [r * tensor.shape[0] // 4 for r in range(4)] if name in SHARDED else [0]
        assert rows == expected, name
    for shapes in dcp_dirs["shapes4"]:  # each rank held (and wrote) only its quarter
        assert shapes == {n: (params[n].shape[0] // 4, 16) for n in SHARDED}


def test_dcp_reshard_4_to_2_and_async_save(dcp_dirs: dict[str, Any]) -> None:
    params = demo_params()
    for equal, shapes in dcp_dirs["chain"]:
        assert equal  # bitwise: torch.equal on the whole tensors
        assert shapes == {n: (params[n].shape[0] // 2, 16) for n in SHARDED}
    assert sorted(p.name for p in dcp_dirs["w2"].iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        MANIFEST,  # the background save's future is done once rank 0 has committed it
    ]


def test_dcp_reload_2_on_3_and_on_1(dcp_dirs: dict[str, Any]) -> None:
    on3 = run_on_ranks(dcp_load_worker, 3, str(dcp_dirs["w2"]), **TIMEOUTS)
    # 260 rows on 3 ranks: 87, 87, 86 (torch.chunk's split, like Shard(0))
    assert [shapes["tok_emb.weight"] for _, shapes in on3] == [(87, 16), (87, 16), (86, 16)]
    assert all(equal for equal, _ in on3)
    # one process, no process group: plain tensors receive the whole of every sharded tensor
    template = {n: torch.zeros_like(t) for n, t in demo_params().items()}
    with pytest.warns(UserWarning, match="load in a single process"):
        full = load_dcp(template, dcp_dirs["w2"])
    assert all(torch.equal(full[n], t) for n, t in demo_params().items())


def test_dcp_bad_input(tmp_path: Path, dcp_dirs: dict[str, Any]) -> None:
    message = one_line_error(load_dcp, {}, tmp_path / "nope")
    assert "has no .metadata" in message
    partial = Path(shutil.copytree(dcp_dirs["w4"], tmp_path / "partial"))
    (partial / ".metadata").unlink()  # a save that died before its commit
    assert "has no .metadata" in one_line_error(load_dcp, {}, partial)


@pytest.mark.parametrize("name", [".metadata", "__2_0.distcp", MANIFEST])
def test_a_torn_file_is_one_line_and_never_chosen(
    name: str, tmp_path: Path, dcp_dirs: dict[str, Any]
) -> None:
    """Each file of a DCP checkpoint cut short: load_dcp names it in one line, before DCP
    reads a byte; latest_checkpoint skips it, with one line, for the older whole one."""
    older = shutil.copytree(dcp_dirs["w2"], tmp_path / "step_000001")
    torn = Path(shutil.copytree(dcp_dirs["w4"], tmp_path / "step_000002"))
    path = torn / name
    path.write_bytes(path.read_bytes()[:100])
    template = {n: torch.zeros_like(t) for n, t in demo_params().items()}
    message = one_line_error(load_dcp, template, torn)
    why = "not the JSON a save writes" if name == MANIFEST else "100 bytes, manifest.json lists"
    assert message.startswith(f"{path} is damaged (") and why in message
    assert message.endswith(RESUME_FIX)
    skipped: list[str] = []
    assert latest_checkpoint(tmp_path, report=skipped.append) == older
    assert skipped == [f"skipped step_000002: {message.split('; ')[0]}"]
