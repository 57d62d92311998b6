"""Activation recomputation, measured: each block of a :class:`TinyLM` under
``torch.utils.checkpoint``, its saved bytes and its time against the prediction.

A checkpointed block keeps only its input for the backward pass; the backward first
runs the block's forward again, saving its activations as an ordinary forward would,
and uses them at once. Non-reentrant checkpointing routes what the block saves through
its own saved-tensor hooks, out of sight of a surrounding :class:`SavedTensorMeter`: the
meter sees the input the checkpoint keeps, but neither what the first forward discards
(rightly: it is not kept) nor what the recomputation holds during the backward. The
checkpoint here gives its recomputation a second pair of hooks that shows each tensor
to the hooks that surrounded the block's forward (the meter) before handing it to the
checkpoint's own, so the meter's peak includes the recomputed block.

What it measures, then: the token ids, every block's input, and the larger of the
head's activations (at the end of the forward) and one block's activations less its
input, already counted (while the last block is recomputed; the head's are freed by
then): ``estimate_training_memory(..., recompute=True)``, byte for byte in float32.
Finding the checkpoint's hooks uses ``torch._C._autograd._top_saved_tensors_default_hooks``,
the call ``torch.utils.checkpoint`` itself makes to find the hooks around it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from statistics import median

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

from helpers.core.sizes import format_bytes
from helpers.core.timing import Timing, measure_alternating
from helpers.memory.estimate import estimate_training_memory
from helpers.memory.ledger import Ledger
from helpers.memory.measure import default_loss, measure_training_memory

Hooks = tuple[Callable, Callable]


def _top_hooks() -> Hooks | None:
    """The (pack, unpack) pair a tensor saved now would go through, or None."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


class _ShowToOuter(saved_tensors_hooks):
    """Entered inside the checkpoint's recomputation: each tensor the recomputed forward
    saves is packed by ``outer`` (a detached view, so the outer hooks hold no graph), then
    by the hooks on top when entered (the checkpoint's, which store it for the backward).
    The outer hooks' handle lives as long as the recomputed graph, which outlasts every
    save of the recomputation: an outer meter's peak is exact, its live count drops early.
    """

    def __init__(self, outer: Hooks) -> None:
        self._inner: Hooks | None = None
        super().__init__(self._pack_both, self._unpack_inner)
        self._outer = outer

    def _pack_both(self, tensor: torch.Tensor) -> tuple[object, object]:
        return self._outer[0](tensor.detach()), self._inner[0](tensor)

    def _unpack_inner(self, packed: tuple[object, object]) -> torch.Tensor:
        return self._inner[1](packed[1])

    def __enter__(self) -> None:
        self._inner = _top_hooks()
        super().__enter__()


def _show_recomputation() -> tuple[contextlib.AbstractContextManager, object]:
    """``context_fn`` for ``checkpoint``: hooks around the forward (a meter) also see the
    recomputation; without such hooks nothing changes."""
    outer = _top_hooks()
    if outer is None or getattr(outer[0], "_checkpoint_internal", False):
        return contextlib.nullcontext(), contextlib.nullcontext()
    return contextlib.nullcontext(), _ShowToOuter(outer)


def _blocks_of(model: nn.Module) -> nn.ModuleList:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or not len(blocks):
        raise ValueError(f"a {type(model).__name__} has no blocks; valid: a model whose "
                         "`blocks` is a non-empty nn.ModuleList (TinyLM)")
    return blocks


class CheckpointedBlock(nn.Module):
    """``block`` run as ``checkpoint(block, x, use_reentrant=False)``: its forward hooks fire
    in the forward and again in the recomputation."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False, context_fn=_show_recomputation)


@contextlib.contextmanager
def checkpointed(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, each of ``model.blocks`` is a :class:`CheckpointedBlock`; the
    original blocks are put back afterwards (even after an error)."""
    blocks = _blocks_of(model)
    originals = list(blocks)
    if any(isinstance(b, CheckpointedBlock) for b in originals):
        raise ValueError("the blocks are checkpointed already; valid: one checkpointed() at a time")
    for k, block in enumerate(originals):
        blocks[k] = CheckpointedBlock(block)
    try:
        yield model
    finally:
        for k, block in enumerate(originals):
            blocks[k] = block


