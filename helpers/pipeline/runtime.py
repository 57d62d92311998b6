"""One pipelined training step and its proof, shared by lessons 03 and 04.

Each rank holds one chunk of the model (lesson 03: one ResNet50 stage per rank, GPipe or
1F1B) or several (lesson 04: interleaved 1F1B and zero bubble, chunks r, r + K, ...:
``rank_chunks``).
``build_pipeline`` wraps this rank's chunks in ``PipelineStage`` objects driven by one
schedule; ``train_step`` runs one optimizer step over all micro-batches; ``prove_step``
compares that step, on rank 0, with one process accumulating gradients over the same
micro-batches (``helpers.pipeline.schedule.accumulated_step``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle

from helpers.core.checks import StepComparison, StepResult, compare_steps, snapshot
from helpers.pipeline.schedule import accumulated_step

SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "zero_bubble": ScheduleInterleavedZeroBubble,
}
SCHEDULE_NAMES = tuple(SCHEDULES)
# chunks (stages) per rank: the interleaved schedules place two, looping over the ranks twice
CHUNKS_PER_RANK = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2, "zero_bubble": 2}


def rank_chunks(schedule: str, rank: int, ranks: int) -> list[int]:
    """Global chunk (stage) indices that ``rank`` holds: r, r + K, ... (looped placement)."""
    return [rank + i * ranks for i in range(CHUNKS_PER_RANK[schedule])]


@dataclass(frozen=True)
class RankPipeline:
    """This rank's chunks of the model, their stages, the schedule driving them, the optimizer."""

    chunks: dict[int, nn.Module]  # global chunk (stage) index -> this rank's module
    stages: list[PipelineStage]
    schedule: PipelineScheduleSingle | PipelineScheduleMulti
    optimizer: torch.optim.Optimizer
    first: bool  # holds chunk 0: feeds the input
    last: bool  # holds the last chunk: gets the target, computes the losses

    @property
    def device(self) -> torch.device:
        return self.stages[0].device


def build_pipeline(
    chunks: dict[int, nn.Module],
    total: int,
    schedule: str,
    microbatches: int,
    device: torch.device,
    lr: float,
) -> RankPipeline:
    """This rank's ``chunks`` (of ``total``, already on ``device``) driven by ``schedule``.

    A new ``PipelineStage`` infers its tensors' shapes at its first step (it runs the stage
    on one micro-batch's inputs to learn them), so a step meant to be measured is never a
    pipeline's first.
    """
    stages = [PipelineStage(module, index, total, device) for index, module in chunks.items()]
    kind = SCHEDULES[schedule]
    several = issubclass(kind, PipelineScheduleMulti)
    if not several and len(stages) != 1:
        raise ValueError(
            f"{schedule} drives one stage per rank, got chunks {sorted(chunks)}; valid: one chunk"
        )
    pipe = kind(stages if several else stages[0], microbatches, loss_fn=nn.MSELoss())
    params = [p for module in chunks.values() for p in module.parameters()]
    optimizer = torch.optim.SGD(params, lr=lr)
    return RankPipeline(chunks, stages, pipe, optimizer, 0 in chunks, total - 1 in chunks)


def train_step(
    pipe: RankPipeline, inputs: torch.Tensor, target: torch.Tensor, *, mean_loss: bool = False
) -> tuple[torch.Tensor | None, float | None]:
    """One SGD step over all micro-batches: (output, mean loss).

    The first rank feeds ``inputs``, the last gets ``target`` and returns the output (None
    elsewhere). With ``mean_loss`` every rank learns the micro-batch losses' mean (an
    all-reduce); without it the loss is None.
    """
    pipe.optimizer.zero_grad()
    losses: list[torch.Tensor] = []
    args = (inputs,) if pipe.first else ()
    kwargs = {"target": target, "losses": losses} if pipe.last else {}
    output = pipe.schedule.step(*args, **kwargs)
    pipe.optimizer.step()
    if not mean_loss:
        return output, None
    # the last rank holds the losses, the others add zero; NCCL needs the tensor on the device
    mean = torch.stack(losses).mean().detach() if losses else torch.zeros((), device=pipe.device)
    dist.all_reduce(mean)
    return output, mean.item()


