"""The whole small Llama split over ``tp`` ranks by hand: what each rank holds and runs.

A rank holds the rows ``[start, end)`` of the (padded) vocabulary in the embedding and
in the output head, its heads and MLP columns of every block (``transformer_block``),
and the norms whole. Its forward:

- the embedding looks up its own tokens; the ranks' lookups are summed (g, an
  all-reduce) or, with sequence parallelism, summed and cut by tokens (a reduce-scatter);
- each block: ``g(heads(f(norm(x))))``, then the same for the MLP; with sequence
  parallelism f and g become ``gather_sequence`` and ``scatter_sequence`` (Korthikanti
  et al.'s g and g-bar: ``sequence``'s docstring sorts out the two papers' names);
- the final norm, f, and the head's rows: this rank's slice of the logits, never
  gathered (under sequence parallelism the norm runs on this rank's tokens and
  ``gather_sequence`` takes f's place);
- the loss from the slices: ``vocab_parallel_cross_entropy``, three all-reduces.

Under sequence parallelism each rank's norms see only its tokens, so their weights'
gradients are partial sums: ``all_reduce_sequence_grads`` adds them up after backward.
"""

from __future__ import annotations

import torch
from torch import nn

from helpers.models.llama import TinyLM
from helpers.tensor_parallel.mappings import f, g
from helpers.tensor_parallel.sequence import (
    all_reduce_sequence_grads,
    check_sequence_split,
    gather_sequence,
    scatter_sequence,
)
from helpers.tensor_parallel.transformer_block import (
    TPBlock,
    WeightCut,
    check_tp,
    shard_block,
    simulate_tp_block,
    split_weights,
)
from helpers.tensor_parallel.vocab import (
    VocabParallelEmbedding,
    shard_head,
    vocab_parallel_cross_entropy,
    vocab_range,
)


def check_model_tp(model: TinyLM, tp: int, *, seq: int | None = None,
                   sequence_parallel: bool = False) -> None:
    """Refuse a ``tp`` that does not split every block (and, with sequence parallelism,
    the sequence); the vocabulary never is refused: it is padded."""
    for block in model.blocks[:1]:
        check_tp(block, tp)
    if sequence_parallel:
        if seq is None:
            raise ValueError("sequence_parallel=True needs seq= (the tokens per sequence)")
        check_sequence_split(seq, tp)


def model_cuts(model: TinyLM, rank: int, tp: int) -> dict[str, WeightCut]:
    """Every parameter of ``model``, by name: the part rank ``rank`` of ``tp`` holds."""
    check_model_tp(model, tp)
    vocab = model.config.vocab
    start, end = vocab_range(vocab, rank, tp, pad=True)
    cuts = {"embed.weight": WeightCut("rows", start, end, vocab)}
    for k, block in enumerate(model.blocks):
        cuts.update({f"blocks.{k}.{name}": cut
                     for name, cut in split_weights(block, rank, tp).items()})
    hidden = model.config.hidden
    cuts["norm.weight"] = WeightCut("replicated", 0, hidden, hidden)
    if not model.config.tied:
        cuts["head.weight"] = WeightCut("rows", start, end, vocab)
    return cuts


def _copy_norm(norm: nn.RMSNorm) -> nn.RMSNorm:
    out = nn.RMSNorm(norm.normalized_shape, eps=norm.eps).to(norm.weight.device, norm.weight.dtype)
    out.load_state_dict(norm.state_dict())
    return out


class TPLlama(nn.Module):
    """Rank ``rank``'s share of a :class:`~helpers.models.llama.TinyLM` (same names)."""

    def __init__(self, model: TinyLM, rank: int, tp: int) -> None:
        super().__init__()
        check_model_tp(model, tp)
        self.rank, self.tp, self.vocab = rank, tp, model.config.vocab
        self.vocab_start, self.vocab_end = vocab_range(self.vocab, rank, tp, pad=True)
        self.embed = VocabParallelEmbedding.from_full(model.embed, rank, tp, pad=True)
        self.blocks = nn.ModuleList(shard_block(block, rank, tp) for block in model.blocks)
        self.norm = _copy_norm(model.norm)
        self.head = shard_head(model.head, rank, tp, pad=True)
        if model.config.tied:
            self.head.weight = self.embed.weight

    def logits(self, ids: torch.Tensor, group, *, sequence_parallel: bool = False
               ) -> torch.Tensor:
        """This rank's columns of the logits, ``(batch, seq, padded_vocab / tp)``."""
        if group.size() != self.tp:
            raise ValueError(f"a group of {group.size()} ranks for tp={self.tp}; valid: {self.tp}")
        partial = self.embed.partial(ids)
        if sequence_parallel:
            check_sequence_split(ids.shape[1], self.tp)
            x = scatter_sequence(partial, group)
        else:
            x = g(partial, group)
        for block in self.blocks:
            x = block(x, group, sequence_parallel=sequence_parallel)
        x = self.norm(x)
        x = gather_sequence(x, group) if sequence_parallel else f(x, group)
        return self.head(x)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, group) -> torch.Tensor:
        """Mean cross-entropy over every token, from this rank's logits (3 all-reduces)."""
        return vocab_parallel_cross_entropy(logits, targets, self.vocab_start, self.vocab_end,
                                            group, vocab=self.vocab)

    def sequence_weights(self) -> list[nn.Parameter]:
        """The weights that see only this rank's tokens under sequence parallelism: the norms."""
        return [m.weight for m in self.modules() if isinstance(m, nn.RMSNorm)]

    def finish_backward(self, group, *, sequence_parallel: bool) -> int:
        """After backward: sum the norms' partial gradients under sequence parallelism
        (elements all-reduced; 0 without it, where f already made them whole)."""
        if not sequence_parallel:
            return 0
        return all_reduce_sequence_grads(self.sequence_weights(), group)


def simulate_tp_logits(model: TinyLM, ids: torch.Tensor, tp: int) -> torch.Tensor:
    """All ``tp`` ranks in one process, forward: the full logits, each ``+`` of partial
    terms where an all-reduce would sum them, the head's slices concatenated at the end."""
    shards = [TPLlama(model, rank, tp) for rank in range(tp)]
    x = sum(shard.embed.partial(ids) for shard in shards)
    for k in range(len(model.blocks)):
        x = simulate_tp_block(model.blocks[k], x, tp)
    n = shards[0].norm(x)
    logits = torch.cat([shard.head(n) for shard in shards], dim=-1)
    return logits[..., :model.config.vocab]  # the padding columns dropped


__all__ = ["TPBlock", "TPLlama", "check_model_tp", "model_cuts", "simulate_tp_logits"]
