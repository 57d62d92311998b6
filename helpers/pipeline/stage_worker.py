"""One pipeline stage per process: ``torchrun --nproc-per-node=K -m helpers.pipeline.stage_worker``.

Every rank builds the same ResNet50 (same seed), keeps only its stage, and trains it with
``torch.distributed.pipelining`` (GPipe or 1F1B schedule). With ``--check`` one step of every
schedule is compared, on rank 0, with the single-process reference: gradients accumulated over
the same micro-batches, one SGD step. Rank 0 returns everything as JSON.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from helpers.core.checks import StepResult, compare_steps, snapshot
from helpers.core.errors import NotUnderTorchrunError
from helpers.core.timing import synchronized_clock
from helpers.distributed.ranks import Rank, process_group, write_result
from helpers.memory.saved import SavedTensorMeter
from helpers.model_parallel.resnet import one_hot_labels, resnet50, resnet_layers, split_points_at
from helpers.model_parallel.stages import split_layers
from helpers.pipeline.schedule import accumulated_step
from helpers.pipeline.stage_runs import WORKER, PipelineConfig

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
MODULE = WORKER


def same_batch(args: PipelineConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random batch on every rank (its own seeded generator)."""
    g = torch.Generator().manual_seed(args.seed + 1)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g)
    classes = torch.randint(0, args.num_classes, (args.batch,), generator=g)
    return images, one_hot_labels(classes, args.num_classes)


class StageTrainer:
    """This rank's stage, its optimizer, and one training step per schedule."""

    def __init__(
        self, module: nn.Module, rank: Rank, images: torch.Tensor, labels: torch.Tensor, lr: float
    ):
        self.module, self.rank = module, rank
        self.images, self.labels = images.to(rank.device), labels.to(rank.device)
        self.optimizer = torch.optim.SGD(module.parameters(), lr=lr)

    def step_fn(
        self, schedule: str, microbatches: int
    ) -> Callable[[], tuple[float, torch.Tensor | None]]:
        """A function running one training step; returns (mean loss, output on the last rank)."""
        rank = self.rank
        stage = PipelineStage(self.module, rank.rank, rank.world_size, rank.device)
        pipe = SCHEDULES[schedule](stage, microbatches, loss_fn=nn.MSELoss())
        first, last = rank.rank == 0, rank.rank == rank.world_size - 1

        def step() -> tuple[float, torch.Tensor | None]:
            self.optimizer.zero_grad()
            losses: list[torch.Tensor] = []
            output = None
            if first:
                pipe.step(self.images)
            elif last:
                output = pipe.step(target=self.labels, losses=losses)
            else:
                pipe.step()
            self.optimizer.step()
            # the last stage holds the micro-batch losses; every rank learns their mean
            mean = (
                torch.stack(losses).mean().detach()
                if losses
                else torch.zeros((), device=rank.device)
            )
            dist.all_reduce(mean)  # NCCL needs the tensor on the rank's GPU
            return mean.item(), output

        return step


def prove_step(
    trainer: StageTrainer, reference: nn.Module | None, schedule: str, m: int, lr: float
) -> dict | None:
    """One pipelined step vs the one-process step accumulated over the same micro-batches.

    ``reference`` (rank 0 only) is the whole model with the stages' current weights; the
    comparison comes back on rank 0, with each rank's peak of activation bytes kept for
    backward during a second step (``helpers.memory.SavedTensorMeter``): a new
    ``PipelineStage``'s first step also runs one micro-batch to infer shapes.
    """
    step = trainer.step_fn(schedule, m)
    loss, output = step()
    mine = (*snapshot(trainer.module), None if output is None else output.detach().cpu())
    with SavedTensorMeter(trainer.module) as meter:
        step()
    mine = (*mine, meter.peak.get(str(trainer.rank.device), 0))
    gathered: list | None = [None] * trainer.rank.world_size if trainer.rank.rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if gathered is None or reference is None:
        return None
    ref = accumulated_step(reference, trainer.images.cpu(), trainer.labels.cpu(), m, lr=lr)
    piped = StepResult(
        output=gathered[-1][2],
        loss=loss,
        grads=[g for part in gathered for g in part[0]],
        weights=[w for part in gathered for w in part[1]],
    )
    c = compare_steps(ref, piped)
    return {
        "schedule": schedule,
        "microbatches": m,
        "loss_pipelined": loss,
        "loss_reference": ref.loss,
        "output_diff": c.output,
        "loss_diff": c.loss,
        "grad_diff": c.grads,
        "weight_diff": c.weights,
        "worst_grad": c.worst_grad,
        "worst_weight": c.worst_weight,
        "peak_activation_bytes": [part[3] for part in gathered],
    }


def time_run(trainer: StageTrainer, schedule: str, m: int, steps: int, warmup: int) -> list[float]:
    """Seconds per training step, all stages finished (barrier before and after)."""
    step = trainer.step_fn(schedule, m)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        dist.barrier()
        start = synchronized_clock()
        step()
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
        if len(stages) != rank.world_size:
            raise ValueError(
                f"--split gives {len(stages)} stages but torchrun started {rank.world_size} processes; "
                "valid: one process per stage (--nproc-per-node = number of cut names + 1)"
            )
        images, labels = same_batch(args)
        trainer = StageTrainer(stages[rank.rank].to(rank.device), rank, images, labels, args.lr)
        result: dict = {
            "stages": rank.world_size,
            "backend": rank.backend,
            "split": ",".join(args.split),
            "batch": args.batch,
            "image_size": args.image_size,
            "runs": [],
        }
        if args.check:  # every schedule that is timed is first proven, from the same weights
            start = copy.deepcopy(trainer.module.state_dict())
            result["checks"] = []
            for schedule, m in dict.fromkeys(args.runs):
                trainer.module.load_state_dict(start)
                ref = copy.deepcopy(reference) if reference is not None else None
                result["checks"].append(prove_step(trainer, ref, schedule, m, lr=args.lr))
            trainer.module.load_state_dict(start)
        for schedule, m in args.runs:
            times = time_run(trainer, schedule, m, args.steps, args.warmup)
            result["runs"].append({"schedule": schedule, "microbatches": m, "times_s": times})
        write_result(rank, result)


if __name__ == "__main__":
    try:
        main()
    except NotUnderTorchrunError as error:
        sys.exit(f"{MODULE}: error: {error}")
