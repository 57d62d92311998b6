"""One Llama block (``helpers.models.llama.Block`` with GQA and RoPE) split the Megatron-LM
way over ``tp`` ranks, by hand.

Attention splits by heads: q, k and v are column-parallel (a rank keeps the rows of
its query and key/value heads), o is row-parallel (the matching input columns). The
gated MLP splits by its width: gate and up column-parallel, down row-parallel. Each
half is ``g(shard(f(norm(x))))``: f before (identity forward, all-reduce backward), g
after o and after down (all-reduce forward): two all-reduces forward, two backward.

The RMSNorm weights are replicated, and no extra all-reduce is needed for their
gradients. A norm's input is replicated (the block's input, or ``h`` after g's
all-reduce), so is its output. Backward, g is the identity: every rank computes the
same loss from the same output, so it receives the same gradient of it, hence of ``h``. Each rank's heads (or MLP columns)
give only a *partial* gradient of the norm's output, but f's backward all-reduces it:
the gradient leaving f is the full one, the same on every rank, and the norm weight's
gradient, ``sum over tokens of grad * x / rms(x)``, is made of replicated factors only.
Without f it would be one rank's share, and worse, so would the gradient flowing on to
the block's input: every weight before it would be wrong, which no all-reduce of the norm
gradients afterwards can repair. With sequence parallelism (each rank normalising its own
tokens) the sum over tokens is split, and then the norm gradients do need an all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from helpers.models.attention import AttentionHeads
from helpers.models.llama import MLP, Block
from helpers.tensor_parallel.attention_shards import check_head_split, head_ranges, valid_tp
from helpers.tensor_parallel.mappings import f, g
from helpers.tensor_parallel.sequence import gather_sequence, scatter_sequence

__all__ = ["TPBlock", "WeightCut", "format_split",
           "shard_block", "simulate_tp_block", "split_weights"]


@dataclass(frozen=True)
class WeightCut:
    """How one weight is dealt to a rank: ``rows`` or ``columns`` [start, stop), or whole."""

    how: str  # "rows" (column-parallel), "columns" (row-parallel) or "replicated"
    start: int
    stop: int
    size: int  # the full length along the cut dimension

    @property
    def dim(self) -> int | None:
        """The dimension cut: 0 for rows, 1 for columns, None when replicated."""
        return {"rows": 0, "columns": 1}.get(self.how)

    @property
    def length(self) -> int:
        """How many rows (or columns) of the full weight the rank holds; fewer than
        ``stop - start`` when the cut runs into padding past the end (a padded vocabulary)."""
        return max(0, min(self.stop, self.size) - self.start)

    def take(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of a full weight (or of its gradient): a view."""
        if self.dim is None:
            return full
        return full.narrow(self.dim, self.start, self.length)

    def own(self, shard: torch.Tensor) -> torch.Tensor:
        """The part of a rank's shard that is real weight (its padding rows left out)."""
        return shard if self.dim is None else shard.narrow(self.dim, 0, self.length)

    def __str__(self) -> str:
        if self.dim is None:
            return "replicated"
        return f"{self.how} {self.start}:{self.stop} of {self.size}"


def _sizes(block: Block) -> tuple[int, int, int, int, int]:
    """(hidden, ffn, heads, kv_heads, head_dim) of a block."""
    attn = block.attn
    ffn, hidden = block.mlp.gate_proj.weight.shape
    return hidden, ffn, attn.heads, attn.kv_heads, attn.head_dim


def check_tp(block: Block, tp: int) -> None:
    """Refuse a ``tp`` that does not split the heads, the key/value heads and the MLP evenly."""
    _, ffn, heads, kv_heads, _ = _sizes(block)
    check_head_split(heads, kv_heads, tp, ffn)
    if ffn % tp:
        raise ValueError(
            f"ffn={ffn} is not divisible by tp={tp}; valid tp for heads={heads}, "
            f"kv_heads={kv_heads}, ffn={ffn}: {', '.join(map(str, valid_tp(heads, kv_heads, ffn)))}"
        )


def split_weights(block: Block, rank: int, tp: int) -> dict[str, WeightCut]:
    """Each parameter of the block, by name: the part rank ``rank`` of ``tp`` holds."""
    check_tp(block, tp)
    hidden, ffn, heads, kv_heads, head_dim = _sizes(block)
    q, kv = head_ranges(heads, kv_heads, tp, rank)
    per = ffn // tp

    def cut(how: str, start: int, stop: int, size: int) -> WeightCut:
        return WeightCut(how, start, stop, size)

    q_cut = (q.start * head_dim, q.stop * head_dim, heads * head_dim)
    kv_cut = (kv.start * head_dim, kv.stop * head_dim, kv_heads * head_dim)
    ffn_cut = (rank * per, (rank + 1) * per, ffn)
    return {
        "attn_norm.weight": cut("replicated", 0, hidden, hidden),
        "attn.q_proj.weight": cut("rows", *q_cut),
        "attn.k_proj.weight": cut("rows", *kv_cut),
        "attn.v_proj.weight": cut("rows", *kv_cut),
        "attn.o_proj.weight": cut("columns", *q_cut),
        "mlp_norm.weight": cut("replicated", 0, hidden, hidden),
        "mlp.gate_proj.weight": cut("rows", *ffn_cut),
        "mlp.up_proj.weight": cut("rows", *ffn_cut),
        "mlp.down_proj.weight": cut("columns", *ffn_cut),
    }


