"""One pipeline stage per process: ``torchrun --nproc-per-node=K -m helpers.pipeline.stage_worker``.

Every rank builds the same ResNet50 (same seed), keeps only its stage, and trains it with
``torch.distributed.pipelining`` (GPipe or 1F1B schedule). With ``--check`` one step of every
schedule is compared, on rank 0, with the single-process reference: gradients accumulated over
the same micro-batches, one SGD step (the step and its proof: ``helpers.pipeline.runtime``).
Rank 0 returns everything as JSON.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
from torch import nn

from helpers.core.errors import NotUnderTorchrunError
from helpers.core.timing import synchronized_clock
from helpers.distributed.ranks import Rank, process_group, write_result
from helpers.memory.saved import SavedTensorMeter
from helpers.model_parallel.resnet import one_hot_labels, resnet50, resnet_layers, split_points_at
from helpers.model_parallel.stages import split_layers
from helpers.pipeline.runtime import RankPipeline, build_pipeline, prove_step, train_step
from helpers.pipeline.stage_runs import WORKER, PipelineConfig, validate_stage_count

MODULE = WORKER


def same_batch(args: PipelineConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random batch on every rank (its own seeded generator)."""
    g = torch.Generator().manual_seed(args.seed + 1)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g)
    classes = torch.randint(0, args.num_classes, (args.batch,), generator=g)
    return images, one_hot_labels(classes, args.num_classes)


def stage_pipeline(module: nn.Module, rank: Rank, schedule: str, m: int, lr: float) -> RankPipeline:
    """This rank's stage (stage index = rank) as a new pipeline of ``schedule`` at M=``m``."""
    return build_pipeline({rank.rank: module}, rank.world_size, schedule, m, rank.device, lr)


def check_run(
    module: nn.Module,
    rank: Rank,
    reference: nn.Module | None,
    images: torch.Tensor,
    labels: torch.Tensor,
    schedule: str,
    m: int,
    lr: float,
) -> dict | None:
    """``runtime.prove_step`` of one run, then each rank's peak of activation bytes.

    ``reference`` (rank 0 only) is the whole model with the stage's current weights; the
    comparison comes back on rank 0. The peak of bytes kept for backward
    (``helpers.memory.SavedTensorMeter``) is measured during a second step: a new
    ``PipelineStage``'s first step also runs one micro-batch to infer shapes.
    """
    pipe = stage_pipeline(module, rank, schedule, m, lr)
    proof = prove_step(pipe, reference, images, labels, m, lr)
    with SavedTensorMeter(module) as meter:
        train_step(pipe, images, labels, mean_loss=True)
    peaks: list | None = [None] * rank.world_size if rank.rank == 0 else None
    dist.gather_object(meter.peak.get(str(rank.device), 0), peaks, dst=0)
    if proof is None or peaks is None:
        return None
    c = proof.comparison
    return {
        "schedule": schedule,
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
    }


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


def main(argv: list[str] | None = None) -> None:
    args = PipelineConfig.from_args(argv)
    with process_group(MODULE) as rank:
        torch.set_num_threads(args.threads)
        torch.manual_seed(args.seed)
        model = resnet50(args.num_classes)
        reference = copy.deepcopy(model) if args.check and rank.rank == 0 else None
        layers = resnet_layers(model, blocks=True)
        stages = split_layers(layers, split_points_at(layers, list(args.split)))
        validate_stage_count(len(stages), rank.world_size)
        module = stages[rank.rank].to(rank.device)
        images, labels = (t.to(rank.device) for t in same_batch(args))
        result: dict = {
            "stages": rank.world_size,
            "backend": rank.backend,
            "split": ",".join(args.split),
            "batch": args.batch,
            "image_size": args.image_size,
            "runs": [],
        }
        if args.check:  # every schedule that is timed is first proven, from the same weights
            start = copy.deepcopy(module.state_dict())
            result["checks"] = []
            for schedule, m in dict.fromkeys(args.runs):
                module.load_state_dict(start)
                ref = copy.deepcopy(reference) if reference is not None else None
                result["checks"].append(
                    check_run(module, rank, ref, images, labels, schedule, m, lr=args.lr)
                )
            module.load_state_dict(start)
        for schedule, m in args.runs:
            pipe = stage_pipeline(module, rank, schedule, m, args.lr)
            times = time_run(pipe, images, labels, args.steps, args.warmup)
            result["runs"].append({"schedule": schedule, "microbatches": m, "times_s": times})
        write_result(rank, result)


if __name__ == "__main__":
    try:
        main()
    except NotUnderTorchrunError as error:
        sys.exit(f"{MODULE}: error: {error}")
