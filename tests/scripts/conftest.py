"""Fixtures of the script tests: a script's bad input, checked the one way they all check it.

Bad input (ARCHITECTURE.md §3): one line on stderr that names the fix, exit code 2, and
nothing written, because it is checked before any work.
"""

from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import load_script
from tinyscale.core.errors import run_cli

# What torchrun gives rank 0: the script's checks run before it would join a process group.
RANK_0 = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


@pytest.fixture
def bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., str]:
    """``bad_input(script, argv, **env)``: run code/scripts/<script>.py's main in-process,
    as rank 0, on ``argv`` with an --output-dir and a --log-dir of its own; return its one
    line on stderr (without the newline) once it is checked to be refused as bad input.

    ``env`` overrides RANK_0 (``WORLD_SIZE="4"``); an empty value unsets the variable.
    """

    def run(script: str, argv: list[str], **env: str) -> str:
        for key, value in {**RANK_0, **env}.items():
            if value:
                monkeypatch.setenv(key, value)
            else:
                monkeypatch.delenv(key, raising=False)
        out, logs = tmp_path / "out", tmp_path / "logs"
        main = load_script(script).main
        assert run_cli(main, [*argv, "--output-dir", str(out), "--log-dir", str(logs)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
        assert not out.exists() and not logs.exists(), "bad input is refused before any work"
        return err.removesuffix("\n")

    return run
