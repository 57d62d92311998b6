"""The small Llama's attention: grouped-query attention with rotary positions.

Grouped-query attention (GQA) has ``heads`` query heads but only ``kv_heads`` key and
value heads: query head ``i`` reads key/value head ``i // (heads // kv_heads)``. Keys and
values shrink by ``heads / kv_heads``, and so does the cache a generator keeps of them.
Rotary position embedding (RoPE) turns each query and key by an angle proportional to
its position, so that position enters their dot product only through the offset between
them; it has no weights.

The forward reads the number of heads from the projections' outputs, so the same module
runs one tensor-parallel rank's share of the heads (PyTorch's ``parallelize_module``
shrinks q, k, v and o in place; lesson 09 splits them by hand with
:class:`AttentionHeads` of ``heads / tp`` heads).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ROPE_BASE = 10000.0


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(a, b) -> (-b, a)`` over the two halves of the last dimension."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _turn(x: torch.Tensor, base: float, sign: float,
          at: torch.Tensor | None = None) -> torch.Tensor:
    """Each channel pair of ``x`` (batch, heads, seq, head_dim) turned by ``sign`` times
    its angle: ``p * base ** (-2j / head_dim)`` for pair ``(j, j + head_dim/2)`` at position p
    (``at``: each row's position; default 0..seq-1)."""
    seq, dim = x.shape[-2], x.shape[-1]
    if dim % 2:
        raise ValueError(f"head_dim={dim} is odd; valid: an even head_dim (channels go in pairs)")
    steps = torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim
    if at is not None and at.shape != (seq,):
        raise ValueError(f"positions of shape {tuple(at.shape)} for {seq} rows; valid: ({seq},)")
    positions = (torch.arange(seq, device=x.device) if at is None else at).to(torch.float32)
    angles = positions[:, None] * base ** -steps[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return x * angles.cos().to(x.dtype) + rotate_half(x) * (sign * angles.sin()).to(x.dtype)


class _Rope(torch.autograd.Function):
    """A rotation's gradient is the inverse rotation: backward turns the gradient back, so
    nothing is saved for it (autograd would otherwise keep the cos and sin tables)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, base: float) -> torch.Tensor:
        ctx.base = base
        return _turn(x, base, 1.0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _turn(grad, ctx.base, -1.0), None


class _RopeAt(torch.autograd.Function):
    """``_Rope`` at given positions: a rank holding some of a sequence's tokens (context
    parallelism) turns each by its true position, not by its row."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, base: float, at: torch.Tensor) -> torch.Tensor:
        ctx.base, ctx.at = base, at
        return _turn(x, base, 1.0, at)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _turn(grad, ctx.base, -1.0, ctx.at), None, None


def rope(x: torch.Tensor, base: float = ROPE_BASE,
         positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, heads, seq, head_dim), positions 0..seq-1
    (or ``positions``, one per row).

    Channel pair ``(j, j + head_dim/2)`` at position ``p`` turns by the angle
    ``p * base ** (-2j / head_dim)``. No weights: every rank applies it to its own heads.
    """
    return _Rope.apply(x, base) if positions is None else _RopeAt.apply(x, base, positions)


def check_positive(**sizes: int) -> None:
    """Refuse any size that is not an integer >= 1, by name."""
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}; valid: an integer >= 1")


class AttentionHeads(nn.Module):
    """Causal GQA over ``heads`` query and ``kv_heads`` key/value heads of ``head_dim``.

    q projects ``hidden -> heads * head_dim``, k and v ``hidden -> kv_heads * head_dim``,
    o ``heads * head_dim -> hidden``; no biases. The whole attention of a block, or one
    rank's share of it.
    """

    def __init__(
        self, hidden: int, heads: int, kv_heads: int, head_dim: int, rope: bool = True
    ) -> None:
        super().__init__()
        check_positive(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
        if heads % kv_heads:
            raise ValueError(
                f"heads={heads} is not a multiple of kv_heads={kv_heads}; valid kv_heads: "
                f"{', '.join(map(str, divisors(heads)))}"
            )
        if rope and head_dim % 2:
            raise ValueError(f"head_dim={head_dim} is odd; valid with rope=True: an even head_dim")
        self.heads, self.kv_heads, self.head_dim, self.rope = heads, kv_heads, head_dim, rope
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:  # heads counted from the width
            return t.view(batch, seq, -1, self.head_dim).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        if self.rope:
            q, k = rope(q), rope(k)
        # each key/value head serves heads/kv_heads neighbouring query heads; enable_gqa
        # reads them in place, where repeating them would keep copies for backward
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=q.shape[1] != k.shape[1])
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class GQAAttention(AttentionHeads):
    """A Llama block's attention: ``heads`` heads of ``hidden / heads`` channels each."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, rope: bool = True) -> None:
        check_positive(hidden=hidden, heads=heads)
        if hidden % heads:
            raise ValueError(
                f"hidden={hidden} is not divisible by heads={heads}; valid heads: "
                f"{', '.join(map(str, divisors(hidden)))}"
            )
        super().__init__(hidden, heads, kv_heads, hidden // heads, rope)


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]
