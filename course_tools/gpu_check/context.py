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
    """The sizes of every step: the source's on a GPU, tiny ones for ``--smoke``."""

    copy_mb: tuple[float, ...]
    copy_repeats: int
    proof_batch: int  # ResNet50 training-step proof
    proof_image: int
    rn_batch: int  # Model Parallel vs Single GPU (the source's loop)
    rn_image: int
    rn_batches: int
    rn_repeats: int
    pipe_batch: int  # in-process micro-batching
    pipe_image: int
    pipe_micro: int
    pipe_repeats: int
    cpu_batch: int  # the CPU pipeline with one process per stage
    cpu_image: int
    cpu_micro: int
    cpu_steps: int
    cpu_stages: tuple[int, ...]  # K: stage processes, each when the CPU has K cores
    sched_width: int  # lesson 04: the MLP stack on 2 ranks, four schedules
    sched_blocks: int
    sched_batch: int
    sched_micro: int
    sched_steps: int
    lm_profile: str
    lm_repeats: int
    tp_profile: str
    tp_overrides: dict[str, int]  # DemoConfig fields replaced in the smoke run
    demo_args: str


# the source's command line (lesson 07), and a tiny one on the CPU for --smoke
SOURCE_DEMO = (
    "--hidden_size 512 --ffn_size 4096 --seq_len 512 --batch_size 8 --world_size 4 --device cuda"
)
TINY_DEMO = (
    "--hidden_size 32 --ffn_size 64 --seq_len 8 --batch_size 2 --world_size 4 --device cpu "
    "--dtype float32 --iters 3 --warmup 1"
)

FULL = Sizes(
    copy_mb=(1, 16, 128),
    copy_repeats=10,
    proof_batch=16,
    proof_image=128,
    rn_batch=120,
    rn_image=128,
    rn_batches=3,
    rn_repeats=10,
    pipe_batch=32,
    pipe_image=128,
    pipe_micro=4,
    pipe_repeats=5,
    cpu_batch=16,
    cpu_image=64,
    cpu_micro=4,
    cpu_steps=3,
    cpu_stages=(2, 4),
    sched_width=512,  # make bench's size: quick on 2 GPUs, still seconds on 2 CPU ranks
    sched_blocks=8,
    sched_batch=1024,
    sched_micro=8,
    sched_steps=3,
    lm_profile="full",
    lm_repeats=5,
    tp_profile="full",
    tp_overrides={},
    demo_args=SOURCE_DEMO,
)
SMOKE = Sizes(
    copy_mb=(1, 4),
    copy_repeats=3,
    proof_batch=2,
    proof_image=32,
    rn_batch=2,
    rn_image=32,
    rn_batches=1,
    rn_repeats=1,
    # balanced_cut_names counts FLOPs in training mode, one image: BatchNorm needs > 1x1,
    # and 48x48 leaves 2x2 after layer4; one image per micro-batch
    pipe_batch=2,
    pipe_image=48,
    pipe_micro=2,
    pipe_repeats=1,
    cpu_batch=2,
    cpu_image=48,
    cpu_micro=2,
    cpu_steps=1,
    cpu_stages=(2,),  # K=4 runs the same code as K=2
    sched_width=32,
    sched_blocks=4,
    sched_batch=16,
    sched_micro=4,
    sched_steps=1,
    lm_profile="small",
    lm_repeats=2,
    tp_profile="small",
    tp_overrides={
        "hidden_size": 32,
        "ffn_size": 64,
        "seq_len": 8,
        "batch_size": 2,
        "iters": 3,
        "warmup": 1,
    },
    demo_args=TINY_DEMO,
)


@dataclass(frozen=True)
class Context:
    """Where results go, which sizes, which device type, and the machine record to fill."""

    out: Path
    smoke: bool
    sizes: Sizes
    device_type: str
    machine: dict

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
