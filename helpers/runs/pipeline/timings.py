"""The same ResNet50 training step timed in this process: whole, split naively, micro-batched.

Used by lesson 03 and by ``make bench``, beside the K-process pipeline of
``helpers.runs.pipeline.worker``. On a CPU each variant gets one thread, like one
stage process, and the whole model runs once more with as many threads as there are stages.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from helpers.core.timing import Timing, measure
from helpers.model_parallel.resnet import one_hot_labels, resnet50, resnet_layers
from helpers.model_parallel.stages import StagedModel
from helpers.pipeline.schedule import MicroBatchPipeline


def training_step_fn(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, lr: float = 0.01
) -> Callable[[], None]:
    """One SGD training step of ``model`` on this batch (MSE loss), as a function to time."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.MSELoss()

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(model(images), labels).backward()
        optimizer.step()

    return step


def cost_per_image(
    image_sizes: Sequence[int], batches: Sequence[int], *, repeats: int = 2, warmup: int = 1
) -> dict[tuple[int, int], float]:
    """Seconds per image of a ResNet50 forward + backward, one CPU thread, per (size, batch)."""
    model = resnet50()
    threads = torch.get_num_threads()
    costs = {}
    try:
        torch.set_num_threads(1)
        for size in image_sizes:
            for batch in batches:
                images = torch.randn(batch, 3, size, size)
                timing = measure(
                    lambda x=images: model(x).sum().backward(), repeats=repeats, warmup=warmup
                )
                costs[(size, batch)] = timing.mean / batch
    finally:
        torch.set_num_threads(threads)
    return costs


@dataclass(frozen=True)
class InProcessTimings:
    """The same training step in this process: whole, split naively, micro-batched, and (on
    a CPU) whole with as many threads as there are stages."""

    single: Timing
    naive_mp: Timing
    microbatched: Timing
    single_threads: Timing | None = None

    def all(self) -> list[Timing]:
        return [t for t in (self.single, self.naive_mp, self.microbatched, self.single_threads)
                if t is not None]


def in_process_timings(
    batch: int,
    image_size: int,
    stages: int,
    microbatches: int,
    cut: Sequence[str],
    *,
    repeats: int,
    warmup: int,
    devices: Sequence[torch.device] | None = None,
    num_classes: int = 1000,
) -> InProcessTimings:
    """Training-step timings in this process, on ``devices`` (default: the CPU).

    On the CPU every variant runs with one thread, like one stage process, and the single
    model once more with ``stages`` threads (the fair competitor for ``stages`` cores).
    """
    devices = list(devices or [torch.device("cpu")] * stages)
    on_cpu = devices[0].type == "cpu"
    torch.manual_seed(0)
    images = torch.randn(batch, 3, image_size, image_size).to(devices[0])
    labels = one_hot_labels(torch.randint(0, num_classes, (batch,)), num_classes)
    single = resnet50(num_classes).to(devices[0])
    layers = resnet_layers(copy.deepcopy(single), blocks=True)
    names = [n for n, _ in layers]
    staged = StagedModel(layers, [names.index(c) for c in cut], devices)
    micro = MicroBatchPipeline(staged, microbatches)
    where = "1 thread" if on_cpu else ", ".join(sorted({str(d) for d in devices}))
    variants = [
        ("single", f"single process, {'1 thread' if on_cpu else devices[0]}", single, devices[0]),
        ("naive_mp", f"naive model parallel, {stages} stages, {where}", staged, devices[-1]),
        (
            "microbatched",
            f"in-process micro-batches (M={microbatches}), {where}",
            micro,
            devices[-1],
        ),
    ]
    threads = torch.get_num_threads()
    timings = {}
    try:
        if on_cpu:
            torch.set_num_threads(1)
        for key, label, model, out_device in variants:
            step = training_step_fn(model, images, labels.to(out_device))
            timings[key] = measure(step, repeats=repeats, warmup=warmup, label=label, progress=True)
        if on_cpu:
            torch.set_num_threads(stages)
            timings["single_threads"] = measure(
                training_step_fn(single, images, labels),
                repeats=repeats,
                warmup=warmup,
                label=f"single process, {stages} threads",
                progress=True,
            )
    finally:
        torch.set_num_threads(threads)
    return InProcessTimings(**timings)
