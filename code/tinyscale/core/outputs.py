# --8<-- [start:check_writable]
"""Where a run writes, checked before it starts: one line for a place it could not write.

Try it:  python code/scripts/prepare_shards.py --out README.md/shards    # one line, exit 2

A run that trains for an hour and then cannot save has lost the hour. So every script
checks each place it will write before any work: its folders (--output-dir, --log-dir,
--out, and the folders it makes inside them) and its files (an adapter, a report, an
index). A place is fine when it exists as what the run writes there, a folder or a file,
or when it does not exist yet and its nearest existing parent is a folder this process may
write to. A file where a folder must go, a folder where a file must go, and a read-only
parent are one line that names the flag to change.
"""

import os
from pathlib import Path

from tinyscale.core.errors import UsageError


def check_writable(root: str | Path, name: str, *inside: str, file: bool = False) -> Path:
    """Check ``root/inside...``, where flag ``name`` (set to ``root``) makes the run write.

    ``file=True``: the run writes a file there (an existing one is replaced); otherwise a
    folder (created if missing). Returns the path; creates and writes nothing.
    """
    target = Path(root, *inside)
    if target.exists() and target.is_dir() == file:  # the other kind is in the way
        found, wanted = ("a folder", "a file") if file else ("a file", "a folder")
        place = f"{name} {root}: {target}" if inside else f"{name} {root}"
        fix = f"remove it or pass another {name}" if inside else f"pass another {name}"
        raise UsageError(f"{place} is {found}, where the run writes {wanted}: {fix}")
    folder = target if target.is_dir() else target.parent
    while not folder.exists():  # made when the run writes: its nearest existing parent
        folder = folder.parent  # ends at "." or "/", which exist
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        shown = folder.absolute() if folder == Path() else folder  # "." says little
        raise UsageError(
            f"{name} {root} cannot be created or written ({shown} is not a folder this "
            f"process may write to): pass another {name}"
        )
    return target


# --8<-- [end:check_writable]
