"""One pipeline stage per process: ``torchrun --nproc-per-node=K -m helpers.runs.pipeline.worker``.

Every rank builds the same ResNet50 (same seed), keeps only its stage, and trains it with
``torch.distributed.pipelining`` (GPipe or 1F1B schedule). With ``--check`` one step of every
run is compared with the single-process reference: gradients accumulated over the same
micro-batches, one SGD step, taken once per micro-batch count on every rank, each rank
comparing its own stage and rank 0 gathering the differences (the step and its proof:
``helpers.pipeline.runtime``); with ``--break-it`` one GPipe step that forgets to average
its micro-batch gradients is proven the same way, and fails. The timed runs are then timed (on the pipeline the proof
built, or on a new one at ``--time-image-size``), and with ``--baselines`` the whole
model's step is timed in the same processes. Rank 0 returns a ``PipelineResult``.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
from torch import nn

from helpers.core.checks import StepResult
from helpers.core.timing import synchronized_clock
from helpers.memory.saved import SavedTensorMeter
from helpers.model_parallel.resnet import one_hot_labels, resnet50, resnet_layers, split_points_at
from helpers.model_parallel.stages import split_layers
from helpers.pipeline.runtime import RankPipeline, build_pipeline, prove_step_locally, train_step
from helpers.runs.contract import serve
from helpers.runs.pipeline.config import PipelineConfig
from helpers.runs.pipeline.results import PipelineResult, StageProof, TimedRun
from helpers.runs.pipeline.timings import training_step_fn
from helpers.torchrun.ranks import Rank
from helpers.torchrun.status import say


def same_batch(config: PipelineConfig,
               size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random batch on every rank (its own seeded generator), ``size`` pixels square
    (default: the proofs' image size)."""
    g = torch.Generator().manual_seed(config.seed + 1)
    size = size or config.image_size
    images = torch.randn(config.batch, 3, size, size, generator=g)
    classes = torch.randint(0, config.num_classes, (config.batch,), generator=g)
    return images, one_hot_labels(classes, config.num_classes)


def stage_pipeline(module: nn.Module, rank: Rank, schedule: str, m: int, lr: float) -> RankPipeline:
    """This rank's stage (stage index = rank) as a new pipeline of ``schedule`` at M=``m``."""
    return build_pipeline({rank.rank: module}, rank.world_size, schedule, m, rank.device, lr)


def check_run(
    pipe: RankPipeline,
    rank: Rank,
    reference: nn.Module | StepResult,
    images: torch.Tensor,
    labels: torch.Tensor,
    schedule: str,
    m: int,
    lr: float,
    first_param: int,
) -> tuple[StageProof | None, StepResult]:
    """``runtime.prove_step_locally`` of one run, then each rank's peak of activation bytes.

    ``reference`` is the whole model with the starting weights, or the one-process step
    already taken at this M (returned here on every rank, to reuse); rank 0 gets the
    proof. The peak of bytes kept for backward (``helpers.memory.SavedTensorMeter``)
    is measured during a second step: a new ``PipelineStage``'s first step also runs one
    micro-batch forward and backward to infer shapes, which raises the first step's peak.
    """
    say(rank, f"{schedule} M={m}: proof step against one process")
    proven, ref = prove_step_locally(pipe, reference, images, labels, m, lr, first_param)
    say(rank, f"{schedule} M={m}: memory step")
    module = next(iter(pipe.chunks.values()))
    with SavedTensorMeter(module) as meter:
        train_step(pipe, images, labels, mean_loss=True)
    peaks: list | None = [None] * rank.world_size if rank.rank == 0 else None
    dist.gather_object(meter.peak.get(str(rank.device), 0), peaks, dst=0)
    if proven is None or peaks is None:
        return None, ref
    c = proven.comparison
    return StageProof(schedule, m, proven.loss_pipelined, proven.loss_reference, c.output,
                      c.loss, c.grads, c.weights, c.worst_grad, c.worst_weight, peaks), ref


def break_it(
    module: nn.Module, start: dict, rank: Rank, config: PipelineConfig,
    references: dict[int, StepResult], images: torch.Tensor, labels: torch.Tensor,
    first_param: int,
) -> StageProof | None:
    """One GPipe step that forgets to divide its summed micro-batch gradients by M
    (``scale_grads`` off), proven like the others against the one-process step: the
    proof must fail. Rank 0 gets its ``StageProof``, the others None."""
    m = config.runs[0][1]
    module.load_state_dict(start)
    pipe = stage_pipeline(module, rank, "gpipe", m, config.lr)
    pipe.schedule.scale_grads = False  # the break: M micro-batch gradients summed, not averaged
    say(rank, f"break it: GPipe M={m} without the division by M")
    proven, _ = prove_step_locally(pipe, references[m], images, labels, m, config.lr,
                                   first_param)
    if proven is None:
        return None
    c = proven.comparison
    return StageProof("GPipe without 1/M", m, proven.loss_pipelined, proven.loss_reference,
                      c.output, c.loss, c.grads, c.weights, c.worst_grad, c.worst_weight, [])


