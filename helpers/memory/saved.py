"""Count the bytes autograd keeps for the backward pass, live, per part of a model.

``torch.autograd.graph.saved_tensors_hooks`` sees every tensor an operation saves for
its backward. The meter wraps each in a small holder that autograd keeps exactly as
long as it keeps the saved tensor: when the holder is freed (after backward, or when
the graph is dropped) the bytes are released. Each storage is counted once per part,
and the model's parameters and buffers are not counted (they are its weights).
"""

from __future__ import annotations

import weakref
from collections import defaultdict

import torch
from torch import nn


class _Held:
    """What autograd stores instead of the tensor: the tensor, plus a weak-referenceable box."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedTensorMeter:
    """Live and peak saved-for-backward bytes, per part.

    ``parts`` maps a name to a submodule: a tensor saved while that submodule's forward
    (or, after it, code outside every part) runs is charged to it. Without parts a
    tensor is charged to its device. Use as a context manager around forward and
    backward; read :attr:`peak` (per part) and :attr:`live`.
    """

    def __init__(self, model: nn.Module, parts: dict[str, nn.Module] | None = None) -> None:
        own = [*model.parameters(), *model.buffers()]
        # a storage by identity, not address: a sharded weight freed and re-gathered (ZeRO-3)
        # keeps its storage object but changes its address
        self._excluded = {t.untyped_storage()._cdata for t in own}
        self.parts = dict(parts or {})
        self.live: dict[str, int] = defaultdict(int)
        self.peak: dict[str, int] = defaultdict(int)
        self.current = next(iter(self.parts), None)
        self._counts: dict[tuple[str, int], int] = defaultdict(int)
        self._handles: list = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _enter_part(self, name: str):
        def hook(module: nn.Module, args: object) -> None:
            self.current = name
        return hook

    def _part_of(self, tensor: torch.Tensor) -> str:
        return self.current if self.parts else str(tensor.device)

    def _pack(self, tensor: torch.Tensor) -> object:
        storage = tensor.untyped_storage()
        if storage._cdata in self._excluded or storage.nbytes() == 0:
            return tensor
        key, nbytes = (self._part_of(tensor), storage.data_ptr()), storage.nbytes()
        self._counts[key] += 1
        if self._counts[key] == 1:
            self.live[key[0]] += nbytes
            self.peak[key[0]] = max(self.peak[key[0]], self.live[key[0]])
        held = _Held(tensor)
        weakref.finalize(held, self._release, key, nbytes)
        return held

    def _release(self, key: tuple[str, int], nbytes: int) -> None:
        self._counts[key] -= 1
        if self._counts[key] == 0:
            del self._counts[key]
            self.live[key[0]] -= nbytes

    @staticmethod
    def _unpack(packed: object) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Held) else packed

    @property
    def live_bytes(self) -> int:
        """Bytes saved for the backward and alive now, every part together."""
        return sum(self.live.values())

    def reset_peak(self) -> None:
        """Start a new peak from what is live now."""
        self.peak = defaultdict(int, self.live)

    def __enter__(self) -> SavedTensorMeter:
        self._handles = [m.register_forward_pre_hook(self._enter_part(n))
                         for n, m in self.parts.items()]
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
