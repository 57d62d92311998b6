"""The vocabulary split over the ranks: a vocab-parallel embedding and cross-entropy.

Rank ``r`` owns the rows ``[start, end)`` of the embedding and of the output head
(``vocab_range``). A vocabulary that does not divide by the world size is padded up to
the next multiple (``pad=True``): the padding rows are zero and sit at the end of the
padded vocabulary, on the last rank (they reach further back only for a vocabulary under
world_size * (world_size - 1), e.g. 5 over 4 ranks); the loss masks their logits to -inf,
so the padded split computes exactly the unpadded model's loss and gradients. That is
this course's choice, made so that the split can be proven equal to one process.
Megatron-LM pads too (``vocab_size_with_padding`` in
``megatron/core/tokenizers/utils/build_tokenizer.py``), but its padding rows are dummy
tokens, initialised and trained like the others, and its vocab-parallel cross-entropy
(``megatron/core/tensor_parallel/cross_entropy.py``) masks no padding column, only the
targets outside a rank's slice: their logits enter the softmax, so its padded model is a
model with a larger vocabulary. The loss never gathers the logits: three all-reduces of
one number per token carry what softmax needs.
``simulate_vocab_parallel_loss`` replays those reductions in one process;
``naive_split_loss`` shows what a split that drops the remainder gets wrong.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers.tensor_parallel.mappings import g


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}; valid: an integer >= 1")
    return value


def padded_vocab(vocab: int, world_size: int) -> int:
    """``vocab`` rounded up to the next multiple of ``world_size``."""
    vocab, world_size = _positive("vocab", vocab), _positive("world_size", world_size)
    return -(-vocab // world_size) * world_size


def vocab_range(vocab: int, rank: int, world_size: int, *, pad: bool = False) -> tuple[int, int]:
    """The rows ``[start, end)`` of the (padded) vocabulary that rank ``rank`` owns."""
    total = padded_vocab(vocab, world_size)
    if total != vocab and not pad:
        valid = [p for p in range(1, min(vocab, 64) + 1) if vocab % p == 0]
        raise ValueError(
            f"vocab={vocab} is not divisible by world_size={world_size}; valid world sizes "
            f"for vocab {vocab}: {', '.join(map(str, valid))}{', ...' if vocab > 64 else ''}; "
            f"or pad=True (pads the vocabulary to {total})"
        )
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r}; valid: 0 .. {world_size - 1} for world size {world_size}")
    per_rank = total // world_size
    return rank * per_rank, (rank + 1) * per_rank


def _rows(weight: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Rows ``[start, end)`` of ``weight``, the ones past its end zero (padding)."""
    out = weight.new_zeros(end - start, *weight.shape[1:])
    real = max(0, min(end, weight.shape[0]) - start)
    out[:real] = weight[start:start + real]
    return out


def _check_tokens(tokens: torch.Tensor, vocab: int, what: str) -> None:
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab):
        bad = tokens[(tokens < 0) | (tokens >= vocab)][0].item()
        raise ValueError(f"{what} {bad} is out of range; valid: 0 .. {vocab - 1} (vocab={vocab})")


