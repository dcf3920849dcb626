"""tinyscale.comm.dist: the launcher's environment read into a DistEnv (torchrun and SLURM),
one-line errors for a broken environment, backend choice, per-rank logs, and a real
two-process gloo group joined and left through `distributed()`.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tinyscale.comm.dist import DistEnv, backend_for, device_for, dist_env, distributed, rank_logger
from tinyscale.comm.launch import free_port
from tinyscale.core.errors import UsageError

TORCHRUN = {
    "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
}  # fmt: skip
SLURM = {
    "SLURM_PROCID": "6", "SLURM_LOCALID": "2", "SLURM_NTASKS": "8",
    "SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1", "SLURM_STEP_ID": "0",
    "MASTER_ADDR": "node1", "MASTER_PORT": "29501",
}  # fmt: skip


def test_torchrun_environment() -> None:
    env = dist_env(TORCHRUN)
    assert env == DistEnv(
        rank=5, local_rank=1, world_size=8, local_world_size=4, node_rank=1,
        master_addr="10.0.0.1", master_port=29500, launcher="torchrun",
    )  # fmt: skip
    assert not env.is_main


def test_slurm_environment_maps_to_the_same_fields() -> None:
    env = dist_env(SLURM)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank) == (
        6, 2, 8, 4, 1,
    )  # fmt: skip
    assert env.launcher == "slurm"
    # global rank = node_rank * tasks_per_node + local_rank, on a regular layout
    assert env.rank == env.node_rank * env.local_world_size + env.local_rank


def test_batch_script_is_not_a_task() -> None:
    """What sbatch's shell sees (no step id): one process would wait for 7 ranks forever."""
    batch = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}
    batch.update(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_JOB_ID="42")
    with pytest.raises(
        UsageError, match=r"batch script of SLURM job 42, not by srun: launch it with `srun"
    ) as err:
        dist_env(batch)
    assert "\n" not in str(err.value)
    # a one-task job has no one to wait for: its batch shell may train alone
    assert dist_env({**batch, "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1"}).world_size == 1


def test_not_launched_names_torchrun() -> None:
    with pytest.raises(UsageError, match="torchrun --nproc_per_node") as err:
        dist_env({})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("missing", ["MASTER_ADDR", "MASTER_PORT"])
def test_missing_rendezvous_address(missing: str) -> None:
    env = {k: v for k, v in TORCHRUN.items() if k != missing}
    with pytest.raises(UsageError, match=f"{missing} not set: export MASTER_ADDR"):
        dist_env(env)


def test_inconsistent_ranks() -> None:
    with pytest.raises(UsageError, match="inconsistent ranks"):
        dist_env({**TORCHRUN, "RANK": "8"})


def test_backend_and_device() -> None:
    assert backend_for(torch.device("cpu")) == "gloo"
    assert backend_for(torch.device("cuda", 0)) == "nccl"
    env = dist_env(TORCHRUN)
    assert device_for(env, "cpu") == torch.device("cpu")
    with pytest.raises(UsageError, match="unknown device 'gpu'"):
        device_for(env, "gpu")
    if not torch.cuda.is_available():
        assert device_for(env, "auto") == torch.device("cpu")
        with pytest.raises(UsageError, match="not available"):
            device_for(env, "cuda")


def test_rank_logger_writes_one_file_per_rank(tmp_path: Path) -> None:
    for rank in (0, 1):
        env = dist_env({**TORCHRUN, "RANK": str(rank), "LOCAL_RANK": str(rank)})
        logger = rank_logger(env, tmp_path)
        logger.info("step 1 | loss 2.5")
        for handler in logger.handlers:
            handler.flush()
    for rank in (0, 1):
        text = (tmp_path / f"rank_{rank}" / "train.log").read_text()
        assert f"rank {rank}/8 local_rank {rank} | step 1 | loss 2.5" in text


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    with distributed("cpu", timeout_s=30) as (env, device):
        t = torch.tensor([float(env.rank + 1)])
        dist.all_reduce(t)
        Path(out, f"{rank}.txt").write_text(f"{dist.get_backend()} {t.item()} {device}")
    Path(out, f"{rank}.left").write_text(str(dist.is_initialized()))


@pytest.mark.timeout(120)
def test_two_processes_join_reduce_and_leave(tmp_path: Path) -> None:
    mp.start_processes(_worker, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in (0, 1):
        assert (tmp_path / f"{rank}.txt").read_text() == "gloo 3.0 cpu"
        assert (tmp_path / f"{rank}.left").read_text() == "False"  # the group was destroyed


def test_exit_without_teardown_flushes_and_exits_with_the_code(tmp_path: Path) -> None:
    program = (
        "import logging; from tinyscale.comm.dist import exit_without_teardown\n"
        f"logging.basicConfig(filename={str(tmp_path / 'run.log')!r})\n"
        "logging.getLogger().warning('logged'); print('printed', end='')\n"
        "exit_without_teardown(3)\n"
        "print('never')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert (done.returncode, done.stdout) == (3, "printed")
    assert "logged" in (tmp_path / "run.log").read_text()
