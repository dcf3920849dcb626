"""tinyscale.ops.nccl_env: every name in the table is one the shipped libraries really read, and
the known-bad combinations are flagged (and a clean environment is not)."""

import mmap
from pathlib import Path

import pytest
import torch

from tinyscale.core.errors import run_cli
from tinyscale.ops.nccl_env import RENAMED, VARS, describe, main, warnings_for

TORCH_LIB = Path(torch.__file__).parent / "lib"
NCCL_LIB = TORCH_LIB.parent.parent / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
LIBS = [NCCL_LIB, *(TORCH_LIB / n for n in ("libtorch_cpu.so", "libtorch_cuda.so", "libc10.so"))]


@pytest.mark.skipif(not NCCL_LIB.is_file(), reason="a CPU-only torch ships no libnccl")
def test_every_name_is_read_by_a_shipped_library() -> None:
    """The name, NUL-terminated, as a C string constant in libnccl or libtorch/libc10."""
    wanted = {v.name for v in VARS} | set(RENAMED) - {"NCCL_TRACE_BUFFER_SIZE"}
    found = set()
    for lib in (p for p in LIBS if p.is_file()):
        with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            found |= {n for n in wanted - found if m.find(n.encode() + b"\0") != -1}
    assert wanted - found == set()
    # and the one NCCL does not read: there is no NCCL_TIMEOUT
    with open(NCCL_LIB, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert m.find(b"NCCL_TIMEOUT\0") == -1


def test_a_clean_environment_has_no_warnings() -> None:
    assert warnings_for({}) == []
    assert describe({"PATH": "/bin"}) == [
        "no NCCL, torch-distributed or gloo variable is set: the defaults apply"
    ]
    ok = {
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_DEBUG": "INFO",
        "WORLD_SIZE": "16",
        "LOCAL_WORLD_SIZE": "8",
    }
    assert warnings_for(ok) == []


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"NCCL_ASYNC_ERROR_HANDLING": "1"},
            "old name: torch reads TORCH_NCCL_ASYNC_ERROR_HANDLING",
        ),
        ({"NCCL_TIMEOUT": "600"}, "NCCL_TIMEOUT does nothing"),
        ({"NCCL_IB_DISABLE": "1", "NCCL_IB_HCA": "mlx5"}, "NCCL_IB_HCA is ignored"),
        ({"NCCL_P2P_DISABLE": "1"}, "turns NVLink off"),
        ({"NCCL_ALGO": "Tree"}, "NCCL_ALGO=Tree overrides"),
        ({"NCCL_SOCKET_IFNAME": "lo", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, "is loopback"),
        ({"NCCL_DEBUG": "trace"}, "logs every call"),
    ],
)
def test_known_bad_combinations_are_flagged(env: dict[str, str], expected: str) -> None:
    (warning,) = warnings_for(env)
    assert expected in warning


def test_loopback_is_fine_on_one_node() -> None:
    assert (
        warnings_for({"GLOO_SOCKET_IFNAME": "lo", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}) == []
    )


def test_cli_prints_what_is_set(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("NCCL_TIMEOUT", "60")
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "NCCL_DEBUG=INFO  (log level" in out
    assert "warning: NCCL_TIMEOUT does nothing" in out
    assert run_cli(main, ["--bogus"]) == 2


# The NCCL_DEBUG=INFO line formats docs/operations/nccl-network.md quotes (no GPU here to
# print real lines): each must be a string constant of the libnccl torch ships.
LOG_FORMATS = [
    "NCCL version 2.30.7+cuda13.3",
    "Bootstrap: Using %s:%d",
    "NCCL_SOCKET_IFNAME set by environment to %s",
    "NET/IB : Using%s %s; OOB %s:%s",
    "Using network %s",
    "comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL %d",
    "Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/IPC%s%s",
    "Channel %02d : %d[%d] -> %d[%d] via SHM/direct",
    "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s",
    "Connected all rings, use ring PXN %d GDR %d",
    "Connected all trees",
    "[%d] NCCL INFO %s\n",
]


@pytest.mark.skipif(not NCCL_LIB.is_file(), reason="a CPU-only torch ships no libnccl")
def test_the_log_lines_the_page_quotes_are_in_libnccl(root: Path) -> None:
    page = (root / "docs" / "operations" / "nccl-network.md").read_text()
    with open(NCCL_LIB, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        missing = [s for s in LOG_FORMATS if m.find(b"\0" + s.encode() + b"\0") == -1]
    assert missing == []
    assert all(s in page for s in LOG_FORMATS if not s.startswith("[%d]"))