def format_split(block: Block, tp: int) -> str:
    """A table: each weight, its full shape, and what every rank holds of it."""
    full = dict(block.named_parameters())
    cuts = [split_weights(block, r, tp) for r in range(tp)]
    width = max(map(len, full))
    lines = [f"{'weight':<{width}}  {'full shape':<12}  " + "  ".join(
        f"{f'rank {r}':<22}" for r in range(tp)).rstrip()]
    for name, param in full.items():
        shape = "x".join(map(str, param.shape))
        lines.append(f"{name:<{width}}  {shape:<12}  " + "  ".join(
            f"{str(c[name]):<22}" for c in cuts).rstrip())
    return "\n".join(lines)


class TPBlock(nn.Module):
    """Rank ``rank``'s share of a :class:`Block`: its heads, its MLP columns, both norms.

    Parameter names are the full block's, so :func:`split_weights` maps each to its slice.
    """

    def __init__(self, block: Block, rank: int, tp: int) -> None:
        super().__init__()
        check_tp(block, tp)
        hidden, ffn, heads, kv_heads, head_dim = _sizes(block)
        head_ranges(heads, kv_heads, tp, rank)  # checks the rank
        self.rank, self.tp = rank, tp
        self.attn_norm = nn.RMSNorm(hidden, eps=block.attn_norm.eps)
        self.attn = AttentionHeads(hidden, heads // tp, kv_heads // tp, head_dim, block.attn.rope)
        self.mlp_norm = nn.RMSNorm(hidden, eps=block.mlp_norm.eps)
        self.mlp = MLP(hidden, ffn // tp)

    def attention_partial(self, x: torch.Tensor, group=None) -> torch.Tensor:
        """This rank's heads' term of the attention output (f before them if ``group``)."""
        n = self.attn_norm(x)
        return self.attn(n if group is None else f(n, group))

    def mlp_partial(self, h: torch.Tensor, group=None) -> torch.Tensor:
        """This rank's MLP columns' term of the MLP output (f before them if ``group``)."""
        n = self.mlp_norm(h)
        return self.mlp(n if group is None else f(n, group))

    def forward(self, x: torch.Tensor, group=None, *, sequence_parallel: bool = False
                ) -> torch.Tensor:
        """The full block's output on every rank of ``group``: g sums the partial terms.

        With ``sequence_parallel`` ``x`` is this rank's ``seq / tp`` tokens and so is the
        output: f and g become an all-gather and a reduce-scatter along the sequence
        (``gather_sequence`` and ``scatter_sequence``, Korthikanti et al.'s g and g-bar).
        ``group=None`` runs without communication, which is the whole block only when
        ``tp == 1``; for more ranks in one process use :func:`simulate_tp_block`.
        """
        if group is None:
            if self.tp != 1:
                raise ValueError(
                    f"group=None with tp={self.tp}: nothing would sum the ranks' partial "
                    "outputs; valid: a process group of tp ranks, or simulate_tp_block"
                )
            h = x + self.attention_partial(x)
            return h + self.mlp_partial(h)
        if group.size() != self.tp:
            raise ValueError(f"a group of {group.size()} ranks for tp={self.tp}; valid: {self.tp}")
        if sequence_parallel:
            h = x + scatter_sequence(self.attn(gather_sequence(self.attn_norm(x), group)), group)
            return h + scatter_sequence(self.mlp(gather_sequence(self.mlp_norm(h), group)), group)
        h = x + g(self.attention_partial(x, group), group)
        return h + g(self.mlp_partial(h, group), group)


def shard_block(block: Block, rank: int, tp: int) -> TPBlock:
    """Rank ``rank``'s :class:`TPBlock`, its weights copied from ``block`` (device, dtype too)."""
    cuts = split_weights(block, rank, tp)
    weight = block.attn_norm.weight
    shard = TPBlock(block, rank, tp).to(weight.device, weight.dtype)
    full = dict(block.named_parameters())
    shard.load_state_dict({name: c.take(full[name].detach()) for name, c in cuts.items()})
    return shard


def simulate_tp_block(block: Block, x: torch.Tensor, tp: int) -> torch.Tensor:
    """All ``tp`` ranks in one process: each ``+`` of partial terms is where g all-reduces.

    Every shard reads the same ``x`` (and the same ``h``): that sharing is f's forward,
    and autograd adding up their input gradients is f's backward.
    """
    shards = [shard_block(block, rank, tp) for rank in range(tp)]
    attention = shards[0].attention_partial(x)
    for shard in shards[1:]:
        attention = attention + shard.attention_partial(x)
    h = x + attention
    mlp = shards[0].mlp_partial(h)
    for shard in shards[1:]:
        mlp = mlp + shard.mlp_partial(h)
    return h + mlp
