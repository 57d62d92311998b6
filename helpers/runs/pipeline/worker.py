"""One pipeline stage per process: ``torchrun --nproc-per-node=K -m helpers.runs.pipeline.worker``.

Every rank builds the same ResNet50 (same seed), keeps only its stage, and trains it with
``torch.distributed.pipelining`` (GPipe or 1F1B schedule). With ``--check`` one step of every
run is compared with the single-process reference: gradients accumulated over the same
micro-batches, one SGD step, taken once per micro-batch count on every rank, each rank
comparing its own stage and rank 0 gathering the differences (the step and its proof:
``helpers.pipeline.runtime``). The timed runs are then timed (on the pipeline the proof
built, or on a new one at ``--time-image-size``), and with ``--baselines`` the whole
model's step is timed in the same processes.
Rank 0 returns everything as JSON.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
from torch import nn

from helpers.core.checks import StepResult
from helpers.core.errors import NotUnderTorchrunError
from helpers.core.timing import synchronized_clock
from helpers.memory.saved import SavedTensorMeter
from helpers.model_parallel.resnet import one_hot_labels, resnet50, resnet_layers, split_points_at
from helpers.model_parallel.stages import split_layers
from helpers.pipeline.runtime import RankPipeline, build_pipeline, prove_step_locally, train_step
from helpers.runs.pipeline.config import WORKER, PipelineConfig, validate_stage_count
from helpers.runs.pipeline.timings import training_step_fn
from helpers.torchrun.ranks import Rank, exit_worker, process_group, write_result

MODULE = WORKER


def same_batch(args: PipelineConfig, size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random batch on every rank (its own seeded generator), ``size`` pixels square
    (default: the proofs' image size)."""
    g = torch.Generator().manual_seed(args.seed + 1)
    size = size or args.image_size
    images = torch.randn(args.batch, 3, size, size, generator=g)
    classes = torch.randint(0, args.num_classes, (args.batch,), generator=g)
    return images, one_hot_labels(classes, args.num_classes)


def stage_pipeline(module: nn.Module, rank: Rank, schedule: str, m: int, lr: float) -> RankPipeline:
    """This rank's stage (stage index = rank) as a new pipeline of ``schedule`` at M=``m``."""
    return build_pipeline({rank.rank: module}, rank.world_size, schedule, m, rank.device, lr)


def check_run(
    pipe: RankPipeline,
    rank: Rank,
    reference: nn.Module | StepResult,
    images: torch.Tensor,
    labels: torch.Tensor,
    m: int,
    lr: float,
    first_param: int,
) -> tuple[dict | None, StepResult]:
    """``runtime.prove_step_locally`` of one run, then each rank's peak of activation bytes.

    ``reference`` is the whole model with the starting weights, or the one-process step
    already taken at this M (returned here on every rank, to reuse); rank 0 gets the
    comparison. The peak of bytes kept for backward (``helpers.memory.SavedTensorMeter``)
    is measured during a second step: a new ``PipelineStage``'s first step also runs one
    micro-batch forward and backward to infer shapes, which raises the first step's peak.
    """
    proof, ref = prove_step_locally(pipe, reference, images, labels, m, lr, first_param)
    module = next(iter(pipe.chunks.values()))
    with SavedTensorMeter(module) as meter:
        train_step(pipe, images, labels, mean_loss=True)
    peaks: list | None = [None] * rank.world_size if rank.rank == 0 else None
    dist.gather_object(meter.peak.get(str(rank.device), 0), peaks, dst=0)
    if proof is None or peaks is None:
        return None, ref
    c = proof.comparison
    return {
        "microbatches": m,
        "loss_pipelined": proof.loss_pipelined,
        "loss_reference": proof.loss_reference,
        "output_diff": c.output,
        "loss_diff": c.loss,
        "grad_diff": c.grads,
        "weight_diff": c.weights,
        "worst_grad": c.worst_grad,
        "worst_weight": c.worst_weight,
        "peak_activation_bytes": peaks,
    }, ref


