"""code/config/k8s/pytorchjob.yaml: the fields that matter, read with PyYAML; and
tinyscale.ops.k8s_check, which must pass the course's manifest and fail each broken copy of it.
"""

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import load_script
from tinyscale.core.errors import UsageError, run_cli
from tinyscale.ops.k8s_check import flag, main

MANIFEST = Path("code/config/k8s/pytorchjob.yaml")


@pytest.fixture(scope="module")
def job(root: Path) -> dict[str, Any]:
    return yaml.safe_load((root / MANIFEST).read_text())


def container(doc: dict[str, Any]) -> dict[str, Any]:
    [c] = doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    return c


def test_the_fields_that_matter(job: dict[str, Any], root: Path) -> None:
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    spec = job["spec"]
    assert list(spec["pytorchReplicaSpecs"]) == ["Worker"]  # elastic: workers only
    elastic = spec["elasticPolicy"]
    assert elastic["rdzvBackend"] == "c10d" and elastic["maxRestarts"] >= 1
    replicas = spec["pytorchReplicaSpecs"]["Worker"]["replicas"]
    assert elastic["minReplicas"] <= replicas <= elastic["maxReplicas"]
    c = container(job)
    assert c["name"] == "pytorch"
    command = c["command"]
    assert command[0] == "torchrun"
    gpus = c["resources"]["limits"]["nvidia.com/gpu"]
    assert int(spec["nprocPerNode"]) == int(flag(command, "--nproc-per-node")) == gpus == 4
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["pytorchjob-port"] == elastic["rdzvPort"]
    volumes = {
        v["name"]: v
        for v in job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"]
    }
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "persistentVolumeClaim" in volumes[mounts["/mnt/checkpoints"]]
    assert flag(command, "--output-dir").startswith("/mnt/checkpoints/")
    # The image is the one the Dockerfile builds: same CUDA build in the tag and the index.
    dockerfile = (root / "code/config/containers/Dockerfile").read_text()
    index = re.search(r"ARG TORCH_INDEX=\S+/whl/(cu\d+)", dockerfile)
    assert index and c["image"].endswith(f"tinyscale:{index.group(1)}")


def test_the_script_accepts_the_manifest_flags(job: dict[str, Any]) -> None:
    command = container(job)["command"]
    script_at = next(i for i, a in enumerate(command) if a.endswith(".py"))
    assert command[script_at] == "code/scripts/ddp_simulation_train.py"
    args = load_script("ddp_simulation_train").parse_args(command[script_at + 1 :])
    assert (args.device, args.precision, args.resume) == ("cuda", "bf16", "auto")
    world = job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] * 4
    assert args.global_batch_size % (world * args.grad_accum_steps) == 0


def test_checker_passes_the_course_manifest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(MANIFEST)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("7 checks, 0 failed")


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = container(doc) if key == "<pytorch>" else node[key]
        node[last] = value

    return edit


def _command(old: str, new: str) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        c = container(doc)
        c["command"] = [new if a == old else a for a in c["command"]]

    return edit


def _no_shm(doc: dict[str, Any]) -> None:
    c = container(doc)
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != "/dev/shm"]


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (_set("<pytorch>.resources", {"limits": {"nvidia.com/gpu": 2}}), "these must be equal"),
        (_set("<pytorch>.resources", {"limits": {}}), "no nvidia.com/gpu"),
        (_set("<pytorch>.image", "tinyscale:latest"), "never :latest"),
        (_set("<pytorch>.name", "trainer"), "no container named 'pytorch'"),
        (_no_shm, "/dev/shm is the container's 64 MiB"),
        (_command("--output-dir=/mnt/checkpoints/tinyscale-ddp", "--output-dir=/tmp/x"), "lost"),
        (_command("--device=cuda", "--device=cpu"), "--device cpu: use cuda"),
        (_command("--precision=bf16", "--precision=fp8"), "rejects its flags"),
        (_command("torchrun", "python"), "must start with torchrun"),
        (_set("spec.elasticPolicy.maxReplicas", 4), "refused by another world size"),
        (_set("spec.elasticPolicy.minReplicas", 3), "min <= replicas <= max"),
        (_set("spec.elasticPolicy.rdzvPort", 23456), "rdzvPort = the pytorchjob-port"),
        (_set("metadata.name", "Tinyscale_DDP"), "lower case"),
    ],
)
def test_checker_fails_each_broken_copy(
    job: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: Callable[[dict[str, Any]], None],
    says: str,
) -> None:
    broken = copy.deepcopy(job)
    edit(broken)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(broken))
    assert main([str(path)]) == 1
    out = capsys.readouterr().out
    assert says in "\n".join(line for line in out.splitlines() if line.startswith("FAIL")), out


def test_global_batch_must_divide_every_world_size(
    job: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = copy.deepcopy(job)
    broken["spec"]["elasticPolicy"].update(minReplicas=3, maxReplicas=3)
    broken["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 3  # 12 ranks: 32 % 12 != 0
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(broken))
    assert main([str(path)]) == 1
    assert "global batch 32 does not divide by world size [12]" in capsys.readouterr().out


def test_bad_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yaml").write_text("kind: [unclosed\n")
    (tmp_path / "deploy.yaml").write_text("apiVersion: apps/v1\nkind: Deployment\n")
    for name, says in [
        ("missing.yaml", "cannot read"),
        ("bad.yaml", "is not valid YAML"),
        ("deploy.yaml", "is not a PyTorchJob"),
    ]:
        with pytest.raises(UsageError, match=says):
            main([str(tmp_path / name)])
    assert run_cli(main, [str(tmp_path / "deploy.yaml")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
