"""tinyscale.ops.agents: a launcher's agents found with every process they started (Lab 3's
launcher stops them; tests/scripts/test_fake_multi_node_launcher.py runs it end to end)."""

import os
import subprocess
import sys
from pathlib import Path

from tinyscale.ops import agents


def test_the_process_table_without_proc_is_the_one_ps_gives(tmp_path: Path) -> None:
    """macOS has no /proc: agents asks ps, and finds the same parents."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        from_proc = agents.process_table()
        from_ps = agents.process_table(tmp_path / "no-proc")
        assert from_ps[os.getpid()][0] == from_proc[os.getpid()][0] == os.getppid()
        assert from_ps[child.pid][0] == os.getpid()
        assert child.pid in [pid for pid, _ in agents.descendants(os.getpid())]
    finally:
        child.kill()
        child.wait()
