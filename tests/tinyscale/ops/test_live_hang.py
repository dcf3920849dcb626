"""tinyscale.ops.live_hang: py-spy reads where a rank blocked in a collective waits, and the
demo ends by itself once the other rank comes. (docs/workflows/profiling.md runs the
command line, and its SIGTERM.)"""

import subprocess
import threading
import time

import pytest

from helpers import TIMEOUTS
from tinyscale.comm.launch import run_on_ranks
from tinyscale.core.errors import run_cli
from tinyscale.ops.live_hang import blocked_rank, main


def test_py_spy_dump_shows_where_a_blocked_rank_waits(tmp_path) -> None:
    """Rank 0 waits in an all-reduce for 4 s while rank 1 sleeps; py-spy reads its stack."""
    pid_file, ranks = tmp_path / "blocked.pid", []
    launcher = threading.Thread(target=lambda: ranks.extend(
        run_on_ranks(blocked_rank, 2, str(pid_file), 4.0, **TIMEOUTS)))  # fmt: skip
    launcher.start()
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline and launcher.is_alive():
        time.sleep(0.1)
    time.sleep(1)  # from writing the pid file into the all-reduce
    dump = subprocess.run(["py-spy", "dump", "--pid", pid_file.read_text()],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    launcher.join(timeout=60)
    assert ranks == [None, None]  # rank 1 came: both finished, nothing left running
    if dump.returncode and ("ermission" in dump.stderr or "not permitted" in dump.stderr):
        pytest.skip("py-spy needs ptrace: root, or CAP_SYS_PTRACE / ptrace_scope=0")
    assert dump.returncode == 0, dump.stderr
    frames = [line.split()[0] for line in dump.stdout.splitlines() if line.startswith(" ")]
    assert frames[0] == "all_reduce" and "blocked_rank" in frames, dump.stdout


@pytest.mark.parametrize("seconds", ["0", "601"])
def test_bad_input_is_one_line(seconds, tmp_path, capsys) -> None:
    pid_file = tmp_path / "blocked.pid"
    assert run_cli(main, ["--seconds", seconds, "--pid-file", str(pid_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--seconds" in err, err
    assert not pid_file.parent.joinpath("blocked.pid").exists()  # checked before any work
