# --8<-- [start:header]
"""What each Accelerate process logs: its own file, and fingerprints of its data and weights.

Launch:  accelerate launch --multi_gpu --num_processes 2 code/scripts/accelerate_train.py --cpu

Every process writes <log_dir>/rank_<N>/train.log and only the main one prints, through
tqdm so that a line never lands inside the progress bar. Two fingerprints make the
data-parallel contract visible in the log: the blocks each process trained on in a step
(different per process) and its weights after training (bit-identical on every one).
"""
# --8<-- [end:header]

import hashlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.logging import MultiProcessAdapter, get_logger
from tqdm import tqdm

from tinyscale.comm.dist import fresh_logger


# --8<-- [start:logging]
class TqdmHandler(logging.Handler):
    """Print through tqdm, so that a line appears above the progress bar, not inside it."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stdout)


def process_logger(accelerator: Accelerator, log_dir: str | Path) -> MultiProcessAdapter:
    """Every process writes <log_dir>/rank_<N>/train.log; only the main process prints.

    Accelerate's adapter logs on the main process only, unless told `main_process_only=False`,
    and starts every message with the process's rank: `[RANK 1] ...`. DEBUG lines (every
    process's own shard, every step) go to the files only; INFO lines also to the console.
    """
    rank = accelerator.process_index
    path = Path(log_dir) / f"rank_{rank}" / "train.log"
    base = fresh_logger(f"tinyscale.accelerate.rank{rank}", path, logging.DEBUG)
    to_file = logging.FileHandler(path, mode="w")
    to_file.setFormatter(logging.Formatter("%(asctime)s | %(message)s"))  # + "[RANK r] "
    base.addHandler(to_file)
    if accelerator.is_main_process:
        console = TqdmHandler()  # the message alone, as Lab 1 prints
        console.setLevel(logging.INFO)
        base.addHandler(console)
    return get_logger(base.name)


def blocks_digest(batches: Sequence[torch.Tensor]) -> str:
    """A fingerprint of the token blocks one process trained on in one step."""
    sha = hashlib.sha1()
    for x in batches:
        sha.update(x.detach().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()[:8]


def param_digest(model: torch.nn.Module) -> str:
    """A fingerprint of every weight: equal digests, bit-identical models."""
    sha = hashlib.sha1()
    for name, tensor in model.state_dict().items():
        sha.update(name.encode())
        sha.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()[:12]


# --8<-- [end:logging]