def time_run(
    pipe: RankPipeline, images: torch.Tensor, labels: torch.Tensor, steps: int, warmup: int
) -> list[float]:
    """Seconds per training step, all stages finished (barrier before and after)."""
    for _ in range(warmup):
        train_step(pipe, images, labels, mean_loss=True)
    times = []
    for _ in range(steps):
        dist.barrier()
        start = synchronized_clock()
        train_step(pipe, images, labels, mean_loss=True)
        dist.barrier()
        times.append(synchronized_clock() - start)
    return times


def time_baselines(
    model: nn.Module, rank: Rank, images: torch.Tensor, labels: torch.Tensor, args: PipelineConfig
) -> dict[str, list[float]] | None:
    """One process's whole-model step, timed on rank 0 while the other ranks wait in a barrier.

    ``single``: one thread, as each stage process has (the pipeline's one-device baseline);
    ``single_threads``: one thread per stage (the fair competitor for K cores). ``args.warmup``
    untimed steps come first; they also warm the model up for the K-thread steps. Rank 0
    gets both; the others None.
    """
    times: dict[str, list[float]] = {"single": [], "single_threads": []}
    if rank.rank == 0:
        step = training_step_fn(model, images, labels, args.lr)
        threads = torch.get_num_threads()
        try:
            # the one-thread steps warm the model up for the K-thread ones (same shapes)
            for key, n, warmup in (("single", args.threads, args.warmup),
                                   ("single_threads", rank.world_size, 0)):
                torch.set_num_threads(n)
                for i in range(warmup + args.steps):
                    start = synchronized_clock()
                    step()
                    if i >= warmup:
                        times[key].append(synchronized_clock() - start)
        finally:
            torch.set_num_threads(threads)
    dist.barrier()
    return times if rank.rank == 0 else None


def main(argv: list[str] | None = None) -> None:
    args = PipelineConfig.from_args(argv)
    with process_group(MODULE) as rank:
        validate_stage_count(args.stages, rank.world_size)
        torch.set_num_threads(args.threads)
        torch.manual_seed(args.seed)
        model = resnet50(args.num_classes)
        whole = copy.deepcopy(model) if args.baselines or args.check else None
        layers = resnet_layers(model, blocks=True)
        stages = split_layers(layers, split_points_at(layers, list(args.split)))
        module = stages[rank.rank].to(rank.device)
        first_param = sum(len(list(stage.parameters())) for stage in stages[: rank.rank])
        images, labels = (t.to(rank.device) for t in same_batch(args))
        timed_batch = tuple(t.to(rank.device) for t in same_batch(args, args.timing_size))
        result: dict = {
            "stages": rank.world_size,
            "backend": rank.backend,
            "split": ",".join(args.split),
            "batch": args.batch,
            "image_size": args.image_size,
            "time_image_size": args.timing_size,
            "runs": [],
            "checks": [],
        }
        start = copy.deepcopy(module.state_dict())
        references: dict[int, StepResult] = {}  # the one-process step at each M
        for schedule, m in dict.fromkeys(args.runs):
            module.load_state_dict(start)  # every run is proven from the same weights
            pipe = stage_pipeline(module, rank, schedule, m, args.lr)
            warmup = args.warmup
            if args.check:  # proof and memory step, which also warm the pipeline up
                ref = references.get(m) or copy.deepcopy(whole).to(rank.device)
                check, references[m] = check_run(
                    pipe, rank, ref, images, labels, m, args.lr, first_param)
                if check is not None:
                    result["checks"].append({"schedule": schedule, **check})
            else:
                warmup = max(warmup, 1)  # a new stage's first step infers shapes
            if (schedule, m) in args.timed_runs:
                if args.timing_size != args.image_size:  # new shapes: a new pipeline
                    module.load_state_dict(start)
                    pipe = stage_pipeline(module, rank, schedule, m, args.lr)
                    warmup = max(args.warmup, 1)
                times = time_run(pipe, *timed_batch, args.steps, warmup)
                result["runs"].append({"schedule": schedule, "microbatches": m, "times_s": times})
        module.load_state_dict(start)
        if args.baselines:
            result["baselines"] = time_baselines(whole.to(rank.device), rank, *timed_batch, args)
        if not args.check:
            del result["checks"]
        write_result(rank, result)


if __name__ == "__main__":
    try:
        main()
    except NotUnderTorchrunError as error:
        sys.exit(f"{MODULE}: error: {error}")
    exit_worker(0)  # skip the interpreter's teardown: torchrun waits for every rank's
