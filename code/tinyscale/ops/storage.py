# --8<-- [start:header]
"""Where checkpoints go: which file system a directory is on, where the scheduler's fast and
shared directories are, and how fast a checkpoint really reaches the disk.

Launch:  python -m tinyscale.ops.storage --dir runs/storage

The write test writes like ``tinyscale.core.checkpoint`` does — a temporary file, fsync, rename —
once as one big file and once as many small files of the same total: the small-file
problem (every file costs a create, an fsync and a rename: metadata operations, which
a shared file system serves from one metadata server) is visible even on a laptop disk.
"""

import dataclasses
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tinyscale.core.errors import ArgumentParser, UsageError, run_cli

# --8<-- [end:header]


# --8<-- [start:where]
SHARED_TYPES = {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "fuse.s3fs"}
VOLATILE_TYPES = {"tmpfs", "ramfs", "overlay"}  # RAM, or a container's throw-away layer


def filesystem_type(path: str | Path, mounts: str | None = None) -> tuple[str, str]:
    """(mount point, file system type) of the mount that holds ``path``: the longest
    mount point in /proc/mounts that is a prefix of its real path."""
    real = os.path.realpath(path)
    text = Path("/proc/mounts").read_text() if mounts is None else mounts
    best = ("/", "unknown")
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")  # /proc/mounts escapes spaces
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, fields[2])
    return best


def storage_plan(environ: Mapping[str, str]) -> dict[str, str | None]:
    """Node-local scratch for speed, shared storage for what must outlive the node.

    SLURM_TMPDIR (many clusters) or TMPDIR point at node-local disk; SCRATCH and WORK are
    the usual names of a cluster's shared parallel file system. Nothing is guessed: a
    variable that is not set gives None.
    """
    local = environ.get("SLURM_TMPDIR") or environ.get("TMPDIR")
    shared = environ.get("SCRATCH") or environ.get("WORK")
    return {"node_local": local, "shared": shared}


def advice(fstype: str) -> str:
    if fstype in VOLATILE_TYPES:
        return "volatile (RAM or a container layer): lost when the job or container ends"
    if fstype in SHARED_TYPES:
        return "shared: every node sees it; checkpoints belong here (or are copied here)"
    return "local to this machine: fast, but other nodes cannot read it"


# --8<-- [end:where]


# --8<-- [start:write]
@dataclasses.dataclass(frozen=True, kw_only=True)
class WriteResult:
    files: int
    total_bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.total_bytes / self.seconds / 1e6


def write_files(directory: Path, *, total_bytes: int, files: int) -> WriteResult:
    """Write `total_bytes` as `files` files, each as a checkpoint is written: to a temporary
    name, fsync, then an atomic rename. The timer covers all of it."""
    if files < 1 or total_bytes < files:
        raise UsageError(f"need 1 <= files <= total_bytes, got {files} files of {total_bytes} B")
    directory.mkdir(parents=True, exist_ok=True)
    payload = os.urandom(total_bytes // files)  # random bytes: no compression can cheat
    start = time.perf_counter()
    for i in range(files):
        final = directory / f"shard_{i:05d}.bin"
        tmp = final.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())  # on the disk, not only in the page cache
        os.replace(tmp, final)  # atomic on POSIX file systems (and on NFS and Lustre)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # the renames themselves are durable once the directory is synced
    finally:
        os.close(fd)
    return WriteResult(
        files=files, total_bytes=files * len(payload), seconds=time.perf_counter() - start
    )


def compare(directory: Path, *, total_bytes: int = 64 * 2**20, small: int = 1024) -> list[str]:
    """One big file against `small` small files of the same total, in a scratch directory."""
    point, fstype = filesystem_type(directory.parent if not directory.exists() else directory)
    lines = [f"{directory}: on {point} ({fstype}), {advice(fstype)}"]
    try:
        for files in (1, small):
            r = write_files(directory / f"files_{files}", total_bytes=total_bytes, files=files)
            lines.append(
                f"{files:>5} file(s) of {r.total_bytes // files // 1024:>6} KiB: "
                f"{r.seconds:6.3f} s, {r.mb_per_s:7.1f} MB/s, {r.seconds / files * 1e3:7.3f} ms per file"
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # leave nothing behind
    return lines


# --8<-- [end:write]


# --8<-- [start:main]
def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dir", type=Path, default=Path("runs/storage"), help="scratch dir to test"
    )
    parser.add_argument("--mib", type=int, default=64, help="total MiB to write per variant")
    parser.add_argument("--small-files", type=int, default=1024)
    args = parser.parse_args(argv)
    if not 1 <= args.mib <= 4096 or args.small_files < 2:
        raise UsageError("use --mib 1..4096 and --small-files >= 2")
    if args.dir.exists() and any(args.dir.iterdir()):
        raise UsageError(f"{args.dir} is not empty: point --dir at a new scratch directory")
    for name, where in storage_plan(os.environ).items():
        print(f"{name}: {where or 'not set'}")
    for line in compare(args.dir, total_bytes=args.mib * 2**20, small=args.small_files):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:main]
