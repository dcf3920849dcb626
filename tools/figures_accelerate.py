"""Record the output of the Accelerate page's full run: docs/generated/accelerate/.

Run:  python tools/figures_accelerate.py      (about 30 s on a 2-core CPU)

The run is the page's command with the defaults (2 epochs, global batch 16), launched as the
reader launches it: `accelerate launch` with code/config/accelerate_cpu.yaml, 2 CPU processes.
Tokens/s depend on the machine; the losses are seeded, and repeat bit for bit when the kernels
do: like `make`, this pins torch's, MKL's and oneDNN's kernels to AVX2 on x86 and gives each
process one thread (unpinned, an AVX-512 CPU prints other last digits).
tests/scripts/test_accelerate_train.py checks that the recording agrees with its own metrics
and with what the page says of it.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / "docs" / "generated" / "accelerate"
RUN = ROOT / "runs" / "figures" / "accelerate"
CONFIG = "code/config/accelerate_cpu.yaml"
SCRIPT = "code/scripts/accelerate_train.py"
# The Makefile's kernel choice (tests/docs/test_pinned_kernels.py), for a run outside `make`.
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def accelerate_cli() -> str:
    beside = Path(sys.executable).with_name("accelerate")
    return str(beside) if beside.is_file() else "accelerate"


def main() -> None:
    if RUN.exists():
        shutil.rmtree(RUN)
    cmd = [accelerate_cli(), "launch", "--config_file", CONFIG, SCRIPT, "--cpu", "--no-progress"]
    cmd += ["--output-dir", str(RUN / "run"), "--log-dir", str(RUN / "logs")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if platform.machine() == "x86_64":
        env = {**PINNED, **env}  # a value already set (by `make`) wins
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    # The page's command writes to runs/accelerate; show the paths the reader will see.
    stdout = done.stdout.replace(str(RUN / "run"), "runs/accelerate")
    DEST.mkdir(parents=True, exist_ok=True)
    (DEST / "train.txt").write_text(stdout)
    shutil.copy(RUN / "run" / "metrics.jsonl", DEST / "metrics.jsonl")
    print(f"wrote {DEST.relative_to(ROOT)}/train.txt and metrics.jsonl")


if __name__ == "__main__":
    main()
