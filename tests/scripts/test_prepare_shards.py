"""code/scripts/prepare_shards.py, and the labs' switch to its shards (--corpus shards:DIR).

- The command writes the shards and says so; run again, it writes nothing.
- Lab 1 and Lab 2 on the shards train on exactly the tokens of the text: the same losses.
- Bad input: cases of tests/scripts/bad_inputs.py, checked by test_bad_inputs.py.
"""

import json
from pathlib import Path
from types import ModuleType

import pytest

from helpers import load_script
from tinyscale.comm.launch import free_port
from tinyscale.core.metrics import read_metrics


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script("prepare_shards")


@pytest.fixture(scope="module")
def made(script: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    args = ["--out", str(out), "--shard-tokens", "50000", "--no-progress"]
    assert script.main(args) == 0
    return out


def test_the_command_writes_then_keeps_the_shards(
    script: ModuleType, made: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert script.main(["--out", str(made), "--shard-tokens", "50000"]) == 0
    assert capsys.readouterr().out == (
        f"{made}: 6 shards by 1 process(es): 0 written, 6 already complete; "
        "index.json written last\n"
    )
    assert sorted(p.name for p in made.iterdir()) == [
        "heldout_00000.bin", "index.json", "tokenizer.json", *(f"train_0000{k}.bin" for k in range(5))
    ]  # fmt: skip


def test_lab1_on_the_shards_trains_on_the_same_tokens(made: Path, tmp_path: Path) -> None:
    lab1 = load_script("train_tiny_transformer")
    runs = {}
    for corpus in ("stdlib", f"shards:{made}"):
        out = tmp_path / corpus.split(":")[0]
        args = ["--corpus", corpus, "--epochs", "1", "--max-steps", "3", "--eval-every", "3"]
        assert lab1.main([*args, "--output-dir", str(out), "--no-progress"]) == 0
        runs[corpus] = [
            (r["step"], r["split"], r["loss"]) for r in read_metrics(out / "metrics.jsonl")
        ]
    text, shards = runs.values()
    assert len(text) == 5 and shards == text  # step 0 and 3 held out, steps 1-3 train


def test_lab2_on_the_shards_trains_on_the_same_tokens(
    made: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rank in this process: the same sampler and steps as N ranks, over the shards."""
    lab2 = load_script("ddp_simulation_train")
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    summaries = []
    for corpus in ("stdlib", f"shards:{made}"):
        monkeypatch.setenv("MASTER_PORT", str(free_port()))
        out = tmp_path / corpus.split(":")[0]
        args = ["--corpus", corpus, "--max-steps", "2", "--global-batch-size", "8", "--device",
                "cpu", "--output-dir", str(out), "--log-dir", str(out / "logs")]  # fmt: skip
        assert lab2.main(args) == 0
        summaries.append(json.loads((out / "summary.json").read_text()))
    text, shards = summaries
    assert shards["final_loss"] == text["final_loss"]
    assert shards["heldout_loss"] == text["heldout_loss"]
