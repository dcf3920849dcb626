# --8<-- [start:readings]
"""Which GPUs this machine has, what its driver supports, and whether this torch can use them.

Try it:  python -m tinyscale.ops.gpu_probe

Reads NVML, the driver's monitoring library, through nvidia-ml-py (`import pynvml`) when it
is installed, else through the `nvidia-smi` command. On a machine with no NVIDIA driver it
says so in one line and exits with code 3. Exit codes: 0 every check passed, 1 a check
failed, 2 bad arguments, 3 no NVIDIA GPU here.
"""

import argparse
import csv
import dataclasses
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tinyscale.core.errors import ArgumentParser, run_cli
from tinyscale.ops.gpu_compat import Check, check_driver, check_kernels

NO_GPU = 3  # exit code: nothing to probe on this machine


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuReading:
    """One GPU as NVML reports it. None: the GPU or driver does not report that value."""

    index: int
    name: str
    driver: str  # e.g. "580.65.06": the kernel driver's version, not CUDA's
    memory_used_mib: int
    memory_total_mib: int
    utilization_pct: int | None  # share of the last sample period a kernel was running
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    ecc_uncorrected: int | None  # volatile (since boot) uncorrectable ECC errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class TorchView:
    """What this torch build was compiled for, and what it sees."""

    version: str
    cuda: str | None  # torch.version.cuda: the CUDA runtime in the wheel; None for CPU builds
    available: bool
    device_count: int
    capabilities: list[tuple[int, int]]  # per visible device, e.g. (9, 0) for an H100
    arch_list: list[str]  # e.g. ["sm_80", "sm_90"]: GPUs the wheel has kernels for


# --8<-- [end:readings]


# --8<-- [start:parse]
def cuda_version_from_nvml(value: int) -> tuple[int, int]:
    """nvmlSystemGetCudaDriverVersion() encodes 12.4 as 12040: major * 1000 + minor * 10."""
    return value // 1000, value % 1000 // 10


SMI_FIELDS = (
    "index,name,driver_version,memory.used,memory.total,utilization.gpu,"
    "temperature.gpu,power.draw,power.limit,ecc.errors.uncorrected.volatile.total"
)


def _number(text: str) -> float | None:
    """A CSV cell; nvidia-smi writes [N/A] or [Not Supported] for what a GPU lacks."""
    text = text.strip()
    return None if text.startswith("[") or text in ("", "N/A") else float(text)


def parse_smi_csv(text: str) -> list[GpuReading]:
    """Rows of `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`."""
    readings = []
    for row in csv.reader(text.strip().splitlines(), skipinitialspace=True):
        if len(row) != len(SMI_FIELDS.split(",")):
            raise ValueError(f"expected {len(SMI_FIELDS.split(','))} fields, got {row}")
        index, name, driver, *values = row
        used, total, util, temp, power, limit, ecc = (_number(v) for v in values)

        def whole(x: float | None) -> int | None:
            return None if x is None else int(x)

        readings.append(
            GpuReading(
                index=int(index),
                name=name.strip(),
                driver=driver.strip(),
                memory_used_mib=int(used or 0),
                memory_total_mib=int(total or 0),
                utilization_pct=whole(util),
                temperature_c=whole(temp),
                power_w=power,
                power_limit_w=limit,
                ecc_uncorrected=whole(ecc),
            )
        )
    return readings


def parse_smi_cuda_version(text: str) -> tuple[int, int] | None:
    """The 'CUDA Version: 12.4' in plain `nvidia-smi` output: the newest CUDA the driver runs."""
    m = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


# --8<-- [end:parse]


# --8<-- [start:read]
class ProbeError(Exception):
    """NVML or nvidia-smi is there but did not answer: a driver problem, not a usage one."""


