"""What the machine has, and ``n`` devices for a lesson.

A lesson asks for ``n`` devices. With ``n`` or more GPUs it gets distinct GPUs;
otherwise it gets one device repeated (``n`` *logical* devices), and one plain line
says that the split is simulated: the code path is the same, the hardware is not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

MAX_LOGICAL_DEVICES = 8
PREFER_CHOICES = ("auto", "cuda", "cpu")


@dataclass(frozen=True)
class MachineInfo:
    """A summary of the hardware and communication backends the lessons can use."""

    torch_version: str
    cuda_version: str | None
    gpu_count: int
    gpu_names: list[str] = field(default_factory=list)
    cpu_cores: int = 1
    gloo_available: bool = False
    nccl_available: bool = False

    def describe(self) -> str:
        """One line for a learner."""
        gpus = ", ".join(self.gpu_names) if self.gpu_names else "no CUDA GPU"
        backends = [
            b for b, ok in (("gloo", self.gloo_available), ("nccl", self.nccl_available)) if ok
        ]
        return (
            f"torch {self.torch_version}; {self.gpu_count} GPU(s): {gpus}; "
            f"{self.cpu_cores} CPU core(s); backends: {', '.join(backends) or 'none'}"
        )


def cpu_cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def machine_info() -> MachineInfo:
    """Read the machine: GPUs, CPU cores, torch.distributed backends."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return MachineInfo(
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        gpu_count=count,
        gpu_names=[torch.cuda.get_device_name(i) for i in range(count)],
        cpu_cores=cpu_cores(),
        gloo_available=dist.is_available() and dist.is_gloo_available(),
        nccl_available=dist.is_available() and dist.is_nccl_available() and count > 0,
    )


def lesson_devices(n: int, *, prefer: str = "auto", verbose: bool = True) -> list[torch.device]:
    """``n`` devices for a lesson: distinct GPUs when there are enough, else one repeated.

    ``prefer='cpu'`` forces the CPU; ``prefer='cuda'`` requires at least one GPU.
    """
    if prefer not in PREFER_CHOICES:
        raise ValueError(f"unknown device preference {prefer!r}; valid choices: {PREFER_CHOICES}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(
            f"n={n!r} devices requested; valid: an integer from 1 to {MAX_LOGICAL_DEVICES}"
        )
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if prefer == "cuda" and gpus == 0:
        raise RuntimeError(
            "prefer='cuda' but this machine has no CUDA GPU; valid choices here: 'auto' or 'cpu'"
        )
    if prefer != "cpu" and gpus >= n:
        devices = [torch.device("cuda", i) for i in range(n)]
        if verbose:
            names = ", ".join(f"{d} ({torch.cuda.get_device_name(d)})" for d in devices)
            print(f"{n} real device(s): {names}")
        return devices
    if n > MAX_LOGICAL_DEVICES:
        raise ValueError(
            f"n={n} devices requested but this machine has {gpus} GPU(s) and at most "
            f"{MAX_LOGICAL_DEVICES} logical devices are simulated; valid: n <= {max(gpus, MAX_LOGICAL_DEVICES)}"
        )
    base = torch.device("cuda", 0) if (prefer != "cpu" and gpus > 0) else torch.device("cpu")
    if verbose:
        what = f"GPU {base}" if base.type == "cuda" else "CPU"
        print(
            f"{n} logical devices on {base} (simulated: one {what} stands in for all {n}, "
            f"because this machine has {gpus} GPU(s))"
        )
    return [base] * n


def is_simulated(devices: list[torch.device]) -> bool:
    """True when some devices repeat, i.e. the split is simulated on fewer real devices."""
    return len(set(devices)) < len(devices)
