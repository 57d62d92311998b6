"""What lesson 09's steps are proven against: the model, the batch, the one-process SGD
step, PyTorch's split's step (``parallelize_module``), and the comparison.

Every step takes the same weights, tokens and targets (the hand split's is the worker's
``rank_step``); :func:`step_diffs` compares what a rank holds after its step with its
slice of the one-process step: the logits, the loss and every gradient, and
:func:`weight_diffs` every updated weight, tensor by tensor. With SGD an updated weight is
``w - lr * grad``, so each tensor's bound follows from the gradients' (``results.
weight_tolerances``); Adam's first step would move every weight by about ``lr`` whatever
its gradient's size (lesson 06). :class:`LocalSavedMeter` measures what PyTorch's split
keeps for backward, as lesson 01's meter does for plain tensors.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from helpers.memory.saved import SavedTensorMeter, _Held
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


def native_step(model: TinyLM, ids: torch.Tensor, targets: torch.Tensor, lr: float, *,
                on_loss: Callable[[], None] | None = None) -> StepState:
    """One SGD step of a parallelized model: ``F.cross_entropy`` under ``loss_parallel`` on
    the vocabulary-sharded logits; what this rank holds (local shards) afterwards.
    ``on_loss`` runs between the loss and backward."""
    from torch.distributed.tensor.parallel import loss_parallel

    logits = model(ids)
    with loss_parallel():
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        if on_loss:
            on_loss()
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


def _gap(mine: torch.Tensor, other: torch.Tensor, cut, local: bool) -> float:
    theirs = cut.own(other) if local else cut.take(other)
    return (cut.own(mine).double() - theirs.double()).abs().max().item()


def step_diffs(model: TinyLM, rank: int, tp: int, mine: StepState, other: StepState, *,
               local: bool = False) -> dict[str, float]:
    """This rank's max |difference| of logits, loss and gradients: from its slice of the
    one-process step ``other``, or (``local``) from another rank-local step of the same
    split (PyTorch's)."""
    cuts = model_cuts(model, rank, tp)
    vocab = cuts["embed.weight"]
    theirs = other.logits[..., :vocab.length] if local else other.logits.narrow(
        -1, vocab.start, vocab.length)
    logits = mine.logits[..., :vocab.length].double() - theirs.double()
    return {"logits": logits.abs().max().item(), "loss": abs(mine.loss - other.loss),
            "gradients": max(_gap(mine.grads[n], other.grads[n], cut, local)
                             for n, cut in cuts.items())}


def weight_diffs(model: TinyLM, rank: int, tp: int, mine: StepState, other: StepState, *,
                 local: bool = False) -> dict[str, float]:
    """This rank's max |difference| of each updated weight tensor, by name (as
    :func:`step_diffs` compares)."""
    return {n: _gap(mine.weights[n], other.weights[n], cut, local)
            for n, cut in model_cuts(model, rank, tp).items()}


def magnitudes(reference: StepState) -> dict[str, float]:
    """The largest |value| of the logits, the loss and the gradients in the one-process
    step: their tolerances' scale."""
    return {"logits": reference.logits.abs().max().item(), "loss": abs(reference.loss),
            "gradients": max(t.abs().max().item() for t in reference.grads.values())}


def updates(before: torch.nn.Module, reference: StepState) -> dict[str, float]:
    """The largest |change| of each weight tensor in the one-process step, by name."""
    return {n: (reference.weights[n] - p.detach()).abs().max().item()
            for n, p in before.named_parameters()}


def _plain(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors inside ``t`` (a DTensor's local shard, a collective's pending
    result), read without recording an autograd operation; ``[t]`` for a plain tensor."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    inner = [getattr(t, name) for name in names]
    return [p for x in inner if isinstance(x, torch.Tensor) for p in _plain(x)]


class LocalSavedMeter(SavedTensorMeter):
    """Lesson 01's saved-tensor meter for a model of DTensors too: a tensor subclass that
    autograd saves is charged by the plain tensors inside it (a DTensor: its local shard,
    the bytes this rank holds), and a shard of a parameter is not counted."""

    def __init__(self, model: torch.nn.Module, parts: dict[str, torch.nn.Module]) -> None:
        super().__init__(model, parts)
        self._excluded = {p.untyped_storage()._cdata
                          for t in (*model.parameters(), *model.buffers()) for p in _plain(t)}

    def _pack(self, tensor: torch.Tensor) -> object:
        pieces = _plain(tensor)
        if len(pieces) == 1 and pieces[0] is tensor:
            return super()._pack(tensor)
        held = _Held(tensor)
        for piece in pieces:
            storage = piece.untyped_storage()
            if storage._cdata in self._excluded or storage.nbytes() == 0:
                continue
            key, nbytes = (self._part_of(piece), storage.data_ptr()), storage.nbytes()
            self._counts[key] += 1
            if self._counts[key] == 1:
                self.live[key[0]] += nbytes
                self.peak[key[0]] = max(self.peak[key[0]], self.live[key[0]])
            weakref.finalize(held, self._release, key, nbytes)
        return held
