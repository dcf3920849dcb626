"""tinyscale.core.checkpoint: round trip, atomic save, and refusal of every file that is not a
tinyscale checkpoint for this model (corrupt, foreign, another config, pickled code).

describe_checkpoint's byte total is checked against numel * element_size of the tensors.
"""

import dataclasses
import json
import pickle
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import torch

from helpers import one_line_error
from tinyscale.core import checkpoint as ckpt
from tinyscale.core.checkpoint import FORMAT, describe_checkpoint, load_checkpoint, save_checkpoint
from tinyscale.core.config import ModelConfig, preset
from tinyscale.core.errors import UsageError
from tinyscale.core.model import TinyTransformer
from tinyscale.core.training import TrainConfig

CFG = preset("micro")


def make_state(cfg: ModelConfig = CFG, step: int = 7) -> dict[str, Any]:
    """What the training loop saves: model, optimizer after one step, RNG, history."""
    torch.manual_seed(0)
    model = TinyTransformer(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.max_position_embeddings))
    _, loss = model(x, x)
    assert loss is not None
    loss.backward()
    optimizer.step()
    return {
        "model_config": dataclasses.asdict(cfg),
        "step": step,
        "epoch": 0,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng_cpu": torch.get_rng_state(),
        "history": [{"step": 1, "split": "train", "loss": 5.5}],
    }


