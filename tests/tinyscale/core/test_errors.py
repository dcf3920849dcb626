"""tinyscale.core.errors: run_cli turns a UsageError into exit code 2 and one "error:" line on
stderr, and passes every other outcome through untouched.
"""

from collections.abc import Sequence

import pytest

from tinyscale.core.errors import UsageError, run_cli


def test_usage_error_becomes_exit_code_2_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def main(argv: Sequence[str] | None) -> int:
        raise UsageError(f"--epochs must be positive, got {argv[0] if argv else None}")

    assert run_cli(main, ["0"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: --epochs must be positive, got 0\n"
    assert len(captured.err.splitlines()) == 1


@pytest.mark.parametrize("code", [0, 1, 3])
def test_return_code_passes_through(code: int, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[Sequence[str] | None] = []

    def main(argv: Sequence[str] | None) -> int:
        seen.append(argv)
        print("working")
        return code

    assert run_cli(main, ["--flag"]) == code
    assert seen == [["--flag"]]
    captured = capsys.readouterr()
    assert captured.out == "working\n" and captured.err == ""


def test_argv_defaults_to_none() -> None:
    seen: list[Sequence[str] | None] = []
    assert run_cli(lambda argv: seen.append(argv) or 0) == 0
    assert seen == [None]


def test_other_exceptions_are_not_swallowed() -> None:
    def main(argv: Sequence[str] | None) -> int:
        raise ValueError("a bug, not a usage error")

    with pytest.raises(ValueError, match="a bug"):
        run_cli(main, [])
