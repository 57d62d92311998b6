"""The types every part of ``make gpu-check`` shares: a step, its sizes, the run's context.

Nothing here imports torch at import time, so ``--help`` stays quick and ``--smoke`` can
hide the GPUs before torch starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from helpers.core.devices import DevicePlan
    from helpers.profiles import Profile


class StepSkipped(Exception):
    """Raised by a step that cannot run here; its message is the recorded reason."""


@dataclass(frozen=True)
class Step:
    """One step: its name, what it does, and how long it takes (full run on one H200, smoke)."""

    name: str
    summary: str
    estimate_s: float
    smoke_estimate_s: float

    def estimate(self, smoke: bool) -> float:
        """The estimate of a full run, or of a smoke run."""
        return self.smoke_estimate_s if smoke else self.estimate_s


@dataclass(frozen=True)
class Sizes:
    """What only the GPU check decides: copy sizes and how often each step repeats.

    Every model size comes from ``helpers.profiles`` (``full`` on a GPU, ``smoke``
    for ``--smoke``), the one table the lessons, the bench and the tests read too.
    """

    copy_mb: tuple[float, ...]
    copy_repeats: int
    rn_repeats: int  # Model Parallel vs Single GPU (the source's loop)
    pipe_repeats: int  # in-process micro-batching
    cpu_steps: int  # the CPU pipeline with one process per stage
    cpu_stages: tuple[int, ...]  # K: stage processes, each when the CPU has K cores
    sched_steps: int  # lesson 04: the MLP stack on 2 ranks, four schedules
    lm_repeats: int


FULL = Sizes(copy_mb=(1, 16, 128), copy_repeats=10, rn_repeats=10, pipe_repeats=5,
             cpu_steps=3, cpu_stages=(2, 4), sched_steps=3, lm_repeats=5)
# --smoke: K=4 runs the same code as K=2
SMOKE = Sizes(copy_mb=(1, 4), copy_repeats=3, rn_repeats=1, pipe_repeats=1,
              cpu_steps=1, cpu_stages=(2,), sched_steps=1, lm_repeats=2)


@dataclass(frozen=True)
class Context:
    """Where results go, which sizes, which device type, and the machine record to fill."""

    out: Path
    smoke: bool
    sizes: Sizes
    device_type: str
    machine: dict

    @property
    def profile(self) -> Profile:
        """The lessons' sizes this run uses: ``full`` on a GPU, ``smoke`` for ``--smoke``."""
        from helpers.profiles import get_profile

        return get_profile("smoke" if self.smoke else "full")

    @property
    def cpu_profile(self) -> Profile:
        """The sizes of the CPU runs (one process per stage): the lessons' CPU profile."""
        from helpers.profiles import get_profile

        return get_profile("smoke" if self.smoke else "small")

    @property
    def figures(self) -> Path:
        """Folder of the figures: results/ for a real run, a subfolder for the smoke run."""
        return self.out / "gpu_check_smoke" if self.smoke else self.out

    @property
    def scratch(self) -> Path:
        """Folder of the shards and the offload folder."""
        return self.out / ("gpu_check_smoke" if self.smoke else "gpu_check")

    def plan(self, n: int) -> DevicePlan:
        """``plan_devices(n)`` in one process on this run's device type."""
        from helpers.core.devices import plan_devices

        return plan_devices(n, device=self.device_type)


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU (imports torch)."""
    import torch

    return torch.cuda.is_available()


def make_context(out: Path, *, smoke: bool, machine: dict) -> Context:
    """The context of a run: tiny sizes on the CPU for ``smoke``, the source's on CUDA."""
    import torch

    device_type = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    if smoke:
        torch.set_num_threads(1)  # a rehearsal of the code paths, light on a shared machine
    return Context(Path(out), smoke, SMOKE if smoke else FULL, device_type, machine)


def release() -> None:
    """Free cached GPU memory between parts of a step."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