@dataclass(frozen=True)
class RecomputeResult:
    """One training step without and with recomputation: ledgers and times.

    ``measured`` and ``predicted`` map ``"plain"`` and ``"recompute"`` to ledgers (one
    row, the device); activations are the peak of the bytes saved for backward.
    ``times``: ``"plain"`` and ``"recompute"`` (forward and backward of one step) and
    ``"blocks forward"`` (the blocks' forward alone, what recomputation runs again).
    """

    measured: dict[str, Ledger]
    predicted: dict[str, Ledger]
    times: dict[str, Timing]

    def activations(self, kind: str) -> tuple[int, int]:
        """(measured, predicted) activation bytes for ``"plain"`` or ``"recompute"``."""
        if kind not in self.measured:
            raise ValueError(f"unknown kind {kind!r}; valid choices: {', '.join(self.measured)}")
        row = next(iter(self.measured[kind].rows))
        return self.measured[kind][row].activations, self.predicted[kind][row].activations

    @property
    def extra_time(self) -> float:
        """Measured: (median step with recomputation) / (median plain step) - 1."""
        return median(self.times["recompute"].times) / median(self.times["plain"].times) - 1

    @property
    def predicted_extra_time(self) -> float:
        """Predicted: the blocks' forward run once more, over the plain step (medians).

        Checkpointing also costs Python bookkeeping per saved tensor (a hook in the
        forward, another in the recomputation, a check of their shapes): on blocks as
        small as the course's CPU models it is of the order of their compute, so the
        measured extra exceeds this; for wide blocks the forward's share dominates.
        """
        return median(self.times["blocks forward"].times) / median(self.times["plain"].times)


    def table(self) -> str:
        """Activations measured and predicted, and the step times (medians), as text."""
        lines = [f"{'saved for backward':<20}{'measured':>12}{'predicted':>12}"]
        for kind in self.measured:
            measured, predicted = self.activations(kind)
            lines.append(f"{kind:<20}{format_bytes(measured):>12}{format_bytes(predicted):>12}")
        ms = {k: 1e3 * median(t.times) for k, t in self.times.items()}
        lines.append(f"step (median): plain {ms['plain']:.1f} ms, recompute {ms['recompute']:.1f} "
                     f"ms: {self.extra_time:+.0%}; the blocks' forward {ms['blocks forward']:.1f} "
                     f"ms predicts {self.predicted_extra_time:+.0%}")
        return "\n".join(lines)


def _step(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        default_loss(model(ids), labels).backward()
    return step


def _blocks_forward(model: nn.Module, ids: torch.Tensor) -> Callable[[], None]:
    x = model.embed(ids).detach()

    def run() -> None:
        y = x
        for block in _blocks_of(model):
            y = block(y)
    return run


def time_recompute(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, *,
                   repeats: int = 5, warmup: int = 1) -> dict[str, Timing]:
    """Alternating timings of a plain step, a recomputing step and the blocks' forward
    (gradients enabled, as when the backward reruns it); the model's grads restored."""
    plain = _step(model, ids, labels)

    def recomputing() -> None:
        with checkpointed(model):
            plain()
    grads = [p.grad for p in model.parameters()]
    try:
        return measure_alternating(
            {"plain": plain, "recompute": recomputing, "blocks forward": _blocks_forward(model, ids)},
            repeats=repeats, warmup=warmup)
    finally:
        for p, g in zip(model.parameters(), grads, strict=True):
            p.grad = g


def measure_recompute(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, *,
                      optimizer: str = "adam", repeats: int = 5,
                      warmup: int = 1) -> RecomputeResult:
    """Measure one training step of a TinyLM without and with recomputation, predict both
    with :func:`estimate_training_memory` (``recompute=False``/``True``), and time them.

    The measured activations are the peak of :class:`SavedTensorMeter` over the step
    (with recomputation, the recomputed block included: see the module's docstring); the
    prediction equals it byte for byte in float32. The model is left as it was.
    """
    batch, seq = ids.shape
    measured, predicted = {}, {}
    for kind in ("plain", "recompute"):
        with checkpointed(model) if kind == "recompute" else contextlib.nullcontext():
            measured[kind] = measure_training_memory(model, ids, labels, optimizer=optimizer)
        predicted[kind] = estimate_training_memory(
            model, batch=batch, seq=seq, optimizer=optimizer, names=list(measured[kind].rows),
            recompute=kind == "recompute")
    times = time_recompute(model, ids, labels, repeats=repeats, warmup=warmup)
    return RecomputeResult(measured, predicted, times)
