"""A mixture-of-experts feed-forward layer on one device: the reference expert parallelism
must equal.

A dense transformer block sends every token through one feed-forward network (FFN). A
mixture of experts (MoE) holds ``E`` of them, the *experts*, and a small *router* that
picks ``k`` of them for each token: the token's output is the gate-weighted sum of its
``k`` experts' outputs. The parameters grow ``E`` times; the work per token only ``k``
times (Shazeer et al. 2017; Switch Transformer, Fedus et al. 2021; Mixtral, Jiang et al.
2024).

- the router scores each token against each expert (a linear layer, then a softmax) and
  keeps the ``k`` best; a per-expert ``bias`` shifts *which* experts win, never by how
  much they count (DeepSeek-V3's auxiliary-loss-free balancing, :mod:`.balance`);
- an expert may take at most ``capacity`` (token, slot) assignments per batch; the rest
  are *dropped* (they add nothing; a residual connection around the layer carries the
  token on), the first ones in token order kept (:func:`keep_within_capacity`);
- an auxiliary loss pushes the router towards spreading tokens evenly
  (:func:`load_balancing_loss`);
- an optional *shared* expert sees every token (DeepSeek-MoE).

Each expert is a SwiGLU MLP, the Llama FFN. The experts are stored under their global
number (``experts.5.gate_proj.weight``), so a rank that holds experts 4 to 7 keeps the
same names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class MoEShape:
    """The sizes of one MoE layer."""

    hidden: int
    ffn: int  # each expert's inner size
    experts: int
    top_k: int
    shared: bool = False  # one more expert that every token goes through
    capacity_factor: float | None = None  # None: no limit, nothing dropped

    def validate(self) -> MoEShape:
        """Itself, or a ValueError naming the bad value and what would be valid."""
        for name in ("hidden", "ffn", "experts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}; valid: an integer >= 1")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) \
                or not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k={self.top_k!r}; valid: an integer from 1 to "
                             f"experts={self.experts}")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor={self.capacity_factor!r}; valid: a number > 0, "
                             "or None for no limit")
        return self


@dataclass(frozen=True)
class Routing:
    """Where each of ``T`` tokens goes: its ``k`` slots, best first."""

    experts: torch.Tensor  # (T, k) long: the chosen experts
    gates: torch.Tensor  # (T, k): their weights, summing to 1 over the k
    probs: torch.Tensor  # (T, E): the softmax over every expert
    kept: torch.Tensor  # (T, k) bool: False where capacity dropped the assignment


class Router(nn.Module):
    """Scores tokens against experts and picks the ``top_k`` best of each token."""

    def __init__(self, shape: MoEShape, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        shape.validate()
        self.top_k = shape.top_k
        self.gate = nn.Linear(shape.hidden, shape.experts, bias=False, dtype=dtype)
        # added to the scores for choosing experts only: not a parameter, no gradient
        self.register_buffer("bias", torch.zeros(shape.experts, dtype=dtype))

    def forward(self, x: torch.Tensor) -> Routing:
        """Routing of ``x`` (T, hidden). The gates are the chosen experts' softmax
        probabilities renormalised to sum to 1 over the ``k`` (as Mixtral does: the same
        as a softmax over the chosen logits alone); the ``bias`` changes the choice, never
        the gates."""
        probs = F.softmax(self.gate(x), dim=-1)
        experts = torch.topk(probs.detach() + self.bias, self.top_k, dim=-1).indices
        chosen = probs.gather(-1, experts)
        gates = chosen / chosen.sum(-1, keepdim=True)
        return Routing(experts, gates, probs, torch.ones_like(experts, dtype=torch.bool))


def capacity(tokens: int, shape: MoEShape) -> int | None:
    """Most assignments one expert takes from ``tokens`` tokens:
    ``ceil(capacity_factor x tokens x top_k / experts)`` (None: no limit)."""
    if shape.capacity_factor is None:
        return None
    return math.ceil(shape.capacity_factor * tokens * shape.top_k / shape.experts)


def keep_within_capacity(experts: torch.Tensor, capacity: int | None,
                         num_experts: int) -> torch.Tensor:
    """Which (token, slot) assignments of ``experts`` (T, k) are kept: of each expert's,
    in token order, then slot order, the first ``capacity`` (None: all)."""
    if capacity is None:
        return torch.ones_like(experts, dtype=torch.bool)
    flat = experts.reshape(-1)  # (token, slot) order
    onehot = F.one_hot(flat, num_experts)
    place = (onehot.cumsum(0) * onehot).sum(-1) - 1  # how many came before, same expert
    return (place < capacity).view_as(experts)


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor,
                        num_experts: int) -> torch.Tensor:
    """The auxiliary loss ``E x sum_e f_e P_e`` (Switch Transformer, Fedus et al. 2021,
    eq. 4; GShard, Lepikhin et al. 2020): ``f_e`` is the share of the (token, slot)
    assignments that went to expert ``e`` (counted before any drop; no gradient), ``P_e``
    the mean router probability of ``e``. It is 1 when the router is uniform, and up to
    ``E`` when one expert takes everything."""
    counts = torch.bincount(experts.reshape(-1), minlength=num_experts)
    share = counts.to(probs.dtype) / experts.numel()
    return num_experts * (share * probs.mean(0)).sum()


class SwiGLU(nn.Module):
    """One expert: ``down(silu(gate(x)) * up(x))``, the Llama FFN, no biases."""

    def __init__(self, hidden: int, ffn: int, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(hidden, ffn, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(ffn, hidden, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def make_experts(shape: MoEShape, ids: range, dtype: torch.dtype | None = None) -> nn.ModuleDict:
    """The experts numbered ``ids``, each under its global number."""
    return nn.ModuleDict({str(e): SwiGLU(shape.hidden, shape.ffn, dtype) for e in ids})


class MoEFFN(nn.Module):
    """The whole MoE layer on one device."""

    def __init__(self, shape: MoEShape, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.shape = shape.validate()
        self.router = Router(shape, dtype)
        self.experts = make_experts(shape, range(shape.experts), dtype)
        self.shared = SwiGLU(shape.hidden, shape.ffn, dtype) if shape.shared else None
        self.last_routing: Routing | None = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` (batch, seq, hidden) or (T, hidden) -> (output of the same shape, the
        auxiliary loss). Tokens are taken in flattened order; a dropped (token, slot)
        adds nothing."""
        tokens = x.reshape(-1, self.shape.hidden)
        routing = self.router(tokens)
        limit = capacity(len(tokens), self.shape)
        kept = keep_within_capacity(routing.experts, limit, self.shape.experts)
        routing = replace(routing, kept=kept)
        self.last_routing = routing
        out = torch.zeros_like(tokens)
        for e, expert in self.experts.items():
            token, slot = torch.nonzero((routing.experts == int(e)) & kept, as_tuple=True)
            if len(token):
                weighted = routing.gates[token, slot, None] * expert(tokens[token])
                out = out.index_add(0, token, weighted)
        if self.shared is not None:
            out = out + self.shared(tokens)
        aux = load_balancing_loss(routing.probs, routing.experts, self.shape.experts)
        return out.view_as(x), aux
