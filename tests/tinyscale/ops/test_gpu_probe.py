"""tinyscale.ops.gpu_probe: the pure parts (nvidia-smi's CSV and header, NVML's CUDA number,
the report's verdicts) on strings in the formats the tools print; the nvidia-smi path through
a stand-in script on PATH; the no-GPU path as the CPU twin runs it; and, where a GPU exists,
the real probe.
"""

import shutil
import stat
import sys
from pathlib import Path

import pytest

from tinyscale.ops.gpu_probe import (
    NO_GPU,
    TorchView,
    cuda_version_from_nvml,
    main,
    parse_smi_csv,
    parse_smi_cuda_version,
    read_smi,
    report,
)

# The format of `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`
# (values made up for the test; the second GPU reports no power draw).
SMI_CSV = """\
0, NVIDIA H100 80GB HBM3, 550.54.15, 4, 81559, 0, 31, 69.87, 700.00, 0
1, NVIDIA H100 80GB HBM3, 550.54.15, 70122, 81559, 98, 64, [N/A], 700.00, 2
"""
SMI_HEADER = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
"""
ARCHES = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def view(cuda: str | None = "13.0", caps: list[tuple[int, int]] | None = None) -> TorchView:
    caps = [(9, 0), (9, 0)] if caps is None else caps
    return TorchView(
        version="2.14.1",
        cuda=cuda,
        available=bool(caps),
        device_count=len(caps),
        capabilities=caps,
        arch_list=ARCHES,
    )


def test_parsers() -> None:
    assert cuda_version_from_nvml(12040) == (12, 4)
    assert cuda_version_from_nvml(13000) == (13, 0)
    assert parse_smi_cuda_version(SMI_HEADER) == (12, 4)
    assert parse_smi_cuda_version("no header") is None
    gpu0, gpu1 = parse_smi_csv(SMI_CSV)
    assert (gpu0.index, gpu0.name, gpu0.driver) == (0, "NVIDIA H100 80GB HBM3", "550.54.15")
    assert (gpu0.memory_used_mib, gpu0.memory_total_mib, gpu0.power_w) == (4, 81559, 69.87)
    assert (gpu1.utilization_pct, gpu1.temperature_c, gpu1.power_w) == (98, 64, None)
    assert gpu1.ecc_uncorrected == 2
    with pytest.raises(ValueError, match="expected 10 fields"):
        parse_smi_csv("0, NVIDIA H100, 550.54.15")


def test_report_verdicts() -> None:
    readings = parse_smi_csv(SMI_CSV)
    lines, code = report(readings, (12, 4), view("12.8"))
    assert code == 1  # GPU 1's uncorrected ECC errors fail it, and only they do
    assert [line[:4] for line in lines[-4:]] == ["ok  ", "ok  ", "ok  ", "FAIL"]
    assert "GPU 1 has 2 uncorrected ECC errors" in lines[-1]
    assert "power n/a of 700 W" in lines[3]
    healthy = [parse_smi_csv(SMI_CSV)[0]]
    assert report(healthy, (12, 4), view("12.8", [(9, 0)]))[1] == 0
    assert report(healthy, (12, 4), view("13.0", [(9, 0)]))[1] == 1  # driver too old
    lines, code = report(healthy, (12, 4), view("12.8", []))
    assert code == 1 and "torch sees none" in lines[-1]
    lines, code = report([], None, view(None, []))
    assert code == NO_GPU and "no NVIDIA GPU here" in lines[-1]


def fake_smi(directory: Path, body: str) -> None:
    """A stand-in `nvidia-smi` on PATH: it prints what the real one prints, in its format."""
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError


def test_nvidia_smi_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_nvml: None) -> None:
    (tmp_path / "csv").write_text(SMI_CSV)
    (tmp_path / "header").write_text(SMI_HEADER)
    fake_smi(
        tmp_path,
        f'case "$1" in --query-gpu=*) cat {tmp_path}/csv ;; *) cat {tmp_path}/header ;; esac',
    )
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    readings, cuda = read_smi()
    assert cuda == (12, 4) and [g.index for g in readings] == [0, 1]


def test_nvidia_smi_failures_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_nvml: None, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    fake_smi(tmp_path, 'echo "NVIDIA-SMI has failed because it couldn\'t communicate"; exit 9')
    assert main([]) == 1
    assert capsys.readouterr().out.startswith("FAIL nvidia-smi failed (exit 9): NVIDIA-SMI has")
    fake_smi(tmp_path, "sleep 5")  # a hung driver: the probe gives up, never hangs
    assert main(["--timeout-s", "0.3"]) == 1
    assert "did not answer in 0.3 s" in capsys.readouterr().out


def test_cpu_twin_says_no_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_nvml: None, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi on it
    assert main([]) == NO_GPU
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("torch ") and out[-1].startswith("no NVIDIA GPU here")


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU and driver")
def test_real_probe_on_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([])
    out = capsys.readouterr().out
    assert "GPU 0: " in out and code in (0, 1), out
