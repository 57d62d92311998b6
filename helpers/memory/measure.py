"""Measure what one training step holds on each device: weights, grads, optimizer state,
activations (and, on CUDA, the allocator's peak)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from helpers.memory.ledger import DeviceMemory, Ledger
from helpers.memory.optimizers import make_optimizer, validate_optimizer
from helpers.memory.saved import SavedTensorMeter

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def default_loss(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for integer labels (over the last dim), else mean squared error."""
    if labels.dtype in (torch.int64, torch.int32):
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), labels.reshape(-1))
    return F.mse_loss(output, labels)


def local(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor``'s piece on this rank, and the tensor inside a collective's pending
    result (``AsyncCollectiveTensor``); a plain tensor is its own."""
    while True:
        inner = getattr(t, "_local_tensor", None)
        inner = getattr(t, "elem", None) if inner is None else inner
        if not isinstance(inner, torch.Tensor):
            return t
        t = inner


def nbytes(t: torch.Tensor) -> int:
    """Bytes of this rank's piece of ``t`` (of a plain tensor: its elements)."""
    piece = local(t)
    return piece.numel() * piece.element_size()


def _owner(model: nn.Module, parts: dict[str, nn.Module] | None):
    """A function from a parameter (or buffer) to the row it is charged to."""
    if not parts:
        return lambda t: str(t.device)
    where = {id(t): n for n, m in parts.items() for t in (*m.parameters(), *m.buffers())}
    missing = [n for n, p in model.named_parameters() if id(p) not in where]
    if missing:
        raise ValueError(f"parameters {missing[:3]} belong to no part; valid: parts that "
                         f"cover every parameter (given: {list(parts)})")
    return lambda t: where.get(id(t), next(iter(parts)))


def _check(model: nn.Module, inputs: torch.Tensor) -> None:
    params = list(model.parameters())
    if not params:
        raise ValueError(f"{type(model).__name__} has no parameters; valid: a model to train")
    first = params[0].device
    if inputs.device != first and not (first.type == "meta" or inputs.device.type == "cpu"):
        raise ValueError(f"inputs are on {inputs.device} but the model's first parameter is "
                         f"on {first}; valid: inputs on {first} (or on the CPU)")


def measure_training_memory(
    model: nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    *,
    optimizer: str = "sgd",
    loss_fn: Loss | None = None,
    lr: float = 0.01,
    parts: dict[str, nn.Module] | None = None,
) -> Ledger:
    """Run one training step and return what each device held, as a :class:`Ledger`.

    Rows are devices, or the named ``parts`` (submodules) when given: on one CPU, parts
    stand for the devices a split model would use (each part keeps its own copy of the
    activation it receives, as a real device does). The model's weights, buffers, grads
    and training flag are restored afterwards: measuring changes nothing.
    """
    validate_optimizer(optimizer)
    _check(model, inputs)
    loss_fn = loss_fn or default_loss
    owner = _owner(model, parts)
    params = list(model.parameters())
    saved = [t.detach().clone() for t in (*params, *model.buffers())]
    grads = [None if p.grad is None else p.grad.clone() for p in params]
    was_training = model.training
    cuda = {p.device for p in params if p.device.type == "cuda"}
    for device in cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    try:
        model.train(True)
        opt = make_optimizer(optimizer, params, lr)
        opt.zero_grad(set_to_none=True)
        with SavedTensorMeter(model, parts) as meter:
            output = model(inputs)
            loss = loss_fn(output, labels.to(output.device))
            loss.backward()
        opt.step()
        rows = {n: DeviceMemory() for n in parts} if parts else {}  # in the parts' order
        for t in (*params, *model.buffers()):
            rows.setdefault(owner(t), DeviceMemory()).weights += nbytes(t)
        for p in params:
            rows[owner(p)].grads += nbytes(p.grad) if p.grad is not None else 0
            state = opt.state.get(p, {})
            rows[owner(p)].optimizer_state += sum(
                nbytes(v) for v in state.values() if isinstance(v, torch.Tensor))
        for name, peak in meter.peak.items():
            rows.setdefault(name, DeviceMemory()).activations = peak
        if not parts:
            for device in cuda:
                torch.cuda.synchronize(device)
                rows[str(device)].peak_allocated = torch.cuda.max_memory_allocated(device)
        return Ledger(rows, note=f"measured: one training step, optimizer {optimizer}")
    finally:
        with torch.no_grad():
            for t, copy in zip((*params, *model.buffers()), saved, strict=True):
                t.copy_(copy)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        model.train(was_training)
