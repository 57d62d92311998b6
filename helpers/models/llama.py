"""Lesson 05: a small decoder-only language model built locally, shaped like Llama.

An embedding, a stack of identical transformer blocks, a final norm and an output
head. Each block is pre-norm attention plus a gated MLP, each wrapped in a residual
connection; the residual is why a block is marked unsplittable (``_no_split_modules``,
the attribute Hugging Face models use): both ends of the ``+`` must be on one device.
With ``LLAMA_7B`` the same class has Llama-7B's 6.74 billion weights (build it on the
meta device, as lesson 05 does, and nothing is allocated). Its attention
(:mod:`helpers.models.attention`) can be grouped-query (``kv_heads < heads``) with
rotary positions (``rope=True``), as Llama's is, and the output head can share the
embedding's weights (``tied=True``). Neither RoPE nor tying changes a placement (RoPE
has no weights; a tied head is one tensor used twice), so lesson 05 leaves them off and
lesson 09, whose tensor parallelism they do change, turns them on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from helpers.core.flags import option
from helpers.models.attention import GQAAttention, divisors

if TYPE_CHECKING:
    from helpers.memory.transformer import TransformerShape


@dataclass(frozen=True)
class LMConfig:
    """The small Llama's shape: declared here once, embedded by every run that trains it."""

    vocab: int = option(help="tokens in the vocabulary")
    hidden: int = option(help="model width: features per token")
    blocks: int = option(help="transformer blocks (depth)")
    ffn: int = option(help="the gated MLP's inner width")
    heads: int = option(help="attention (query) heads")
    kv_heads: int | None = option(None, "key/value heads (grouped-query attention); "
                                  "none: as many as heads")
    rope: bool = option(False, "rotary position embeddings on queries and keys")
    tied: bool = option(False, "the output head shares the embedding's weights")

    def __post_init__(self) -> None:
        if min(self.vocab, self.hidden, self.blocks, self.ffn, self.heads, self.kv) < 1:
            raise ValueError(f"every size must be >= 1; got {self}")
        if self.hidden % self.heads:
            raise ValueError(
                f"hidden={self.hidden} must be a multiple of heads={self.heads}; "
                f"valid heads: a divisor of {self.hidden}"
            )
        if self.heads % self.kv:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}; valid "
                             f"kv_heads: {', '.join(map(str, divisors(self.heads)))}")

    @property
    def kv(self) -> int:
        """Key/value heads (``heads`` without grouped-query attention)."""
        return self.kv_heads or self.heads


# Llama-7B's shape: 32 blocks of width 4096, MLP width 11008, 32 heads, 32000 tokens.
LLAMA_7B = LMConfig(vocab=32000, hidden=4096, blocks=32, ffn=11008, heads=32)


class MLP(nn.Module):
    """The gated MLP of Llama: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """One transformer block: ``x + attn(norm(x))``, then ``h + mlp(norm(h))``."""

    def __init__(self, hidden: int, ffn: int, heads: int, kv_heads: int | None = None,
                 rope: bool = False) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(hidden)
        self.attn = GQAAttention(hidden, heads, kv_heads or heads, rope)
        self.mlp_norm = nn.RMSNorm(hidden)
        self.mlp = MLP(hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x))  # residual: x and the attention output meet here
        return h + self.mlp(self.mlp_norm(h))


class TinyLM(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab)."""

    _no_split_modules = ["Block"]  # as in Hugging Face models: never cut a block in two

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.hidden)
        self.blocks = nn.ModuleList(
            Block(config.hidden, config.ffn, config.heads, config.kv, config.rope)
            for _ in range(config.blocks)
        )
        self.norm = nn.RMSNorm(config.hidden)
        self.head = nn.Linear(config.hidden, config.vocab, bias=False)
        if config.tied:  # one tensor: the head's rows are the tokens' embeddings
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def transformer_shape(self) -> TransformerShape:
        """Its sizes, for the memory estimator (``helpers.memory``'s ``HasTransformerShape``)."""
        from helpers.memory.transformer import TransformerShape  # not loaded with the model

        return TransformerShape.of(self.config)


def lm_config(vocab: int, hidden: int, blocks: int) -> LMConfig:
    """The course's Llama shape at these sizes: MLP width 4x hidden, 64 channels per head."""
    return LMConfig(vocab=vocab, hidden=hidden, blocks=blocks, ffn=4 * hidden,
                    heads=max(1, hidden // 64))


def build_lm(config: LMConfig, *, seed: int = 0) -> TinyLM:
    """A :class:`TinyLM` with weights drawn from ``seed`` (on the CPU, float32)."""
    torch.manual_seed(seed)
    return TinyLM(config).eval()
