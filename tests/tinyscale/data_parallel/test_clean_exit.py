"""A learner's own script that uses the course's DDP exits cleanly, teardown included.

A finished two-process job once died in the interpreter's teardown ("terminate called
without an active exception", SIGABRT) when gloo work objects still held tensors as
torch's C++ state was destroyed. The course's classes drop every work handle once it is
waited on (OverlappedDDP, BucketedDDP, the ZeRO and FSDP classes, the pipeline's link),
so a plain script, with no `os._exit`, ends with exit code 0. This runs the case that
crashed (one bucket per tensor, a tied embedding) as JOBS two-process jobs at once, each
process ending through the normal interpreter teardown, and checks every exit.

A passing run is evidence, not proof: the crash was rare (about one run in 20). Lab 2's
script keeps `comm.dist.exit_without_teardown`, and its page says why.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tinyscale.comm.launch import free_port

JOBS = 4  # two processes each: eight interpreters torn down per run of this test
SCRIPT = """
from datetime import timedelta

import torch
import torch.distributed as dist

from tinyscale.core.config import preset
from tinyscale.core.model import TinyTransformer
from tinyscale.data_parallel.ddp_buckets import OverlappedDDP

dist.init_process_group("gloo", timeout=timedelta(seconds=30))
torch.manual_seed(0)
model = TinyTransformer(preset("tiny"))  # the embedding and the head are one tensor
ddp = OverlappedDDP(model, bucket_cap_mb=1e-6)  # one bucket per tensor
x = torch.randint(0, 260, (2, 16))
for _ in range(3):
    ddp(x, x)[1].backward()
    ddp.finish_gradient_synchronization()
    model.zero_grad()
dist.destroy_process_group()
print("done", flush=True)
"""


def test_scripts_that_use_our_ddp_exit_with_code_0() -> None:
    procs = []
    for _ in range(JOBS):
        port = str(free_port())
        for rank in range(2):
            env = os.environ | {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                "MASTER_PORT": port}  # fmt: skip
            procs.append(subprocess.Popen([sys.executable, "-c", SCRIPT], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    ended = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    for code, out, err in ended:
        assert (code, out.decode().strip()) == (0, "done"), err.decode()[-2000:]
        assert b"terminate called" not in err
