# --8<-- [start:usage_error]
"""Errors the user can fix, and the one way every script reports them.

Used by every script:  raise SystemExit(run_cli(main))
"""

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn


class UsageError(Exception):
    """Bad input from the user. The message is one line that names the fix."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is a UsageError (one line) instead of usage + error."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see --help)")


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run a script's ``main``; print a UsageError as one line on stderr and return 2."""
    try:
        return main(argv)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


# --8<-- [end:usage_error]
