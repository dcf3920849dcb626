"""code/config/containers/: the Dockerfile and the Apptainer definition, read as text (the course
builds neither: no Docker daemon, no GPU). Base image pinned, torch pinned to the version the
Makefile installs, the package installed, not root, a default command that exists, every
copied path present in the repository, and the two files and the k8s manifest in agreement.
"""

import re
import shlex
from pathlib import Path

import pytest
import yaml

DOCKERFILE = Path("code/config/containers/Dockerfile")
APPTAINER = Path("code/config/containers/tinyscale.def")


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, backslash continuations joined."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\s*\\\n\s*", " ", "\n".join(lines))  # comments go first, as Docker does
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def apptainer_sections(text: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The header (Bootstrap:, From:) and the %sections of a definition file."""
    header: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("%"):
            current = line[1:].split()[0]
            sections[current] = []
        elif current is not None:
            if line.strip() and not line.strip().startswith("#"):
                sections[current].append(line.strip())
        elif ":" in line and not line.startswith("#"):
            key, _, value = line.partition(":")
            header[key.strip()] = value.strip()
    return header, sections


@pytest.fixture(scope="module")
def docker(root: Path) -> list[tuple[str, str]]:
    return dockerfile_instructions((root / DOCKERFILE).read_text())


def torch_pin(root: Path) -> str:
    m = re.search(r"^TORCH_VERSION \?= (\S+)", (root / "Makefile").read_text(), re.M)
    assert m, "the Makefile no longer pins TORCH_VERSION"
    return m.group(1)


def test_parser_self_check() -> None:
    text = 'FROM a:1 AS b\n# note\nRUN x \\\n    # inner comment\n    && y\nCMD ["z"]\n'
    assert dockerfile_instructions(text) == [
        ("FROM", "a:1 AS b"),
        ("RUN", "x && y"),
        ("CMD", '["z"]'),
    ]
    header, sections = apptainer_sections("Bootstrap: docker\nFrom: a:1\n%post\n  echo hi\n")
    assert header == {"Bootstrap": "docker", "From": "a:1"} and sections == {"post": ["echo hi"]}


def test_dockerfile(docker: list[tuple[str, str]], root: Path) -> None:
    froms = [args for op, args in docker if op == "FROM"]
    assert len(froms) == 1
    image, _, tag = froms[0].partition(":")
    assert image == "nvidia/cuda" and re.fullmatch(r"\d+\.\d+\.\d+-\w+-ubuntu\d+\.\d+", tag)
    args = dict(a.split("=", 1) for op, a in docker if op == "ARG")
    assert args["TORCH_VERSION"] == torch_pin(root)
    assert args["TORCH_INDEX"].endswith("/whl/cu" + tag.split(".")[0] + tag.split(".")[1])
    runs = " ; ".join(a for op, a in docker if op == "RUN")
    assert '"torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"' in runs
    assert "pip install --no-cache-dir -e ." in runs
    users = [a for op, a in docker if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    last_run = max(i for i, (op, _) in enumerate(docker) if op == "RUN")
    assert max(i for i, (op, _) in enumerate(docker) if op == "USER") > last_run
    for op, a in docker:
        if op == "COPY":
            *sources, _dest = [w for w in shlex.split(a) if not w.startswith("--")]
            for source in sources:
                assert (root / source).exists(), f"COPY {source}: not in the repository"
    [cmd] = [a for op, a in docker if op == "CMD"]
    assert cmd == '["python", "-m", "tinyscale.ops.gpu_probe"]'
    assert (root / "code/tinyscale/ops/gpu_probe.py").is_file()


def test_apptainer_definition(docker: list[tuple[str, str]], root: Path) -> None:
    header, sections = apptainer_sections((root / APPTAINER).read_text())
    docker_from = next(a for op, a in docker if op == "FROM")
    assert header == {"Bootstrap": "docker", "From": docker_from}
    for line in sections["files"]:
        source, _dest = line.split()
        assert (root / source).exists(), f"%files {source}: not in the repository"
    post = " ; ".join(sections["post"])
    assert f'"torch=={torch_pin(root)}" --index-url https://download.pytorch.org/whl/cu130' in post
    assert "pip install --no-cache-dir -e /opt/tinyscale" in post
    assert "export PATH=/opt/venv/bin:$PATH" in sections["environment"]
    assert any("python -m tinyscale.ops.gpu_probe" in line for line in sections["runscript"])
    assert sections["test"]


def test_the_k8s_pod_runs_where_the_image_put_the_code(
    docker: list[tuple[str, str]], root: Path
) -> None:
    job = yaml.safe_load((root / "code/config/k8s/pytorchjob.yaml").read_text())
    [c] = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    workdir = next(a for op, a in docker if op == "WORKDIR")
    assert c["workingDir"] == workdir
