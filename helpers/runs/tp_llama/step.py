"""What lesson 09's steps are proven against: the model, the batch, the one-process SGD
step, PyTorch's split's step (``parallelize_module``), and the comparison.

Every step takes the same weights, tokens and targets (the hand split's is the worker's
``rank_step``); :func:`step_diffs` compares what a rank holds after its step with its
slice of the one-process step: the logits, the loss, every gradient and every updated
weight. SGD keeps the weights' check as sharp as the gradients' (``w - lr * grad``);
Adam's first step would move every weight by about ``lr`` whatever its gradient's size
(lesson 06).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from helpers.models.llama import LMConfig, TinyLM, build_lm
from helpers.tensor_parallel.llama import model_cuts


def build_llama(config: LMConfig, seed: int) -> TinyLM:
    """The one-process model, weights drawn from ``seed``; norm weights drawn too (not all
    ones), so that their gradients carry information a wrong sum would change."""
    model = build_lm(config, seed=seed).train()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
    return model


def make_batch(vocab: int, batch: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, next-token targets), ``(batch, seq)`` each, from ``seed``."""
    generator = torch.Generator().manual_seed(seed + 2)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # not views of one tensor


@dataclass
class StepState:
    """What a step leaves: logits, loss, and each weight's gradient and new value, by name."""

    logits: torch.Tensor
    loss: float
    grads: dict[str, torch.Tensor]
    weights: dict[str, torch.Tensor]


def sgd(model: torch.nn.Module, lr: float) -> dict[str, torch.Tensor]:
    """One SGD update of every weight; the gradients it used, by name."""
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return grads


def reference_step(model: TinyLM, ids: torch.Tensor, targets: torch.Tensor,
                   lr: float, *, on_loss: Callable[[], None] | None = None) -> StepState:
    """One process, the whole model: ``F.cross_entropy`` on the full logits, one SGD step.
    ``on_loss`` runs between the loss and backward (when the most is kept for backward)."""
    logits = model(ids)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    if on_loss:
        on_loss()
    loss.backward()
    grads = sgd(model, lr)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return StepState(logits.detach(), loss.item(), grads, weights)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a replicated one's whole value); a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def _like(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A gradient laid out as its parameter: a replicated norm weight's gradient comes back
    ``Partial`` (each rank's sum over its own tokens) until it is redistributed."""
    if hasattr(grad, "redistribute") and grad.placements != param.placements:
        return grad.redistribute(param.device_mesh, param.placements)
    return grad


def native_step(model: TinyLM, ids: torch.Tensor, targets: torch.Tensor, lr: float) -> StepState:
    """One SGD step of a parallelized model: ``F.cross_entropy`` under ``loss_parallel`` on
    the vocabulary-sharded logits; what this rank holds (local shards) afterwards."""
    from torch.distributed.tensor.parallel import loss_parallel

    logits = model(ids)
    with loss_parallel():
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
    grads = {n: _local(_like(p.grad, p)).detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    weights = {n: _local(p).detach().clone() for n, p in model.named_parameters()}
    return StepState(_local(logits).detach(), _local(loss).item(), grads, weights)


def placements(model: TinyLM) -> dict[str, str]:
    """Each parameter's placement on the mesh (``replicated`` for a plain tensor)."""
    return {n: str(getattr(p, "placements", ("replicated",))[0]) for n, p in
            model.named_parameters()}


def _worst(mine: dict[str, torch.Tensor], other: dict[str, torch.Tensor], cuts: dict,
           local: bool) -> float:
    take = (lambda cut, t: cut.own(t)) if local else (lambda cut, t: cut.take(t))
    return max((cut.own(mine[name]).double() - take(cut, other[name]).double()).abs().max().item()
               for name, cut in cuts.items())


def step_diffs(model: TinyLM, rank: int, tp: int, mine: StepState, other: StepState, *,
               local: bool = False) -> dict[str, float]:
    """This rank's max |difference| per quantity: from its slice of the one-process step
    ``other``, or (``local``) from another rank-local step of the same split (PyTorch's)."""
    cuts = model_cuts(model, rank, tp)
    vocab = cuts["embed.weight"]
    theirs = other.logits[..., :vocab.length] if local else other.logits.narrow(
        -1, vocab.start, vocab.length)
    logits = mine.logits[..., :vocab.length].double() - theirs.double()
    return {"logits": logits.abs().max().item(), "loss": abs(mine.loss - other.loss),
            "gradients": _worst(mine.grads, other.grads, cuts, local),
            "weights": _worst(mine.weights, other.weights, cuts, local)}


def magnitudes(reference: StepState) -> dict[str, float]:
    """The largest |value| of each quantity in the one-process step: the tolerances' scale."""
    def top(tensors: dict[str, torch.Tensor]) -> float:
        return max(t.abs().max().item() for t in tensors.values())
    return {"logits": reference.logits.abs().max().item(), "loss": abs(reference.loss),
            "gradients": top(reference.grads), "weights": top(reference.weights)}