@dataclass(frozen=True)
class ProvenStep:
    """Rank 0's proof of one pipelined step: its loss, the one-process loss, the comparison."""

    loss_pipelined: float
    loss_reference: float
    comparison: StepComparison
    reference: StepResult  # the one-process step, to reuse for another schedule at the same M


def prove_step(
    pipe: RankPipeline,
    reference: nn.Module | None,
    inputs: torch.Tensor,
    target: torch.Tensor,
    microbatches: int,
    lr: float,
) -> ProvenStep | None:
    """One pipelined step against one process accumulating gradients over the same micro-batches.

    Every rank sends its chunks' named gradients and updated weights (the last rank also
    the output) to rank 0, which takes the step with ``reference`` (the whole model with
    the same starting weights, rank 0 only) and compares; the other ranks get None.
    """
    output, loss = train_step(pipe, inputs, target, mean_loss=True)
    mine = (
        {index: snapshot(module) for index, module in pipe.chunks.items()},
        None if output is None else output.detach().cpu(),
    )
    gathered: list | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if gathered is None or reference is None:
        return None
    ref = accumulated_step(reference, inputs.cpu(), target.cpu(), microbatches, lr=lr)
    chunks = {index: named for snapshots, _ in gathered for index, named in snapshots.items()}
    in_order = [chunks[index] for index in sorted(chunks)]  # chunk 0, 1, ...: the model's order
    piped = StepResult(
        output=next(out for _, out in gathered if out is not None),
        loss=loss,
        grads=[g for grads, _ in in_order for g in grads],
        weights=[w for _, weights in in_order for w in weights],
    )
    return ProvenStep(loss, ref.loss, compare_steps(ref, piped), ref)


def prove_step_locally(
    pipe: RankPipeline,
    reference: nn.Module | StepResult,
    inputs: torch.Tensor,
    target: torch.Tensor,
    microbatches: int,
    lr: float,
    first_param: int,
) -> tuple[ProvenStep | None, StepResult]:
    """``prove_step`` with the reference on every rank: nothing but numbers is sent.

    Every rank takes the one-process step itself (``reference``: the whole model with the
    same starting weights, or that step already taken, as ``prove_step``) and compares
    its own chunk with the matching parameters of it, from position ``first_param`` of
    the whole model's parameters on (the stages hold them in the model's order); the last
    rank also compares the output. Rank 0 gathers the differences and returns the proof
    with the largest of each; every rank also returns its reference step, to reuse.
    """
    output, loss = train_step(pipe, inputs, target, mean_loss=True)
    ref = (reference if isinstance(reference, StepResult)
           else accumulated_step(reference, inputs.cpu(), target.cpu(), microbatches, lr=lr))
    grads, weights = [], []
    for module in pipe.chunks.values():
        g, w = snapshot(module)
        grads, weights = grads + g, weights + w
    end = first_param + len(grads)
    mine = compare_steps(
        StepResult(ref.output, ref.loss, ref.grads[first_param:end], ref.weights[first_param:end]),
        StepResult(ref.output if output is None else output.detach().cpu(), loss, grads, weights),
    )
    gathered: list | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if gathered is None:
        return None, ref
    worst_grad = max(gathered, key=lambda c: c.grads)
    worst_weight = max(gathered, key=lambda c: c.weights)
    comparison = StepComparison(
        output=max(c.output for c in gathered),
        loss=abs(ref.loss - loss),
        grads=worst_grad.grads,
        weights=worst_weight.weights,
        worst_grad=worst_grad.worst_grad,
        worst_weight=worst_weight.worst_weight,
    )
    return ProvenStep(loss, ref.loss, comparison, ref), ref
