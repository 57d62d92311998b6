"""The one-process run every layout must equal, and the comparison of a layout's weights
with it."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from helpers.composed.data import MarkovTask
from helpers.composed.training import CPU, mean_loss, whole
from helpers.models.llama import build_lm
from helpers.runs.llama_3d.config import DTYPES, ModelRun


@dataclass(frozen=True)
class Reference:
    """The one process's loss at every step, final weights by name, largest gradient."""

    losses: list[float]
    weights: dict[str, torch.Tensor]
    grad_scale: float


def _key(config: ModelRun, device: torch.device, scale: float, parts: int) -> tuple:
    return (config.model, config.steps, config.seed, config.batch, config.seq, config.lr,
            config.dtype, str(device), scale, parts)


@functools.lru_cache(maxsize=4)
def _reference(key: tuple) -> Reference:
    lm, steps, seed, batch, seq, lr, dtype, device, scale, parts = key
    model = build_lm(lm, seed=seed).train().to(device=device, dtype=DTYPES[dtype])
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
        grad_scale = max([grad_scale, *(p.grad.abs().max().item() for p in model.parameters())])
        opt.step()
        losses.append(loss)
    return Reference(losses, {k: v.detach().clone() for k, v in model.named_parameters()},
                     grad_scale)


def reference_run(config: ModelRun, device: torch.device = CPU, scale: float = 1.0,
                  parts: int = 1) -> Reference:
    """The one-process model with the same flags (on ``device``): its loss at every step
    (on the whole global batch), its final weights by parameter name, its largest
    gradient element. ``scale`` multiplies every gradient (1: the true one; 0.5 shows what
    a halved gradient does); ``parts`` accumulates each batch in that many slices (the
    same sums in another order)."""
    return _reference(_key(config, device, scale, parts))


def compare_weights(module: torch.nn.Module, reference: dict[str, torch.Tensor], group,
                    first: bool) -> tuple[float, int]:
    """(largest |w - w_ref|, parameters compared): collective over ``group``, each
    parameter counted once, by its stage's ``first`` rank."""
    worst, count = 0.0, 0
    for name, p in module.named_parameters():
        full = whole(p.detach())  # every rank of the stage gathers the whole tensor
        worst = max(worst, (full - reference[name]).abs().max().item())
        count += 1
    out = torch.tensor([worst, float(count) * first], dtype=torch.float64,
                       device=next(iter(reference.values())).device)
    dist.all_reduce(out[:1], op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(out[1:], group=group)
    return out[0].item(), int(out[1].item())
