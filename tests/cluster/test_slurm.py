"""The course's SLURM batch files, and a real SLURM cluster on this machine.

tools/slurm/cluster.sh starts munged, slurmctld and one slurmd per simulated node (node1,
node2) in a temporary state directory on free ports. code/config/slurm_example.sbatch is
submitted twice at once: with torchrun as the per-node launcher, and with srun starting
every rank itself (tinyscale.comm.dist then maps SLURM_PROCID/SLURM_NTASKS/... to ranks).
Checked:

- both jobs COMPLETED with exit code 0 on node[1-2], every job step launched on both nodes
  (the slurmd logs), and the DDP lab finished on world size 2 (per-rank logs, summary.json);
- the two launchers train the same model: same per-rank losses within SAME_LOSS;
- the SLURM variables each task really saw, fed to dist_env, give the ranks the lab logged;
- `up` twice keeps the same daemons; `down` stops them, removes the state directory and
  the /etc/hosts line it added.

The cluster tests are skipped unless running as root on Debian with slurm-wlm and munge
installed (`make setup` installs them when run as root). The batch files' syntax and the
one-line error of `cluster.sh up` on a machine without SLURM are checked everywhere.
"""

import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import ROOT
from tinyscale.comm.dist import dist_env
from tinyscale.comm.launch import free_port

CLUSTER = ROOT / "tools" / "slurm" / "cluster.sh"
CPU_BATCH = ROOT / "code" / "config" / "slurm_example.sbatch"
GPU_BATCH = ROOT / "code" / "config" / "slurm_example_gpu.sbatch"
NODES = ("node1", "node2")
STEPS = 4
JOB_TIMEOUT_S = 150  # both jobs, run side by side; about 15 s here
SAME_LOSS = 1e-6  # same seed, data and world size: only float summation order may differ
SBIN = "/usr/sbin:/sbin"  # the daemons live here, outside a normal user's PATH
PROBE = re.compile(
    r"^(?P<task>\d+): node (?P<node>\S+) SLURM_STEP_ID=(?P<SLURM_STEP_ID>\d+) "
    r"SLURM_NODEID=(?P<SLURM_NODEID>\d+) "
    r"SLURM_PROCID=(?P<SLURM_PROCID>\d+) SLURM_LOCALID=(?P<SLURM_LOCALID>\d+) "
    r"SLURM_NTASKS=(?P<SLURM_NTASKS>\d+) SLURM_NTASKS_PER_NODE=(?P<SLURM_NTASKS_PER_NODE>\S+)$",
    re.MULTILINE,
)
RENDEZVOUS = re.compile(r"rendezvous at (?P<addr>[\w.-]+):(?P<port>\d+)")


def why_no_slurm() -> str | None:
    """Why the cluster tests cannot run here, or None."""
    path = f"{os.environ.get('PATH', '')}:{SBIN}"
    if os.geteuid() != 0:
        return "the SLURM cluster needs root (its daemons run as root)"
    if not Path("/etc/debian_version").exists():
        return "the SLURM cluster is set up with Debian's packages; this is not Debian"
    missing = [
        c for c in ("munged", "slurmctld", "slurmd", "sbatch") if not shutil.which(c, path=path)
    ]
    if missing:
        return f"missing {' '.join(missing)}: apt-get install slurm-wlm munge (make setup does, as root)"
    return None


needs_slurm = pytest.mark.skipif(why_no_slurm() is not None, reason=str(why_no_slurm()))


# ---- the batch files, everywhere -----------------------------------------------------------
def test_batch_files_parse_and_the_gpu_twin_differs_only_where_it_must() -> None:
    for path in (CPU_BATCH, GPU_BATCH):
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, f"{path.name}: {done.stderr}"
    cpu, gpu = CPU_BATCH.read_text(), GPU_BATCH.read_text()
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gres=gpu:4",
        "#SBATCH --cpus-per-task=",
        "# module load cuda",
        "export NCCL_DEBUG=INFO",
        "export NCCL_SOCKET_IFNAME=",
        "export NCCL_IB_DISABLE=",
        "NPROC_PER_NODE=4",
        "--device cuda",
        "# deepspeed --hostfile",
    ):
        assert line in gpu, f"slurm_example_gpu.sbatch lacks {line!r}"
    assert "--gres" not in cpu and "NCCL" not in cpu
    # the meeting point and the launch line are the same in both: only resources change
    for line in (
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        '--nnodes="$SLURM_JOB_NUM_NODES"',
        '--nproc-per-node="$NPROC_PER_NODE"',
        "--rdzv-backend=c10d",
        '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"',
        "code/scripts/ddp_simulation_train.py",
        # surviving a time limit: a warning, a requeue, a resume, one log
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --signal=B:USR1@",
        'scontrol requeue "$SLURM_JOB_ID"',
        "--resume auto",
        "wait $!",
        'if [ -z "${SLURM_JOB_ID:-}" ]; then',
    ):
        assert line in cpu and line in gpu, line


