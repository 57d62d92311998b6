"""The one-process run every layout must equal, and the comparison of a layout's weights
with it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from helpers.composed.data import MarkovTask
from helpers.composed.experts import build_model
from helpers.composed.training import CPU, mean_loss, whole
from helpers.runs.llama_3d.config import DTYPES, ModelRun


@dataclass(frozen=True)
class Reference:
    """The one process's loss at every step, final weights by name, largest gradient."""

    losses: list[float]
    weights: dict[str, torch.Tensor]
    grad_scale: float


def _key(config: ModelRun, device: torch.device, scale: float, parts: int) -> tuple:
    return (config.model, config.moe, config.steps, config.seed, config.batch, config.seq,
            config.lr, config.dtype, str(device), scale, parts)


@functools.lru_cache(maxsize=4)
def _reference(key: tuple) -> Reference:
    lm, moe, steps, seed, batch, seq, lr, dtype, device, scale, parts = key
    model = build_model(lm, moe, seed).train().to(device=device, dtype=DTYPES[dtype])
    task, opt = MarkovTask(lm.vocab, seed), torch.optim.AdamW(model.parameters(), lr=lr)
    losses, grad_scale = [], 0.0
    for step in range(steps):
        ids, targets = (t.to(device) for t in task.batch(batch, seq, step))
        opt.zero_grad()
        loss = 0.0
        for i, t in zip(ids.chunk(parts), targets.chunk(parts), strict=True):
            part = mean_loss(model(i), t) / parts
            (part * scale).backward()
            loss += part.item()
        grad_scale = max([grad_scale, *(p.grad.abs().max().item() for p in model.parameters()
                                        if p.grad is not None)])  # an expert no token reached
        opt.step()
        losses.append(loss)
    return Reference(losses, {k: v.detach().clone() for k, v in model.named_parameters()},
                     grad_scale)


def reference_run(config: ModelRun, device: torch.device = CPU, scale: float = 1.0,
                  parts: int = 1) -> Reference:
    """The one-process model with the same flags (on ``device``; the MoE model with
    ``--experts``, its auxiliary loss unused): its loss at every step (on the whole global
    batch), its final weights by parameter name, its largest gradient element. ``scale``
    multiplies every gradient (1: the true one; 0.5 shows what a halved gradient does);
    ``parts`` accumulates each batch in that many slices (the same sums in another order)."""
    return _reference(_key(config, device, scale, parts))


def shared_reference(config: ModelRun, device: torch.device, group) -> Reference:
    """Collective over ``group``: its first rank runs :func:`reference_run`, the others
    receive its result (one one-process run for the whole group, not one per rank)."""
    first = dist.get_rank(group) == 0
    box: list = [None]
    if first:
        ref = reference_run(config, device)
        box[0] = Reference(ref.losses, {k: v.cpu() for k, v in ref.weights.items()},
                           ref.grad_scale)
    dist.broadcast_object_list(box, group_src=0, group=group)
    if first:
        return ref
    mine = box[0]
    return Reference(mine.losses, {k: v.to(device) for k, v in mine.weights.items()},
                     mine.grad_scale)


def compare_weights(module: torch.nn.Module, reference: dict[str, torch.Tensor], group,
                    counts: Callable[[str], bool]) -> tuple[float, int]:
    """(largest |w - w_ref|, parameters compared): collective over ``group``; a parameter
    is counted by the ranks for which ``counts(name)`` is true (one per parameter: its
    stage's first rank, or for an expert the first of the ranks that hold it)."""
    worst, count = 0.0, 0
    for name, p in module.named_parameters():
        full = whole(p.detach())  # every rank of the stage gathers the whole tensor
        worst = max(worst, (full - reference[name]).abs().max().item())
        count += counts(name)
    out = torch.tensor([worst, float(count)], dtype=torch.float64,
                       device=next(iter(reference.values())).device)
    dist.all_reduce(out[:1], op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(out[1:], group=group)
    return out[0].item(), int(out[1].item())