def one_line_usage_error(path: Path, **kwargs: Any) -> str:
    with pytest.raises(UsageError) as info:
        load_checkpoint(path, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, f"not one line: {message!r}"
    return message


def test_round_trip(tmp_path: Path) -> None:
    state = make_state()
    path = save_checkpoint(state, tmp_path / "sub" / "step_000007.pt")
    assert path == tmp_path / "sub" / "step_000007.pt"
    loaded = load_checkpoint(path, expect=CFG)
    assert loaded["format"] == FORMAT
    assert loaded["step"] == 7 and loaded["history"] == state["history"]
    assert loaded["model"].keys() == state["model"].keys()
    for name, tensor in state["model"].items():
        assert torch.equal(loaded["model"][name], tensor), name
    assert torch.equal(loaded["rng_cpu"], state["rng_cpu"])
    for key, value in state["optimizer"]["state"][0].items():
        assert torch.equal(loaded["optimizer"]["state"][0][key], value), key
    # the loaded weights drive a model to the same outputs
    model = TinyTransformer(CFG)
    model.load_state_dict(loaded["model"])
    assert sorted(p.name for p in tmp_path.joinpath("sub").iterdir()) == [path.name]


def test_save_is_atomic_when_torch_save_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = save_checkpoint(make_state(step=1), tmp_path / "latest.pt")
    before = path.read_bytes()

    def half_write(obj: object, f: BinaryIO) -> None:
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", half_write)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(make_state(step=2), path)
    assert path.read_bytes() == before  # the previous checkpoint is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["latest.pt"]  # and no temporary file
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1


def test_save_is_atomic_on_keyboard_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(obj: object, f: BinaryIO) -> None:
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(make_state(), tmp_path / "new.pt")
    assert list(tmp_path.iterdir()) == []  # neither a half file nor a temporary one


@pytest.mark.parametrize("keep", [0, 10, 500, -100])
def test_truncated_or_corrupt_file(tmp_path: Path, keep: int) -> None:
    good = save_checkpoint(make_state(), tmp_path / "good.pt").read_bytes()
    path = tmp_path / "bad.pt"
    path.write_bytes(good[:keep])
    assert path.read_bytes() != good
    message = one_line_usage_error(path)
    assert "corrupt" in message and "--resume" in message


def test_random_bytes_are_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "noise.pt"
    path.write_bytes(bytes(range(256)) * 4)
    assert "corrupt" in one_line_usage_error(path)


@pytest.mark.parametrize(
    "payload",
    [torch.zeros(3), {"model": {}, "step": 1}, {"format": "someone.else.v9"}, [1, 2]],
    ids=["tensor", "dict-without-marker", "other-marker", "list"],
)
def test_valid_torch_file_without_the_format_marker(tmp_path: Path, payload: object) -> None:
    path = tmp_path / "foreign.pt"
    torch.save(payload, path)
    message = one_line_usage_error(path)
    assert "not a tinyscale checkpoint" in message and FORMAT in message


@pytest.mark.parametrize(
    ("field", "value"),
    [("hidden_size", 32), ("num_hidden_layers", 3), ("vocab_size", 300), ("dropout", 0.0)],
)
def test_different_model_config_names_the_field(tmp_path: Path, field: str, value: object) -> None:
    path = save_checkpoint(make_state(), tmp_path / "ckpt.pt")
    other = dataclasses.replace(CFG, **{field: value})
    message = one_line_usage_error(path, expect=other)
    assert f"{field}={getattr(CFG, field)}" in message and f"{field}={value}" in message
    assert "--config" in message
    load_checkpoint(path)  # without expect= it loads


LOADED: list[str] = []


def _side_effect() -> "Payload":
    LOADED.append("code ran")
    return Payload()


class Payload:
    """An object whose unpickling would run code: weights_only must refuse it."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_side_effect, ())


def test_pickled_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "model": {}, "payload": Payload()}, path)
    pickle.loads(pickle.dumps(Payload()))  # what the file holds runs code when unpickled...
    assert LOADED == ["code ran"]
    LOADED.clear()
    message = one_line_usage_error(path)  # ...and load_checkpoint does not run it
    assert "corrupt or not a tinyscale checkpoint" in message
    assert LOADED == []


def test_missing_checkpoint(tmp_path: Path) -> None:
    message = one_line_usage_error(tmp_path / "nope.pt")
    assert message == f"checkpoint {tmp_path / 'nope.pt'} not found: check the path"


def test_a_missing_checkpoint_names_the_last_ones_its_folder_holds(tmp_path: Path) -> None:
    """The step count of a run depends on the corpus: a guessed name lists the real ones."""
    for step in (100, 200, 300, 434):
        (tmp_path / f"step_{step:06d}.pt").write_bytes(b"")
    message = one_line_usage_error(tmp_path / "step_000414.pt")
    assert message.endswith(
        f"check the path ({tmp_path} holds step_000200.pt, step_000300.pt, step_000434.pt)"
    )


def test_describe_checkpoint_lists_tensors_and_their_bytes(tmp_path: Path) -> None:
    """Every model tensor is listed with its shape; the byte total is the sum of the listed
    numel * element_size, and for fp32 AdamW it is the formula: 4 (weights) + 8 (two Adam
    moments) bytes per parameter, the tied embedding counted once, as torch.save stores it."""
    state = make_state()
    path = save_checkpoint(state, tmp_path / "ckpt.pt")
    lines = describe_checkpoint(path).splitlines()
    assert lines[0].startswith(str(path)) and "step 7" in lines[0] and "epoch 0" in lines[0]
    for name, tensor in state["model"].items():
        row = next(line for line in lines if line.split()[:1] in ([name], [f"model.{name}"]))
        assert str(tuple(tensor.shape)) in row, row
    listed = [int(m.group(1).replace(",", "")) for m in map(_bytes_of, lines) if m]
    *parts, total = listed
    assert "total" in lines[-1] and _bytes_of(lines[-1])
    assert total == sum(parts)
    num_params = TinyTransformer(CFG).num_parameters()
    assert total == (4 + 8) * num_params
    unique = {t.untyped_storage().data_ptr(): t for t in state["model"].values()}
    moments = [t for s in state["optimizer"]["state"].values() for t in s.values() if t.dim()]
    assert total == sum(t.numel() * t.element_size() for t in [*unique.values(), *moments])
    assert path.stat().st_size > total  # the file holds at least those bytes


def _bytes_of(line: str) -> re.Match[str] | None:
    return re.search(r"([\d,]+) B$", line)


def test_training_state_with_and_without_a_train_config(tmp_path: Path) -> None:
    """cfg=None (Session C's ranked checkpoints): "train_config" is None, the rest as usual."""
    model = TinyTransformer(CFG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kwargs = {"model": model, "optimizer": optimizer, "step": 3, "epoch": 1}
    cpu = torch.device("cpu")
    with_cfg = ckpt.training_state(**kwargs, cfg=TrainConfig(), device=cpu)
    assert with_cfg["train_config"] == dataclasses.asdict(TrainConfig())
    state = ckpt.training_state(**kwargs, cfg=None, device=cpu, sampler={"position": 8})
    assert state["train_config"] is None and state["model_config"] == dataclasses.asdict(CFG)
    assert (state["step"], state["epoch"], state["sampler"]) == (3, 1, {"position": 8})
    assert state["rng_device"] is None and torch.equal(state["rng_cpu"], torch.get_rng_state())
    loaded = load_checkpoint(save_checkpoint(state, tmp_path / "s.pt"), expect=CFG)
    assert loaded["train_config"] is None  # weights_only loads it back


def whole(path: Path) -> Path:
    """A small checkpoint file, complete: what save_checkpoint leaves under its name."""
    return save_checkpoint({"step": ckpt.checkpoint_step(path)}, path)


def test_latest_checkpoint_is_the_newest_whole_one(tmp_path: Path) -> None:
    assert ckpt.latest_checkpoint(tmp_path / "none") is None
    for step in (5, 40, 10):
        whole(tmp_path / f"step_{step:06d}.pt")  # files are complete once they have a name
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000040.pt"
    (tmp_path / "step_000050").mkdir()  # several ranks' files, no manifest yet: incomplete
    whole(tmp_path / "step_000050" / "rank_00000.pt")
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000040.pt"
    manifest = {"files": [{"file": "rank_00000.pt", "bytes": 0}]}
    manifest["files"][0]["bytes"] = (tmp_path / "step_000050" / "rank_00000.pt").stat().st_size
    (tmp_path / "step_000050" / ckpt.MANIFEST).write_text(json.dumps(manifest))  # written last
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000050"
    (tmp_path / "step_000060").mkdir()
    (tmp_path / "step_000060" / ".metadata").touch()  # DCP's alone: its save never committed
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000050"


def test_a_checkpoint_name_gives_back_its_step(tmp_path: Path) -> None:
    assert ckpt.checkpoint_name(100) == "step_000100"
    for step in (0, 7, 414, 1_234_567):  # past six digits the name grows, the step still reads
        name = ckpt.checkpoint_name(step)
        assert ckpt.checkpoint_step(name) == ckpt.checkpoint_step(f"{name}.pt") == step
    for other in ("step_.pt", "step_12.pt.tmp-3", ".step_000001.pt.tmp-9", "latest", "step_1.json"):
        assert ckpt.checkpoint_step(other) is None
    for step in (999_999, 1_000_000):  # by step, not by name: "step_1000000" < "step_999999"
        whole(tmp_path / f"{ckpt.checkpoint_name(step)}.pt")
    (tmp_path / "step_notes.pt").touch()  # not a checkpoint's name: never picked
    assert ckpt.latest_checkpoint(tmp_path).name == "step_1000000.pt"


def torn(path: Path, keep: int) -> Path:
    """``path`` cut to its first ``keep`` bytes, as a full disk or a failed copy leaves it."""
    path.write_bytes(path.read_bytes()[:keep])
    return path


def test_a_damaged_checkpoint_is_skipped_with_one_line_and_refused_by_name(
    tmp_path: Path,
) -> None:
    """Newest first: a file cut short, a directory whose listed file is short, one whose
    manifest is cut short, one with no manifest: each skipped with its reason, in one line."""
    good = whole(tmp_path / "step_000001.pt")
    torn(whole(tmp_path / "step_000005.pt"), 1000)
    for step, damage in ((2, "file"), (3, "manifest"), (4, "none")):
        directory = tmp_path / ckpt.checkpoint_name(step)
        part = whole(directory / "rank_00000.pt")
        size = part.stat().st_size
        text = json.dumps({"files": [{"file": part.name, "bytes": size}]})
        if damage != "none":
            (directory / ckpt.MANIFEST).write_text(text)
        if damage == "file":
            torn(part, size - 1)
        if damage == "manifest":
            torn(directory / ckpt.MANIFEST, len(text) // 2)
    lines: list[str] = []
    assert ckpt.latest_checkpoint(tmp_path, report=lines.append) == good
    assert lines == [
        f"skipped step_000005.pt: {tmp_path}/step_000005.pt is cut short (no zip directory at "
        "its end: torch.save writes it last)",
        f"skipped step_000004: {tmp_path}/step_000004 has no manifest.json: the save never "
        "finished (a rank died before rank 0 committed it)",
        f"skipped step_000003: {tmp_path}/step_000003/manifest.json is damaged (not the JSON "
        "a save writes)",
        f"skipped step_000002: {tmp_path}/step_000002/rank_00000.pt is damaged "
        f"({size - 1:,} bytes, manifest.json lists {size:,})",
    ]
    for step in (5, 4, 3, 2):  # by name: one line that names the fix
        name = ckpt.checkpoint_name(step) + (".pt" if step == 5 else "")
        message = one_line_error(ckpt.verify_checkpoint, tmp_path / name)
        assert message.startswith(f"{tmp_path / name}") and message.endswith(ckpt.RESUME_FIX)
    assert ckpt.verify_checkpoint(good) == good


def test_the_skip_line_is_rank_0s_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "step_000002").mkdir()
    for rank, lines in (("1", 0), ("0", 1)):  # every rank chooses, rank 0 alone says so
        monkeypatch.setenv("RANK", rank)
        assert ckpt.latest_checkpoint(tmp_path) is None
        err = capsys.readouterr().err
        assert err.count("\n") == lines and err.startswith("warning: skipped step_000002: " * lines)


def test_a_start_removes_step_folders_whose_save_never_finished(tmp_path: Path) -> None:
    """No manifest: removed; whole or damaged (evidence): kept; files: never touched."""
    for name in ("step_000001", "step_000002", "notes"):
        (tmp_path / name).mkdir()
        whole(tmp_path / name / "rank_00000.pt")
    (tmp_path / "step_000001" / ckpt.MANIFEST).write_text('{"files": [')  # damaged: kept
    whole(tmp_path / "step_000003.pt")
    assert ckpt.remove_stale_temps(tmp_path) == [tmp_path / "step_000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step_000001", "step_000003.pt"]


SAVE_FOREVER = """
import sys, torch
from tinyscale.core.checkpoint import save_checkpoint
state = {"weights": torch.zeros(16_000_000)}  # 64 MB: long enough to be caught writing
while True:
    save_checkpoint(state, sys.argv[1])
"""


def test_a_save_killed_mid_write_leaves_a_temp_that_the_next_start_removes(tmp_path: Path) -> None:
    """SIGKILL runs no `finally`: the temp file stays, the checkpoint before it is intact."""
    ckpt.save_checkpoint({"step": 1}, tmp_path / "step_000001.pt")
    proc = subprocess.Popen(
        [sys.executable, "-c", SAVE_FOREVER, str(tmp_path / "step_000002.pt")],
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".step_000002.pt.tmp-*")):  # caught mid-write
            assert proc.poll() is None and time.monotonic() < deadline, "no temp file appeared"
            time.sleep(0.005)
    finally:
        proc.kill()  # SIGKILL: as the OOM killer or a cancelled job does
        proc.wait(timeout=30)
    stale = list(tmp_path.glob(".*.tmp-*"))
    assert len(stale) == 1
    assert ckpt.load_checkpoint(tmp_path / "step_000001.pt")["step"] == 1  # still whole
    assert ckpt.remove_stale_temps(tmp_path) == stale
    assert not list(tmp_path.glob(".*.tmp-*"))
    latest = ckpt.latest_checkpoint(tmp_path)  # step 2 if a save finished, else step 1
    assert ckpt.load_checkpoint(latest)["format"] == ckpt.FORMAT  # whole, never half