def read_nvml() -> tuple[list[GpuReading], tuple[int, int]] | None:
    """Every GPU through NVML, or None if nvidia-ml-py or the driver library is missing."""
    try:
        import pynvml  # nvidia-ml-py: optional, only GPU machines need it
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # the package is installed but there is no driver
        return None

    def maybe(fn: Callable[..., Any], *args: Any) -> Any:  # not reported by this GPU: None
        try:
            return fn(*args)
        except pynvml.NVMLError:
            return None

    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = cuda_version_from_nvml(pynvml.nvmlSystemGetCudaDriverVersion())
        readings = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name, mem = pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetMemoryInfo(h)
            util = maybe(pynvml.nvmlDeviceGetUtilizationRates, h)
            power = maybe(pynvml.nvmlDeviceGetPowerUsage, h)  # milliwatts
            limit = maybe(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
            readings.append(
                GpuReading(
                    index=i,
                    name=name.decode() if isinstance(name, bytes) else name,
                    driver=driver.decode() if isinstance(driver, bytes) else driver,
                    memory_used_mib=mem.used // 2**20,
                    memory_total_mib=mem.total // 2**20,
                    utilization_pct=None if util is None else util.gpu,
                    temperature_c=maybe(
                        pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU
                    ),
                    power_w=None if power is None else power / 1000,
                    power_limit_w=None if limit is None else limit / 1000,
                    ecc_uncorrected=maybe(
                        pynvml.nvmlDeviceGetTotalEccErrors,
                        h,
                        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                        pynvml.NVML_VOLATILE_ECC,
                    ),
                )
            )
        return readings, cuda
    except pynvml.NVMLError as err:
        raise ProbeError(
            f"NVML failed: {err}: check `nvidia-smi` and dmesg for Xid errors"
        ) from None
    finally:
        pynvml.nvmlShutdown()


def read_smi(*, timeout_s: float = 15.0) -> tuple[list[GpuReading], tuple[int, int] | None] | None:
    """Every GPU through `nvidia-smi`, or None if it is not on PATH."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = [smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"]
    try:  # a hung driver makes nvidia-smi hang too: never wait forever
        table = subprocess.run(query, capture_output=True, text=True, timeout=timeout_s)
        header = subprocess.run([smi], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ProbeError(
            f"nvidia-smi did not answer in {timeout_s:g} s: the driver may be hung "
            "(look for Xid errors in dmesg)"
        ) from None
    if table.returncode != 0:
        first = (table.stderr or table.stdout).strip().splitlines()[:1]
        raise ProbeError(f"nvidia-smi failed (exit {table.returncode}): {' '.join(first)}")
    return parse_smi_csv(table.stdout), parse_smi_cuda_version(header.stdout)


def torch_view() -> TorchView:
    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    return TorchView(
        version=torch.__version__,
        cuda=torch.version.cuda,
        available=available,
        device_count=count,
        capabilities=[torch.cuda.get_device_capability(i) for i in range(count)],
        arch_list=torch.cuda.get_arch_list() if torch.version.cuda else [],
    )


# --8<-- [end:read]


# --8<-- [start:report]
def _show(x: object, unit: str) -> str:
    if x is None:
        return "n/a"
    return f"{x:g}{unit}" if isinstance(x, float) else f"{x}{unit}"


def report(
    readings: list[GpuReading], driver_cuda: tuple[int, int] | None, view: TorchView
) -> tuple[list[str], int]:
    """The lines to print and the exit code, from what was read: no I/O here."""
    built = f"CUDA {view.cuda}" if view.cuda else "no CUDA (a CPU-only build)"
    lines = [
        f"torch {view.version}: built for {built}; kernels for {' '.join(view.arch_list) or '-'}",
        f"torch.cuda.is_available() = {view.available}, {view.device_count} device(s) visible",
    ]
    if not readings:
        lines.append(
            "no NVIDIA GPU here: neither NVML (pip install nvidia-ml-py) nor nvidia-smi found "
            f"a driver; nothing to check (exit code {NO_GPU})"
        )
        return lines, NO_GPU
    lines += [
        f"GPU {g.index}: {g.name}, driver {g.driver}, memory {g.memory_used_mib:,} / "
        f"{g.memory_total_mib:,} MiB, utilization {_show(g.utilization_pct, ' %')}, "
        f"{_show(g.temperature_c, ' C')}, power {_show(g.power_w, ' W')} of "
        f"{_show(g.power_limit_w, ' W')}, uncorrected ECC errors {_show(g.ecc_uncorrected, '')}"
        for g in readings
    ]
    checks = []
    if driver_cuda is not None:
        checks.append(
            check_driver(driver=readings[0].driver, driver_cuda=driver_cuda, torch_cuda=view.cuda)
        )
    if view.device_count == 0:  # the classic broken install: a driver, but torch sees nothing
        checks.append(
            Check(
                False,
                f"the driver lists {len(readings)} GPU(s), torch sees none: read the driver check "
                "above, and check CUDA_VISIBLE_DEVICES",
            )
        )
    elif view.device_count < len(readings):  # SLURM and k8s hide the GPUs of other jobs
        checks.append(
            Check(True, f"torch sees {view.device_count} of {len(readings)}: CUDA_VISIBLE_DEVICES")
        )
    checks += [check_kernels(cc, view.arch_list) for cc in view.capabilities]
    checks += [
        Check(False, f"GPU {g.index} has {g.ecc_uncorrected} uncorrected ECC errors: drain it")
        for g in readings
        if g.ecc_uncorrected
    ]
    lines += [f"{'ok  ' if c.ok else 'FAIL'} {c.message}" for c in checks]
    return lines, 0 if all(c.ok for c in checks) else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timeout-s", type=float, default=15.0, help="wait this long for nvidia-smi")
    args = p.parse_args(argv)
    try:
        found = read_nvml() or read_smi(timeout_s=args.timeout_s)
    except ProbeError as err:
        print(f"FAIL {err}")
        return 1
    readings, driver_cuda = found if found else ([], None)
    lines, code = report(readings, driver_cuda, torch_view())
    print("\n".join(lines))
    return code


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
# --8<-- [end:report]
