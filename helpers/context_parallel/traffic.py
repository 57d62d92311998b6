"""What each rank sends per attention layer under each context-parallel variant.

With ``cp`` ranks, a rank holds ``s / cp`` tokens: a key (or value) block of
``kv = b x kv_heads x s/cp x head_dim`` elements and a query block of
``q = b x heads x s/cp x head_dim``.

- ring (either split): forward, the keys and values go round: ``cp - 1`` passes of both;
  backward, they go round again with their gradients, which take one more pass home:
  ``(cp - 1) x 4 kv + 2 kv``.
- all-gather: forward, an all-gather of the keys and of the values, ``(cp - 1) kv`` each;
  backward, a reduce-scatter of their gradients, as much again by the ring formula (gloo's
  reduce-scatter is an all-reduce: twice that).
- Ulysses: four all-to-alls each way (q, k, v in; the output back; backward the same
  tensors' gradients the other way), each sending ``(cp - 1) / cp`` of its tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

VARIANTS = ("ring", "zigzag", "allgather", "ulysses")


def validate_variant(variant: str) -> str:
    """``variant`` if it is one of :data:`VARIANTS`, else a ValueError naming them."""
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}; valid: {', '.join(VARIANTS)}")
    return variant


@dataclass(frozen=True)
class AttentionShape:
    """One attention layer's sizes, and the bytes of one element."""

    batch: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    element_bytes: int = 4

    def block(self, cp: int, heads: int) -> int:
        """Bytes of one rank's ``s / cp`` tokens of ``heads`` heads."""
        if cp < 1 or self.seq % cp:
            raise ValueError(f"cp={cp!r} must divide seq={self.seq}")
        return self.batch * heads * (self.seq // cp) * self.head_dim * self.element_bytes


@dataclass(frozen=True)
class LayerTraffic:
    """Bytes one rank sends for one attention layer."""

    forward: int
    backward: int

    @property
    def step(self) -> int:
        return self.forward + self.backward


def layer_traffic(variant: str, shape: AttentionShape, cp: int, gloo: bool = False) -> LayerTraffic:
    """What a rank sends per layer under ``variant`` (``gloo``: gloo's reduce-scatter)."""
    validate_variant(variant)
    kv, q = shape.block(cp, shape.kv_heads), shape.block(cp, shape.heads)
    if cp == 1:
        return LayerTraffic(0, 0)
    if variant in ("ring", "zigzag"):
        return LayerTraffic(2 * (cp - 1) * kv, 4 * (cp - 1) * kv + 2 * kv)
    if variant == "allgather":
        back = 2 * (cp - 1) * kv * (2 if gloo else 1)
        return LayerTraffic(2 * (cp - 1) * kv, back)
    each_way = (cp - 1) * (2 * q + 2 * kv) // cp
    return LayerTraffic(each_way, each_way)
