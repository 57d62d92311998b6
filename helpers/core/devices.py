"""What the machine has, and the one place where devices, backend and dtype are decided.

``plan_devices(n)`` answers every lesson and worker: which ``n`` devices, which
``torch.distributed`` backend when the ``n`` parts are processes, which dtype, and why.
In one process (``processes=False``) a lesson gets distinct GPUs when there are enough,
else one device repeated: ``n`` *logical* devices, the split simulated. Processes
(``processes=True``) get NCCL only with one GPU per rank, because NCCL refuses two ranks
on one GPU ("Multiple Ranks are using the same GPU/Partition" in NCCL 2.30, which this torch
bundles; "Duplicate GPU detected" in earlier versions); otherwise gloo on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

MAX_LOGICAL_DEVICES = 8
DEVICE_CHOICES = ("auto", "cpu", "cuda")
BACKEND_CHOICES = ("auto", "gloo", "nccl")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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


def gpu_count() -> int:
    """CUDA GPUs visible to this process."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def machine_info() -> MachineInfo:
    """Read the machine: GPUs, CPU cores, torch.distributed backends."""
    count = gpu_count()
    return MachineInfo(
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        gpu_count=count,
        gpu_names=[torch.cuda.get_device_name(i) for i in range(count)],
        cpu_cores=cpu_cores(),
        gloo_available=dist.is_available() and dist.is_gloo_available(),
        nccl_available=dist.is_available() and dist.is_nccl_available() and count > 0,
    )


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """``float32``, ``float16`` or ``bfloat16`` as a torch dtype, else a clear error."""
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    if isinstance(name, str) and name in DTYPES:
        return DTYPES[name]
    raise ValueError(f"unknown dtype {name!r}; valid choices: {', '.join(DTYPES)}")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``'float16'``."""
    return str(dtype).removeprefix("torch.")


def resolve_device(name: str | torch.device) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` as a device that exists here, else a clear error."""
    gpus = gpu_count()
    valid = "cpu" + (f", cuda, cuda:0 .. cuda:{gpus - 1}" if gpus else "")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {name!r}; valid choices here: {valid}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {name!r}; valid choices here: {valid}")
    if device.type == "cuda" and gpus == 0:
        raise ValueError(f"device {name!r} needs a CUDA GPU but this machine has none; valid: cpu")
    if device.type == "cuda" and device.index is not None and device.index >= gpus:
        raise ValueError(
            f"device {name!r} does not exist: this machine has {gpus} GPU(s); valid here: {valid}"
        )
    return device


@dataclass(frozen=True)
class DevicePlan:
    """Where ``n`` parts of a model run: devices, backend (processes only), dtype, reason."""

    devices: list[torch.device]
    backend: str | None
    dtype: torch.dtype
    reason: str

    @property
    def simulated(self) -> bool:
        """True when devices repeat: the split is simulated on fewer real devices."""
        return len(set(self.devices)) < len(self.devices)

    @property
    def device_type(self) -> str:
        return self.devices[0].type


def _check_choices(n: int, device: str, backend: str) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n={n!r} devices or ranks requested; valid: an integer >= 1")
    if device not in DEVICE_CHOICES and not str(device).startswith("cuda:"):
        raise ValueError(f"device {device!r}; valid choices: {', '.join(DEVICE_CHOICES)}")
    if backend not in BACKEND_CHOICES:
        raise ValueError(
            f"unknown backend {backend!r}; valid choices: {', '.join(BACKEND_CHOICES)}"
        )


def _in_process(n: int, device: str, gpus: int) -> DevicePlan:
    if device != "cpu" and gpus >= n:
        devices = [torch.device("cuda", i) for i in range(n)]
        return DevicePlan(devices, None, torch.float32, f"{n} real device(s): one GPU each")
    if n > MAX_LOGICAL_DEVICES:
        raise ValueError(
            f"n={n} devices requested but this machine has {gpus} GPU(s) and at most "
            f"{MAX_LOGICAL_DEVICES} logical devices are simulated; valid: n <= "
            f"{max(gpus, MAX_LOGICAL_DEVICES)}"
        )
    base = torch.device("cuda", 0) if (device != "cpu" and gpus > 0) else torch.device("cpu")
    what = f"GPU {base}" if base.type == "cuda" else "CPU"
    reason = (
        f"{n} logical devices on {base} (simulated: one {what} stands in for all {n}, "
        f"because this machine has {gpus} GPU(s))"
    )
    return DevicePlan([base] * n, None, torch.float32, reason)


def _processes(n: int, device: str, backend: str, gpus: int) -> DevicePlan:
    gpu_each = gpus >= n
    if backend == "nccl" and (device == "cpu" or not gpu_each):
        why = "--device cpu was asked for" if device == "cpu" else f"{gpus} GPU(s) for {n} ranks"
        raise ValueError(
            f"backend 'nccl' needs one GPU per rank ({why}); NCCL refuses two ranks on one GPU "
            f"('Multiple Ranks are using the same GPU'); valid: backend 'gloo' (CPU)"
            + (f", or at most {gpus} ranks" if gpus and device != "cpu" else "")
        )
    if device.startswith("cuda") and not gpu_each:
        raise ValueError(
            f"device {device!r} for {n} ranks needs one GPU per rank but this machine has "
            f"{gpus}; valid: device 'cpu' or 'auto'"
            + (f", or at most {gpus} ranks" if gpus else "")
        )
    if device != "cpu" and backend != "gloo" and gpu_each:
        devices = [torch.device("cuda", k) for k in range(n)]
        return DevicePlan(
            devices, "nccl", torch.float16, f"nccl: one GPU per rank ({n} of {gpus} GPUs)"
        )
    if backend == "gloo" or device == "cpu":
        reason = "gloo on the CPU, as requested"
    elif gpus:
        reason = (
            f"gloo on the CPU: {n} ranks but only {gpus} GPU(s), and NCCL refuses two ranks on "
            "one GPU ('Multiple Ranks are using the same GPU')"
        )
    else:
        reason = "gloo on the CPU: this machine has no CUDA GPU"
    return DevicePlan([torch.device("cpu")] * n, "gloo", torch.float32, reason)


def plan_devices(
    n: int, *, processes: bool = False, device: str = "auto", backend: str = "auto"
) -> DevicePlan:
    """The devices, backend, dtype and reason for ``n`` stages or ranks on this machine.

    ``device``: auto, cpu, cuda (or cuda:N for one rank). ``backend`` (processes only):
    auto, gloo or nccl. The dtype is float16 for NCCL ranks on GPUs (the source's choice),
    float32 elsewhere (CPUs have no fast float16 matrix products).
    """
    device = str(device)
    _check_choices(n, device, backend)
    gpus = gpu_count()
    if device.startswith("cuda"):
        resolve_device(device)
    if processes:
        return _processes(n, device, backend, gpus)
    return _in_process(n, device, gpus)


def lesson_devices(n: int, *, device: str = "auto", verbose: bool = True) -> list[torch.device]:
    """``n`` devices for a lesson in one process; prints whether the split is simulated."""
    plan = plan_devices(n, device=device)
    if verbose:
        print(plan.reason)
    return plan.devices


def check_gpu_ranks(device: str, nproc: int) -> None:
    """Refuse ``device="cuda"`` (NCCL, one GPU per rank) for more ranks than visible GPUs."""
    if device == "cuda" and gpu_count() < nproc:
        raise ValueError(
            f"device='cuda' (NCCL) asks for one GPU per rank, {nproc} ranks, but "
            f"{gpu_count()} GPU(s) are visible; valid: device='cpu' (gloo) or 'auto', or "
            "nproc <= the number of GPUs")
