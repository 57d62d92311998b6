"""Predict a Llama-shaped transformer's training memory from its sizes.

The activation count follows Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", arXiv:2205.05198), redone for the model the
course builds (``helpers.models.llama``): pre-norm RMSNorm instead of LayerNorm,
a gated SiLU MLP (three matrices) instead of a GeLU MLP (two), fused attention that
keeps the log-sum-exp of each query row (4 bytes) instead of the full attention matrix,
no dropout and no biases. Per block and per token it keeps, in activation elements:
8 tensors of width h (the block input, the first norm's normalised value and output,
q, the attention output, the residual sum, the second norm's normalised value and
output), k and v (width kv_heads*head_dim each) and 4 tensors of the MLP's width f
(gate, silu(gate), up, their product); plus 4 bytes per norm row and per head for the
statistics. (The fused attention returns its output laid out so that merging the heads
back is a view, not a copy.) Korthikanti's GPT block keeps 34 bytes per token per unit of
h plus 5*a*s/h for the attention matrix (16-bit, with dropout masks).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransformerShape:
    """Sizes of a Llama-shaped decoder (``kv_heads`` < ``heads`` is grouped-query attention)."""

    hidden: int
    blocks: int
    heads: int
    ffn: int
    vocab: int
    kv_heads: int | None = None
    tied: bool = False  # the output head shares the embedding's weights

    def __post_init__(self) -> None:
        sizes = (self.hidden, self.blocks, self.heads, self.ffn, self.vocab, self.kv)
        if min(sizes) < 1 or self.hidden % self.heads or self.heads % self.kv:
            raise ValueError(
                f"cannot estimate {self}; valid: positive sizes, hidden a multiple of heads, "
                "heads a multiple of kv_heads"
            )

    @property
    def kv(self) -> int:
        """Key/value heads (equal to ``heads`` without grouped-query attention)."""
        return self.kv_heads or self.heads

    @property
    def kv_width(self) -> int:
        """Width of k (and of v): kv heads times the head dimension."""
        return self.kv * self.hidden // self.heads

    @classmethod
    def of(cls, config: object) -> TransformerShape:
        """From a ``helpers.models.llama.LMConfig`` (or anything with its field names)."""
        return cls(config.hidden, config.blocks, config.heads, config.ffn, config.vocab,
                   getattr(config, "kv_heads", None), getattr(config, "tied", False))

    def attention_parameters(self) -> tuple[int, int]:
        """(elements, tensors) of one block's attention: q, k, v, o."""
        return 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_width, 4

    def block_parameters(self) -> tuple[int, int]:
        """(elements, tensors) of one block: the attention, gate, up, down, two norms."""
        attn, tensors = self.attention_parameters()
        return attn + 3 * self.hidden * self.ffn + 2 * self.hidden, tensors + 5

    def embed_parameters(self) -> tuple[int, int]:
        """(elements, tensors) of the token embedding."""
        return self.vocab * self.hidden, 1

    def head_parameters(self) -> tuple[int, int]:
        """(elements, tensors) of the final norm and the output head (none when tied)."""
        if self.tied:
            return self.hidden, 1
        return self.hidden + self.vocab * self.hidden, 2

    def unit_parameters(self) -> tuple[int, int, int]:
        """Elements of the units a sharded run gathers one at a time: the embedding, one
        block, and the final norm with the head."""
        return (self.embed_parameters()[0], self.block_parameters()[0],
                self.head_parameters()[0])

    def stage_parameters(self, blocks: int, first: bool, last: bool) -> tuple[int, int, int]:
        """(elements, tensors, the largest unit's elements) of a pipeline stage of ``blocks``
        blocks; the first also holds the embedding, the last the final norm and head."""
        embed, block, head = self.unit_parameters()
        numel, tensors = (n * blocks for n in self.block_parameters())
        units = [block, embed if first else 0, head if last else 0]
        tensors += first * self.embed_parameters()[1] + last * self.head_parameters()[1]
        return numel + units[1] + units[2], tensors, max(units)

    def parameters(self) -> int:
        """All weights."""
        parts = (self.block_parameters()[0] * self.blocks, self.embed_parameters()[0],
                 self.head_parameters()[0])
        return sum(parts)

    def block_activation_bytes(self, tokens: int, element_size: int, tp: int = 1,
                               seq_parallel: bool = False) -> int:
        """Bytes one block keeps for backward for ``tokens`` = batch x sequence tokens.

        With tensor parallelism over ``tp`` ranks, q, k, v, the attention output and the
        MLP's four tensors are split; the six width-h tensors around the norms are
        replicated. ``seq_parallel`` splits four of them along the sequence (the block
        input, the two norms' normalised values, the residual sum) and the norms'
        statistics; the two norm outputs, all-gathered for the column-parallel
        projections, are kept whole by them (as PyTorch's ``SequenceParallel`` with
        ``ColwiseParallel`` keeps them; Megatron-LM keeps only this rank's tokens and
        all-gathers them again in backward).
        """
        h, f = self.hidden, self.ffn
        split = 2 * h + 2 * self.kv_width + 4 * f  # q, attention output, k, v, the MLP's 4
        replicated = 4 * h // tp + 2 * h if seq_parallel else 6 * h
        stat = _stat_size(element_size)
        per_token = (split // tp + replicated) * element_size + self.heads * stat // tp  # + lse
        norm_stats = tokens * 2 * stat // (tp if seq_parallel else 1)  # one rstd per norm row
        return tokens * per_token + norm_stats

    def block_input_bytes(self, tokens: int, element_size: int, tp: int = 1,
                          seq_parallel: bool = False) -> int:
        """Bytes of one block's input, all a recomputed block keeps until its backward
        (replicated over tensor-parallel ranks unless ``seq_parallel``)."""
        return tokens * self.hidden * element_size // (tp if seq_parallel else 1)

    def stage_activation_bytes(self, blocks: int, first: bool, last: bool, *, tokens: int,
                               element_size: int, tp: int = 1, recompute: bool = False,
                               seq_parallel: bool = False) -> tuple[int, int]:
        """(bytes a micro-batch keeps until its backward, extra bytes while one backward runs)
        on a stage of ``blocks`` blocks (the first with the embedding, the last the head).

        With ``recompute`` a block keeps only its input; its backward first reruns its
        forward, holding its activations again. The last stage's head is freed by then.
        """
        e = element_size
        block = self.block_activation_bytes(tokens, e, tp, seq_parallel)
        embed = self.embed_activation_bytes(tokens, tp) if first else 0
        head = self.head_activation_bytes(tokens, e, tp, seq_parallel) if last else 0
        if not recompute:
            return embed + blocks * block + head, 0
        kept = self.block_input_bytes(tokens, e, tp, seq_parallel)
        return embed + blocks * kept + head, max(0, block - kept - head)

    def embed_activation_bytes(self, tokens: int, tp: int = 1,
                               vocab_parallel: bool | None = None) -> int:
        """The embedding keeps its int64 token ids; a vocab-parallel one (by default when
        ``tp > 1``) also keeps a one-byte mask of the tokens outside its rows."""
        return (8 + _vocab_parallel(vocab_parallel, tp)) * tokens

    def head_activation_bytes(self, tokens: int, element_size: int, tp: int = 1,
                              seq_parallel: bool = False,
                              vocab_parallel: bool | None = None) -> int:
        """The final norm (input, normalised value, rstd; this rank's tokens only under
        ``seq_parallel``), the head's input (the norm's output, whole), and the loss.

        ``F.cross_entropy`` keeps the log-probabilities, the int64 labels and one number.
        The vocab-parallel loss (by default when ``tp > 1``) keeps this rank's columns of
        the softmax (the vocabulary padded to a multiple of ``tp``), the labels, and a
        one-byte mask of the tokens whose label is among its columns.
        """
        e, h, stat = element_size, self.hidden, _stat_size(element_size)
        norm = tokens * (2 * h * e + stat) // (tp if seq_parallel else 1)
        if not _vocab_parallel(vocab_parallel, tp):
            loss = tokens * (self.vocab * e + 8) + stat
        else:
            loss = tokens * (-(-self.vocab // tp) * e + 8 + 1)
        return norm + tokens * h * e + loss


def _stat_size(element_size: int) -> int:
    """Bytes of a statistic (the softmax's log-sum-exp, a norm's rstd, the loss): float32
    in float32 and in mixed precision (autocast keeps them in float32); float64 in it."""
    return max(4, element_size)


def _vocab_parallel(flag: bool | None, tp: int) -> bool:
    return tp > 1 if flag is None else flag


# Published shapes (the papers' tables): Llama 1 7B and Llama 2 70B.
LLAMA_7B_SHAPE = TransformerShape(hidden=4096, blocks=32, heads=32, ffn=11008, vocab=32000)
LLAMA_70B_SHAPE = TransformerShape(
    hidden=8192, blocks=80, heads=64, ffn=28672, vocab=32000, kv_heads=8
)
