"""Record the 4-rank comparison of our ZeRO with DeepSpeed's that "DeepSpeed's ZeRO vs ours"
shows (CI runs the 2-rank one on the page itself).

Run:  python tools/figures_week2_deepspeed.py   (about 30 s on 2 CPU cores; part of `make figures`)

Writes docs/generated/week2/deepspeed_zero_n4.txt: the first lines of
``python -m tinyscale.compat.zero_vs_deepspeed --world-size 4`` (rank 0's losses and the
largest weight difference per stage). tests/tinyscale/compat/test_zero_vs_deepspeed.py
reads it and checks it against the 2-rank run and the tolerance of the ZeRO lesson.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated" / "week2"
COMMAND = [sys.executable, "-m", "tinyscale.compat.zero_vs_deepspeed", "--world-size", "4"]
LINES = 5  # the title, the column heads and one row per stage


def main() -> int:
    done = subprocess.run(COMMAND, cwd=ROOT, capture_output=True, text=True, check=True)
    OUT.mkdir(parents=True, exist_ok=True)
    table = "\n".join(done.stdout.splitlines()[:LINES]) + "\n"
    (OUT / "deepspeed_zero_n4.txt").write_text(table)
    print(f"wrote {(OUT / 'deepspeed_zero_n4.txt').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