def time_run(
    pipe: RankPipeline, images: torch.Tensor, labels: torch.Tensor, steps: int, warmup: int,
    rank: Rank, name: str,
) -> list[float]:
    """Seconds per training step, all stages finished (barrier before and after)."""
    for i in range(warmup):
        say(rank, f"timing {name}: warm-up step {i + 1} of {warmup}")
        train_step(pipe, images, labels, mean_loss=True)
    times = []
    for i in range(steps):
        say(rank, f"timing {name}: step {i + 1} of {steps}")
        dist.barrier()
        start = synchronized_clock()
        train_step(pipe, images, labels, mean_loss=True)
        dist.barrier()
        times.append(synchronized_clock() - start)
    return times


def time_baselines(
    model: nn.Module, rank: Rank, images: torch.Tensor, labels: torch.Tensor,
    config: PipelineConfig,
) -> dict[str, list[float]] | None:
    """One process's whole-model step, timed on rank 0 while the other ranks wait in a barrier.

    ``single``: one thread, as each stage process has (the pipeline's one-device baseline);
    ``single_threads``: one thread per stage (the fair competitor for K cores). Each comes
    after its own ``config.warmup`` untimed steps (a new thread count warms up anew). Rank 0
    gets both; the others None.
    """
    times: dict[str, list[float]] = {"single": [], "single_threads": []}
    if rank.rank == 0:
        step = training_step_fn(model, images, labels, config.lr)
        threads = torch.get_num_threads()
        try:
            for key, n in (("single", config.threads), ("single_threads", rank.world_size)):
                torch.set_num_threads(n)
                warmup = config.warmup
                for i in range(warmup + config.steps):
                    say(rank, f"one process, {n} thread(s): "
                        + (f"warm-up step {i + 1} of {warmup}" if i < warmup
                           else f"step {i - warmup + 1} of {config.steps}"))
                    start = synchronized_clock()
                    step()
                    if i >= warmup:
                        times[key].append(synchronized_clock() - start)
        finally:
            torch.set_num_threads(threads)
    dist.barrier()
    return times if rank.rank == 0 else None


def main(config: PipelineConfig, rank: Rank) -> PipelineResult | None:
    """This rank's stage: every run proven (``--check``), measured and timed; rank 0 returns
    the result, the other ranks None."""
    began = time.monotonic()  # the work itself: torchrun and the imports came before
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    model = resnet50(config.num_classes)
    whole = copy.deepcopy(model) if config.baselines or config.check else None
    layers = resnet_layers(model, blocks=True)
    stages = split_layers(layers, split_points_at(layers, list(config.split)))
    module = stages[rank.rank].to(rank.device)
    first_param = sum(len(list(stage.parameters())) for stage in stages[: rank.rank])
    images, labels = (t.to(rank.device) for t in same_batch(config))
    timed_batch = tuple(t.to(rank.device) for t in same_batch(config, config.timing_size))
    proofs: list[StageProof] = []
    runs: list[TimedRun] = []
    start = copy.deepcopy(module.state_dict())
    references: dict[int, StepResult] = {}  # the one-process step at each M
    for schedule, m in dict.fromkeys(config.runs):
        module.load_state_dict(start)  # every run is proven from the same weights
        pipe = stage_pipeline(module, rank, schedule, m, config.lr)
        warmup = config.warmup
        if config.check:  # proof and memory step, which also warm the pipeline up
            ref = references.get(m) or copy.deepcopy(whole).to(rank.device)
            proof, references[m] = check_run(
                pipe, rank, ref, images, labels, schedule, m, config.lr, first_param)
            if proof is not None:
                proofs.append(proof)
        else:
            warmup = max(warmup, 1)  # a new stage's first step infers shapes
        if (schedule, m) in config.timed_runs:
            if config.timing_size != config.image_size:  # new shapes: a new pipeline
                module.load_state_dict(start)
                pipe = stage_pipeline(module, rank, schedule, m, config.lr)
                warmup = max(config.warmup, 1)
            times = time_run(pipe, *timed_batch, config.steps, warmup, rank,
                             f"{schedule} M={m} at {config.timing_size}x{config.timing_size}")
            runs.append(TimedRun(schedule, m, times))
    broken = None
    if config.break_it and config.check:
        broken = break_it(module, start, rank, config, references, images, labels, first_param)
    module.load_state_dict(start)
    baselines = None
    if config.baselines:
        baselines = time_baselines(whole.to(rank.device), rank, *timed_batch, config)
    if rank.rank != 0:
        return None
    say(rank, "done: sending the result")
    return PipelineResult(config, rank.backend, proofs, runs, baselines or {},
                          work_s=time.monotonic() - began, broken=broken)


if __name__ == "__main__":
    serve(PipelineConfig, main)