class VocabParallelEmbedding(nn.Module):
    """Rows ``[start, end)`` of an embedding; forward: local lookup, then g (all-reduce)."""

    def __init__(self, weight: torch.Tensor, start: int, vocab: int, group=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.start, self.end, self.vocab, self.group = start, start + len(weight), vocab, group

    @classmethod
    def from_full(cls, embedding: nn.Embedding, rank: int, world_size: int, group=None, *,
                  pad: bool = False) -> VocabParallelEmbedding:
        """Rank ``rank``'s rows of ``embedding`` (padding rows zero)."""
        vocab = embedding.num_embeddings
        start, end = vocab_range(vocab, rank, world_size, pad=pad)
        return cls(_rows(embedding.weight.detach(), start, end), start, vocab, group)

    def partial(self, tokens: torch.Tensor) -> torch.Tensor:
        """This rank's rows looked up; zeros for the tokens other ranks own."""
        _check_tokens(tokens, self.vocab, "token")
        outside = (tokens < self.start) | (tokens >= self.end)
        local = torch.where(outside, 0, tokens - self.start)
        return F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return g(self.partial(tokens), self.group)  # every token's row lives on one rank


def shard_head(head: nn.Linear, rank: int, world_size: int, *, pad: bool = False) -> nn.Linear:
    """Rows ``[start, end)`` of an output head (padding rows zero): rank ``rank``'s logits."""
    start, end = vocab_range(head.out_features, rank, world_size, pad=pad)
    shard = nn.Linear(head.in_features, end - start, bias=head.bias is not None)
    with torch.no_grad():
        shard.weight.copy_(_rows(head.weight.detach(), start, end))
        if head.bias is not None:
            shard.bias.copy_(_rows(head.bias.detach(), start, end))
    return shard.to(head.weight.device, head.weight.dtype)


def _masked(logits: torch.Tensor, start: int, vocab: int) -> torch.Tensor:
    """A slice's logits, its padding columns (``start + j >= vocab``) at -inf."""
    padding = start + torch.arange(logits.shape[-1], device=logits.device) >= vocab
    return logits.masked_fill(padding, float("-inf"))


def _target_logit(shifted: torch.Tensor, targets: torch.Tensor, start: int, end: int):
    """Each token's target logit if the target is in ``[start, end)``, else 0; and the mask."""
    inside = (targets >= start) & (targets < end)
    index = torch.where(inside, targets - start, 0).unsqueeze(-1)
    return torch.where(inside, shifted.gather(-1, index).squeeze(-1), 0.0), inside


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over vocabulary slices. Forward: three all-reduces of ``tokens``
    values each (MAX of the row maxima, SUM of the sums of exponentials, SUM of the target
    logits). In a ring of N ranks every rank sends 2(N-1)/N of each all-reduced tensor:
    6(N-1)/N x tokens numbers per rank in all, against (N-1)/N x tokens x vocab per rank
    for an all-gather of the logits. Backward: local, no communication."""

    @staticmethod
    def forward(ctx, logits, targets, start, end, vocab, group):
        ctx.start, ctx.shape = start, logits.shape
        logits = _masked(logits.reshape(-1, end - start), start, vocab)
        targets = targets.reshape(-1)
        row_max = logits.max(dim=-1).values
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        exp = (logits - row_max.unsqueeze(-1)).exp()
        sum_exp = exp.sum(dim=-1)
        dist.all_reduce(sum_exp, op=dist.ReduceOp.SUM, group=group)
        target, inside = _target_logit(logits - row_max.unsqueeze(-1), targets, start, end)
        dist.all_reduce(target, op=dist.ReduceOp.SUM, group=group)
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), targets, inside)
        return (sum_exp.log() - target).mean()

    @staticmethod
    def backward(ctx, grad_out):
        softmax, targets, inside = ctx.saved_tensors
        grad = softmax.clone()
        rows = torch.arange(len(grad), device=grad.device)[inside]
        grad[rows, targets[inside] - ctx.start] -= 1.0
        return (grad * (grad_out / len(grad))).reshape(ctx.shape), None, None, None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor,
                                 vocab_start: int, vocab_end: int, group=None, *,
                                 vocab: int) -> torch.Tensor:
    """Mean cross-entropy (as ``F.cross_entropy``) from this rank's logits for the
    vocabulary rows ``[vocab_start, vocab_end)`` (padding columns included); 3 all-reduces."""
    _positive("vocab", vocab)
    width = local_logits.shape[-1] if local_logits.dim() else 0
    if not 0 <= vocab_start < vocab_end or vocab_end - vocab_start != width:
        raise ValueError(f"vocab_start={vocab_start!r}, vocab_end={vocab_end!r} with logits of "
                         f"width {width}; valid: 0 <= start < end and end - start == width")
    if tuple(targets.shape) != tuple(local_logits.shape[:-1]):
        raise ValueError(f"targets of shape {tuple(targets.shape)}; valid: the logits' shape "
                         f"without its last dim, {tuple(local_logits.shape[:-1])}")
    _check_tokens(targets, vocab, "target")
    return _VocabParallelCrossEntropy.apply(local_logits, targets, vocab_start, vocab_end,
                                            vocab, group)


def _check_full(logits: torch.Tensor, targets: torch.Tensor) -> int:
    """The vocabulary size of full logits ``(..., vocab)``, after checking the targets."""
    if logits.dim() < 2 or tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)}; "
                         "valid: logits (..., vocab) and targets of the logits' shape without vocab")
    _check_tokens(targets, logits.shape[-1], "target")
    return logits.shape[-1]


def _reduce_slices(logits: torch.Tensor, targets: torch.Tensor,
                   ranges: list[tuple[int, int]]) -> tuple[float, dict]:
    """The three reductions over the slices ``ranges`` of the full logits, as plain ops."""
    vocab = logits.shape[-1]
    logits, targets = logits.detach().reshape(-1, vocab), targets.reshape(-1)
    total = max(end for _, end in ranges)
    padded = F.pad(logits, (0, max(0, total - vocab)))  # a zero head row gives a logit 0
    slices = [_masked(padded[:, start:end], start, vocab) for start, end in ranges]
    maxes = [piece.max(dim=-1).values for piece in slices]
    row_max = torch.stack(maxes).amax(dim=0).unsqueeze(-1)  # the all-reduce MAX
    sums = [(piece - row_max).exp().sum(dim=-1) for piece in slices]
    picked = [_target_logit(piece - row_max, targets, start, end)[0]
              for piece, (start, end) in zip(slices, ranges, strict=True)]
    loss = torch.stack(sums).sum(dim=0).log() - torch.stack(picked).sum(dim=0)  # two SUMs
    partials = {"ranges": ranges, "max": maxes, "sum_exp": sums, "target_logit": picked}
    return loss.mean().item(), partials


def simulate_vocab_parallel_loss(logits_full: torch.Tensor, targets: torch.Tensor,
                                 world_size: int, *, pad: bool = False) -> tuple[float, dict]:
    """The vocab-parallel loss in one process: (loss, per-rank partials). The partials hold
    each rank's ``ranges``, row ``max``, ``sum_exp`` and ``target_logit`` (shifted by the
    global max), lists indexed by rank."""
    vocab = _check_full(logits_full, targets)
    ranges = [vocab_range(vocab, r, world_size, pad=pad) for r in range(world_size)]
    return _reduce_slices(logits_full, targets, ranges)


def naive_split_loss(logits_full: torch.Tensor, targets: torch.Tensor,
                     world_size: int) -> tuple[float, float]:
    """(loss, relative error against ``F.cross_entropy``) of a naive split: each rank takes
    ``vocab // world_size`` columns, so the remainder belongs to no rank. Those columns
    leave the softmax, and a token whose target is among them gets no target logit from any
    rank (the sum over ranks is empty: it reads as the row's maximum)."""
    vocab = _check_full(logits_full, targets)
    per_rank = vocab // _positive("world_size", world_size)
    if per_rank == 0:
        raise ValueError(f"vocab={vocab} < world_size={world_size}; valid: world_size <= {vocab}")
    ranges = [(r * per_rank, (r + 1) * per_rank) for r in range(world_size)]
    loss, _ = _reduce_slices(logits_full, targets, ranges)
    right = F.cross_entropy(logits_full.detach().reshape(-1, vocab), targets.reshape(-1)).item()
    return loss, abs(loss - right) / abs(right)
