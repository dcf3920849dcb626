# --8<-- [start:load]
"""Check a Kubeflow PyTorchJob manifest without a cluster: the fields that must agree.

Try it:  python -m tinyscale.ops.k8s_check code/config/k8s/pytorchjob.yaml

Kubernetes validates each field on its own; what it cannot see is that torchrun's
--nproc-per-node, the GPUs the pod asks for and the operator's nprocPerNode must be the same
number, that the checkpoints land on a volume that outlives the pod, or that the training
script accepts the flags it is given. Exit codes: 0 all checks pass, 1 a check failed,
2 the file is not a PyTorchJob.
"""

import argparse
import dataclasses
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tinyscale.core.errors import ArgumentParser, UsageError, run_cli


@dataclasses.dataclass(frozen=True)
class Finding:
    ok: bool
    message: str


def load_manifest(path: str | Path) -> dict[str, Any]:
    """The PyTorchJob in a YAML file, or a one-line UsageError that says what is wrong."""
    try:
        import yaml  # PyYAML: installed with the docs tools (mkdocs needs it)
    except ImportError:
        raise UsageError("PyYAML is missing: pip install pyyaml") from None
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise UsageError(f"{path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "PyTorchJob":
        raise UsageError(f"{path} is not a PyTorchJob (kind: PyTorchJob, kubeflow.org/v1)")
    if doc.get("apiVersion") != "kubeflow.org/v1":
        raise UsageError(f"{path}: apiVersion must be kubeflow.org/v1, got {doc.get('apiVersion')}")
    return doc


def flag(args: Sequence[str], name: str) -> str | None:
    """The value of `--name=value` or `--name value` (also `--name_with_underscores`)."""
    names = {name, name.replace("-", "_")}
    for i, arg in enumerate(args):
        key, _, value = arg.partition("=")
        if key in names:
            return value if value or "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
    return None


# --8<-- [end:load]


# --8<-- [start:pod]
def check_pod(job: dict[str, Any]) -> tuple[list[Finding], dict[str, Any]]:
    """Replica types, the 'pytorch' container, GPUs, /dev/shm. Returns the container too."""
    spec = job.get("spec", {})
    replicas = spec.get("pytorchReplicaSpecs") or {}
    found: list[Finding] = []
    name = job.get("metadata", {}).get("name", "")
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
        found.append(Finding(False, f"name {name!r}: lower case, digits and '-', at most 63"))
    if set(replicas) - {"Master", "Worker"} or "Worker" not in replicas:
        found.append(Finding(False, f"replica types {sorted(replicas)}: use Worker (and Master)"))
        return found, {}
    pod = replicas["Worker"].get("template", {}).get("spec", {})
    containers = {c.get("name"): c for c in pod.get("containers", [])}
    if "pytorch" not in containers:
        found.append(Finding(False, "no container named 'pytorch': the operator needs that name"))
        return found, {}
    c = containers["pytorch"]
    image = c.get("image", "")
    pinned = ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest")
    found.append(
        Finding(
            pinned,
            f"container 'pytorch' runs {image or '(no image)'}"
            + ("" if pinned else ": pin a tag, never :latest"),
        )
    )
    limits = c.get("resources", {}).get("limits", {})
    requests = c.get("resources", {}).get("requests", {})
    gpus = limits.get("nvidia.com/gpu")
    if not isinstance(gpus, int) or gpus < 1:
        found.append(Finding(False, "resources.limits has no nvidia.com/gpu: the pod gets no GPU"))
    elif requests.get("nvidia.com/gpu", gpus) != gpus:
        found.append(Finding(False, "nvidia.com/gpu: requests and limits must be equal"))
    volumes = {v.get("name"): v for v in pod.get("volumes", [])}
    mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts", [])}
    shm = volumes.get(mounts.get("/dev/shm"), {}).get("emptyDir", {})
    found.append(
        Finding(True, f"/dev/shm is a memory-backed emptyDir ({shm.get('sizeLimit', 'no limit')})")
        if shm.get("medium") == "Memory"
        else Finding(False, "/dev/shm is the container's 64 MiB: mount an emptyDir, medium Memory")
    )
    return found, {"container": c, "gpus": gpus, "volumes": volumes, "mounts": mounts}


# --8<-- [end:pod]


# --8<-- [start:launch]
def check_launch(job: dict[str, Any], pod: dict[str, Any], repo_root: Path) -> list[Finding]:
    """torchrun, the elastic policy, the script and its flags, and where checkpoints go."""
    spec, c = job["spec"], pod["container"]
    command = [str(x) for x in c.get("command", []) + c.get("args", [])]
    if not command or Path(command[0]).name != "torchrun":
        return [Finding(False, "the command must start with torchrun (it reads PET_* variables)")]
    scripts = [i for i, a in enumerate(command) if a.endswith(".py")]
    if not scripts:
        return [Finding(False, "no training script (*.py) in the command")]
    launcher, script, script_args = (
        command[: scripts[0]],
        command[scripts[0]],
        command[scripts[0] + 1 :],
    )
    found = []
    nproc = flag(launcher, "--nproc-per-node")
    declared = [str(spec.get("nprocPerNode", nproc)), nproc, str(pod["gpus"])]
    found.append(
        Finding(
            len(set(declared)) == 1,
            f"processes per pod: nprocPerNode {declared[0]}, torchrun --nproc-per-node "
            f"{declared[1]}, nvidia.com/gpu {declared[2]}: "
            + ("one GPU per process" if len(set(declared)) == 1 else "these must be equal"),
        )
    )
    elastic = spec.get("elasticPolicy") or {}
    replicas = spec["pytorchReplicaSpecs"]["Worker"].get("replicas", 1)
    lo, hi = elastic.get("minReplicas", replicas), elastic.get("maxReplicas", replicas)
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    port = elastic.get("rdzvPort", ports.get("pytorchjob-port"))
    good = (
        elastic.get("rdzvBackend", "c10d") == "c10d"
        and lo <= replicas <= hi
        and "Master" not in spec["pytorchReplicaSpecs"]
        and port == ports.get("pytorchjob-port", port)
    )
    found.append(
        Finding(
            good,
            f"elastic: {elastic.get('rdzvBackend', 'c10d')} rendezvous at "
            f"{job['metadata']['name']}-worker-0:{port}, {lo}..{hi} pods (now {replicas}), "
            f"up to {elastic.get('maxRestarts', 0)} restarts"
            + (
                ""
                if good
                else ": use c10d, Worker replicas only, min <= replicas <= max, "
                "rdzvPort = the pytorchjob-port container port"
            ),
        )
    )
    found += check_script(
        repo_root / script,
        script_args,
        world_sizes=[n * int(nproc or 1) for n in range(lo, hi + 1)],
    )
    out = flag(script_args, "--output-dir")
    mount = max(
        (m for m in pod["mounts"] if out and (out + "/").startswith(m.rstrip("/") + "/")),
        key=len,
        default=None,
    )
    claim = pod["volumes"].get(pod["mounts"].get(mount), {}).get("persistentVolumeClaim", {})
    found.append(
        Finding(True, f"checkpoints: --output-dir {out} is on PVC {claim['claimName']}")
        if claim
        else Finding(
            False, f"--output-dir {out} is not on a PersistentVolumeClaim: lost with the pod"
        )
    )
    if lo < hi and flag(script_args, "--resume") is not None:
        found.append(
            Finding(
                False,
                "--resume with minReplicas < maxReplicas: a checkpoint saved "
                "by N ranks is refused by another world size; make min = max",
            )
        )
    return found


# --8<-- [end:launch]


# --8<-- [start:script]
def check_script(path: Path, args: list[str], *, world_sizes: list[int]) -> list[Finding]:
    """The script exists, its own argument parser accepts the flags, batches divide evenly."""
    if not path.is_file():
        return [Finding(False, f"{path} does not exist in this repository (the image copies it)")]
    spec = importlib.util.spec_from_file_location(f"_checked_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines parse_args; the training runs only under __main__
    try:
        parsed = module.parse_args(args)
    except (UsageError, SystemExit) as err:
        return [Finding(False, f"{path.name} rejects its flags: {err}")]
    found = [
        Finding(
            parsed.device == "cuda",
            f"{path.name} accepts its {len(args)} flags, "
            f"--device {parsed.device}" + ("" if parsed.device == "cuda" else ": use cuda"),
        )
    ]
    per_step = [w * parsed.grad_accum_steps for w in world_sizes]
    bad = [w for w, n in zip(world_sizes, per_step, strict=True) if parsed.global_batch_size % n]
    found.append(
        Finding(
            not bad,
            f"global batch {parsed.global_batch_size} divides by every world size "
            f"{world_sizes} x {parsed.grad_accum_steps} accumulation step(s)"
            if not bad
            else f"global batch {parsed.global_batch_size} does not divide by world size {bad}",
        )
    )
    return found


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("manifest", help="a PyTorchJob YAML file")
    p.add_argument("--repo-root", default=".", help="where the image's code comes from")
    args = p.parse_args(argv)
    job = load_manifest(args.manifest)
    found, pod = check_pod(job)
    if pod:
        found += check_launch(job, pod, Path(args.repo_root))
    print(f"{args.manifest}: PyTorchJob {job.get('metadata', {}).get('name')}")
    for f in found:
        print(f"{'ok  ' if f.ok else 'FAIL'} {f.message}")
    failed = sum(not f.ok for f in found)
    print(f"{len(found)} checks, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
# --8<-- [end:script]
