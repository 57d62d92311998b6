"""What one rank of the 3-D run holds: its shards of the training state, and the peak of
what autograd keeps for the backward pass (every micro-batch in flight on its stage)."""

from __future__ import annotations

import torch
from torch import nn

from helpers.memory.ledger import DeviceMemory
from helpers.memory.measure import local, nbytes
from helpers.memory.saved import SavedTensorMeter


def _bytes(tensors) -> int:
    return sum(nbytes(t) for t in tensors if isinstance(t, torch.Tensor))


def held(module: nn.Module, optimizer: torch.optim.Optimizer) -> DeviceMemory:
    """This rank's own pieces of the weights, their gradients and AdamW's state (call it
    after the backward, before ``zero_grad``; activations are the meter's)."""
    params = list(module.parameters())
    state = [v for s in optimizer.state.values() for v in s.values()]
    return DeviceMemory(weights=_bytes(params), grads=_bytes(p.grad for p in params),
                        optimizer_state=_bytes(state))


class StageMeter(SavedTensorMeter):
    """:class:`SavedTensorMeter` for a stage that ``fully_shard`` and ``DTensor`` rewrote.

    A weight is recognised by what it is, not by its storage: a ``Parameter`` (the sharded
    one, or the whole one ``fully_shard`` gathered for a forward), or a view of one, is
    not an activation; the input a pipeline stage received is. A ``DTensor`` counts its
    local piece.

    It keeps a detached alias of each saved tensor (the same storage, no ``grad_fn``).
    Keeping the tensor itself would close a loop when an operation saves its own output
    (``rsqrt``, ``exp``, attention): output -> its ``grad_fn`` -> the saved value -> the
    holder -> the output. A backward breaks that loop, but a graph dropped without one
    (the shape-inference forward of ``PipelineStage`` on the first stage, whose token
    ids need no gradient) would then stay alive as long as the process, held by the
    meter alone.
    """

    def __init__(self) -> None:
        super().__init__(nn.Module())

    def _pack(self, tensor: torch.Tensor) -> object:
        if tensor.is_meta:  # holds no memory (torch 2.14's shape inference uses real tensors)
            return tensor
        base = tensor if tensor._base is None else tensor._base
        if isinstance(base, nn.Parameter):  # a weight, or a view of one (its transpose)
            return tensor
        piece = local(tensor)
        if piece is tensor:
            return super()._pack(tensor.detach())
        return _Wrapped(tensor.detach(), super()._pack(piece.detach()))

    @staticmethod
    def _unpack(packed: object) -> torch.Tensor:
        if isinstance(packed, _Wrapped):
            return packed.tensor
        return SavedTensorMeter._unpack(packed)


class _Wrapped:
    """A ``DTensor`` kept for backward, with the holder that counts its local piece."""

    __slots__ = ("tensor", "holder")

    def __init__(self, tensor: torch.Tensor, holder: object) -> None:
        self.tensor, self.holder = tensor, holder