def test_batch_files_outside_slurm_say_sbatch(tmp_path: Path) -> None:
    """`bash slurm_example*.sbatch` is not a job: one line naming sbatch, exit 2, nothing run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for batch in (CPU_BATCH, GPU_BATCH):
        done = subprocess.run(
            ["bash", str(batch)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 2
        assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"not inside a SLURM job: submit it with sbatch {batch}")
        assert not any(tmp_path.iterdir())  # no logs, no runs, no scratch


def test_cluster_up_names_what_is_missing(tmp_path: Path) -> None:
    """Without SLURM on the PATH: one line on stderr that names the packages, nothing written."""
    bin_dir = tmp_path / "bin"  # only what the script needs before its checks
    bin_dir.mkdir()
    for tool in ("id", "nproc", "dirname"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    state = tmp_path / "state"
    env = {"PATH": str(bin_dir), "TINYSCALE_SLURM_DIR": str(state)}
    done = subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(CLUSTER), "up"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert "missing " in done.stderr and "slurmctld" in done.stderr and "munged" in done.stderr
    assert "apt-get install slurm-wlm munge" in done.stderr
    assert ("missing root" in done.stderr) == (os.geteuid() != 0)
    assert not state.exists()


# ---- the cluster -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Cluster:
    env: dict[str, str]  # SLURM_CONF, PATH with the venv and /usr/sbin, the script's settings
    state: Path
    pids: dict[str, int]  # daemon -> pid, read from the pid files right after `up`
    up_seconds: float

    def run(self, *cmd: str, timeout: float = 30, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            cmd, cwd=ROOT, env={**self.env, **env}, capture_output=True, text=True, timeout=timeout
        )


def free_port_block(n: int) -> int:
    """A port p such that p .. p+n-1 are all free now (the controller, then one per node)."""
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        try:
            for port in range(base + 1, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no block of {n} free ports found")


def read_pids(state: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text().strip()) for p in sorted((state / "pid").glob("*.pid"))}


def scontrol_job(cluster: Cluster, job: str) -> dict[str, str]:
    out = cluster.run("scontrol", "show", "job", "--oneliner", job).stdout
    return dict(re.findall(r"([\w/:]+)=(\S*)", out))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = why_no_slurm()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("slurm")
    venv_bin = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        PATH=f"{venv_bin}:{env.get('PATH', '')}:{SBIN}",
        TINYSCALE_SLURM_DIR=str(state),
        TINYSCALE_SLURM_PORT=str(free_port_block(1 + len(NODES))),
        TINYSCALE_SLURM_NODES=str(len(NODES)),
        SLURM_CONF=str(state / "etc" / "slurm.conf"),
    )
    t0 = time.monotonic()
    up = subprocess.run(
        ["bash", str(CLUSTER), "up"], env=env, capture_output=True, text=True, timeout=120
    )
    seconds = time.monotonic() - t0
    try:
        assert up.returncode == 0, f"cluster.sh up failed:\n{up.stdout}{up.stderr}"
        yield Cluster(env=env, state=state, pids=read_pids(state), up_seconds=seconds)
    finally:  # idempotent: test_down_leaves_nothing_behind has normally run it already
        subprocess.run(["bash", str(CLUSTER), "down"], env=env, capture_output=True, timeout=120)


@dataclasses.dataclass(frozen=True)
class Job:
    launcher: str
    id: str
    info: dict[str, str]  # scontrol show job, once it ended
    output: str  # the batch script's stdout and stderr
    run_dir: Path


@pytest.fixture(scope="module")
def jobs(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    """The CPU batch file, submitted twice at once: LAUNCHER=torchrun and LAUNCHER=srun."""
    out = tmp_path_factory.mktemp("jobs")
    submitted = {}
    for launcher in ("torchrun", "srun"):
        run_dir = out / f"run-{launcher}"
        done = cluster.run(
            "sbatch", "--parsable", f"--output={out}/slurm-%j.out", str(CPU_BATCH),
            "--max-steps", str(STEPS), "--log-every", "1",
            LAUNCHER=launcher, RUN_DIR=str(run_dir),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        submitted[launcher] = (done.stdout.strip().split(";")[0], run_dir)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    ended: dict[str, Job] = {}
    while len(ended) < len(submitted):
        for launcher, (job_id, run_dir) in submitted.items():
            info = scontrol_job(cluster, job_id)
            if launcher in ended or info.get("JobState") in (
                "PENDING", "CONFIGURING", "RUNNING", "COMPLETING",
            ):  # fmt: skip
                continue
            output = (out / f"slurm-{job_id}.out").read_text()
            ended[launcher] = Job(launcher, job_id, info, output, run_dir)
        if time.monotonic() > deadline:
            for job_id, _ in submitted.values():
                cluster.run("scancel", job_id)
            pytest.fail(f"jobs not done after {JOB_TIMEOUT_S} s: scancelled; logs in {out}")
        time.sleep(0.5)
    return ended


@needs_slurm
def test_cluster_is_up_and_up_again_changes_nothing(cluster: Cluster) -> None:
    sinfo = cluster.run("sinfo", "--noheader", "--Node", "--format=%N %t").stdout.split("\n")
    assert sorted(line.split() for line in sinfo if line) == [[n, "idle"] for n in NODES]
    assert set(cluster.pids) == {"munged", "slurmctld", *(f"slurmd-{n}" for n in NODES)}
    again = subprocess.run(
        ["bash", str(CLUSTER), "up"], env=cluster.env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0, again.stderr
    assert read_pids(cluster.state) == cluster.pids  # the same daemons, none started twice
    for node in NODES:  # the batch file's MASTER_ADDR is a node name: it must resolve
        assert socket.gethostbyname(node) == "127.0.0.1"


@needs_slurm
@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_batch_file_trains_on_two_nodes(
    jobs: dict[str, Job], cluster: Cluster, launcher: str
) -> None:
    job = jobs[launcher]
    assert (job.info["JobState"], job.info["ExitCode"]) == ("COMPLETED", "0:0"), job.output
    assert (job.info["NodeList"], job.info["NumNodes"]) == ("node[1-2]", "2")
    # every step of the job (mkdir, probe, train, cleanup) started a task on each node
    steps = {
        node: set(
            re.findall(
                rf"launch task StepId={job.id}\.(\d+) ",
                (cluster.state / "log" / f"slurmd-{node}.log").read_text(),
            )
        )
        for node in NODES
    }
    assert steps["node1"] == steps["node2"] and len(steps["node1"]) >= 4, steps
    # the DDP lab: world size 2, one log per rank, rank 0's summary on the job's stdout
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["steps"]) == (2, STEPS)
    assert f"summary: {STEPS} steps" in job.output and "over 2 ranks" in job.output
    name = "torchrun" if launcher == "torchrun" else "slurm"  # what tinyscale.comm.dist detected
    for rank in (0, 1):
        log = (job.run_dir / "logs" / f"rank_{rank}" / "train.log").read_text()
        assert f"rank {rank}/2 local_rank 0 | {name} | backend gloo" in log
        assert f"step {STEPS:4d}/" in log
    assert f"job {job.id}: exit code 0" in job.output  # the EXIT trap ran


@needs_slurm
def test_both_launchers_train_the_same_model(jobs: dict[str, Job]) -> None:
    a, b = (json.loads((jobs[x].run_dir / "summary.json").read_text()) for x in jobs)
    for key in ("final_loss", "heldout_loss"):
        assert abs(a[key] - b[key]) <= SAME_LOSS, (key, a[key], b[key])
    for ra, rb in zip(a["per_rank"], b["per_rank"], strict=True):
        assert abs(ra["mean_loss"] - rb["mean_loss"]) <= SAME_LOSS


@needs_slurm
def test_dist_env_reads_the_variables_the_job_saw(jobs: dict[str, Job]) -> None:
    """The probe step printed SLURM's variables on each node; dist_env must map them to the
    ranks srun's tasks then used (LAUNCHER=srun: tinyscale.comm.dist read the same variables)."""
    for job in jobs.values():
        addr, port = RENDEZVOUS.search(job.output).group("addr", "port")
        assert addr == NODES[0] and int(port) == 20000 + int(job.id) % 20000
        probes = [m.groupdict() for m in PROBE.finditer(job.output)]
        assert sorted(p["node"] for p in probes) == list(NODES), job.output
        for probe in probes:
            env = dist_env({**probe, "MASTER_ADDR": addr, "MASTER_PORT": port})
            assert env.launcher == "slurm"
            assert (env.world_size, env.local_rank, env.local_world_size) == (2, 0, 1)
            assert env.rank == int(probe["task"])  # srun's task number is the global rank
            assert env.node_rank == NODES.index(probe["node"])  # node1 -> 0, node2 -> 1
            if job.launcher == "srun":  # the lab's own log says which rank it was
                log = (job.run_dir / "logs" / f"rank_{env.rank}" / "train.log").read_text()
                assert f"rank {env.rank}/{env.world_size} local_rank {env.local_rank} |" in log


@needs_slurm
def test_down_leaves_nothing_behind(cluster: Cluster, jobs: dict[str, Job]) -> None:
    done = subprocess.run(
        ["bash", str(CLUSTER), "down"], env=cluster.env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    alive = [name for name, pid in cluster.pids.items() if Path(f"/proc/{pid}").exists()]
    assert not alive, f"still running after down: {alive}"
    assert not cluster.state.exists()
    mark = f"# tinyscale-slurm {cluster.state}"
    assert not any(line.endswith(mark) for line in Path("/etc/hosts").read_text().splitlines())
