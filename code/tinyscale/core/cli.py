# --8<-- [start:option]
"""Command-line flags made from dataclass fields: one builder for every training script.

Try it:  python code/scripts/train_tiny_transformer.py --help

A config dataclass (``TrainConfig``) says, field by field, what a run may change: its
type, its default and one line of help. ``add_flags`` turns the fields a script needs
into ``--flags`` and ``from_args`` turns the parsed flags back into the dataclass, whose
``__post_init__`` checks every value. So every script has the same flag for the same
thing, and a bad value fails the same way everywhere: one line that names the flag.
"""

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any


def option(default: Any, help: str) -> Any:
    """A dataclass field that is also a command-line flag: its default and its help text."""
    return dataclasses.field(default=default, metadata={"help": help})


def flag(name: str) -> str:
    """The flag of a field: global_batch_size -> --global-batch-size."""
    return "--" + name.replace("_", "-")


# --8<-- [end:option]


# --8<-- [start:add_flags]
def add_flags(
    parser: argparse.ArgumentParser,
    defaults: Any,
    names: Sequence[str],
    *,
    notes: Mapping[str, str] | None = None,
) -> None:
    """Add one flag per named field of the dataclass instance ``defaults``.

    The flag's default is the field's value in ``defaults``, so each script keeps its own
    defaults (Lab 1 writes to runs/lab1, Lab 2 to runs/ddp) under the same flags. A bool
    field becomes a switch that turns it off (--no-progress). ``notes`` adds a script's
    own words to a field's help, e.g. what its default None means there.
    """
    fields = {f.name: f for f in dataclasses.fields(defaults)}
    for name in names:
        field, default = fields[name], getattr(defaults, name)
        help = field.metadata["help"]
        if name in (notes or {}):
            help = f"{help}; {notes[name]}"
        kind = _value_type(field.type)
        if kind is bool:
            parser.add_argument(
                flag(f"no_{name}"), dest=name, action="store_const", const=False,
                default=default, help=f"turn off {help}",
            )  # fmt: skip
        else:
            shown = "" if default is None else f" (default: {default})"
            parser.add_argument(flag(name), type=kind, default=default, help=help + shown)


def _value_type(annotation: Any) -> type:
    """int | None -> int: the type argparse converts the flag's text to."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (kind,) = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return kind
    return annotation


def from_args(defaults: Any, args: argparse.Namespace) -> Any:
    """The dataclass again, every field that has a flag taken from the parsed flags.

    ``dataclasses.replace`` runs ``__post_init__``: every value is checked there, once.
    """
    names = [f.name for f in dataclasses.fields(defaults) if hasattr(args, f.name)]
    return dataclasses.replace(defaults, **{name: getattr(args, name) for name in names})


# --8<-- [end:add_flags]
