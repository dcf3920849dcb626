"""tinyscale.ops.storage: mount lookup, the scheduler's directories, and the write test (files
complete, renamed, nothing temporary left). Throughputs are shown, never asserted."""

from pathlib import Path

import pytest

from tinyscale.core.errors import UsageError, run_cli
from tinyscale.ops.storage import (
    advice,
    compare,
    filesystem_type,
    main,
    storage_plan,
    write_files,
)

MOUNTS = """/dev/vda / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw 0 0
10.0.0.5:/export/home /home nfs4 rw 0 0
lustre@o2ib:/scratch /scratch lustre rw 0 0
/dev/nvme0n1 /scratch/local ext4 rw 0 0
/dev/sdb /mnt/my\\040disk xfs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/home/ada/ckpt", ("/home", "nfs4")),
        ("/scratch/run1", ("/scratch", "lustre")),
        ("/scratch/local/run1", ("/scratch/local", "ext4")),  # the longest mount point wins
        ("/scratchy", ("/", "ext4")),  # a prefix of the name is not a parent directory
        ("/tmp/x", ("/tmp", "tmpfs")),
        ("/mnt/my disk/x", ("/mnt/my disk", "xfs")),
    ],
)
def test_filesystem_type_is_the_longest_matching_mount(
    path: str, expected: tuple[str, str]
) -> None:
    assert filesystem_type(path, MOUNTS) == expected


def test_this_machine_has_a_root_mount() -> None:
    point, fstype = filesystem_type(".")
    assert Path(point).is_dir() and fstype != "unknown"


def test_advice_by_kind() -> None:
    assert advice("lustre").startswith("shared")
    assert advice("tmpfs").startswith("volatile")
    assert advice("ext4").startswith("local")


def test_storage_plan_reads_only_what_is_set() -> None:
    assert storage_plan({}) == {"node_local": None, "shared": None}
    env = {"SLURM_TMPDIR": "/local/job42", "TMPDIR": "/tmp", "SCRATCH": "/scratch/ada"}
    assert storage_plan(env) == {"node_local": "/local/job42", "shared": "/scratch/ada"}


def test_write_files_leaves_complete_files_and_no_temporaries(tmp_path: Path) -> None:
    r = write_files(tmp_path / "w", total_bytes=10_000, files=4)
    written = sorted((tmp_path / "w").iterdir())
    assert [p.name for p in written] == [f"shard_{i:05d}.bin" for i in range(4)]
    assert [p.stat().st_size for p in written] == [2500] * 4
    assert r.total_bytes == 10_000 and r.files == 4 and r.mb_per_s > 0


def test_compare_cleans_up(tmp_path: Path) -> None:
    lines = compare(tmp_path / "c", total_bytes=2**16, small=8)
    assert len(lines) == 3 and "file(s) of" in lines[2]
    assert not (tmp_path / "c").exists()


def test_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="files <= total_bytes"):
        write_files(tmp_path, total_bytes=3, files=4)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    assert run_cli(main, ["--dir", str(tmp_path / "busy")]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"  # never deleted
