"""Lesson 09's vocabulary split and sequence parallelism's g and g-bar to the letter.

The vocab-parallel cross-entropy on 1, 2 and 3 thread ranks (a real gloo group each,
``helpers.torchrun.in_notebook.run_ranks``) against ``F.cross_entropy`` on the full
logits, in value and gradient: a padded vocabulary, targets on the first and last column
of every slice, a sharp row whose maximum sits on one rank only, and a scaled upstream
gradient. The one-process simulation's partials worked out by hand. The sequence split's
gather and reduce-scatter, forward and backward, on 2 and 3 thread ranks against the same
computation in one process; the norms' gradient sum; the refusals, word for word.

Tolerances (chosen): float64 throughout, 1e-12 absolute on values of order 1 (the ranks
add the same terms in another order: a few hundred epsilons at most).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers.tensor_parallel.sequence import (
    all_reduce_sequence_grads,
    check_sequence_split,
    gather_sequence,
    scatter_sequence,
)
from helpers.tensor_parallel.vocab import (
    VocabParallelEmbedding,
    naive_split_loss,
    padded_vocab,
    shard_head,
    simulate_vocab_parallel_loss,
    vocab_parallel_cross_entropy,
    vocab_range,
)
from helpers.torchrun.in_notebook import run_ranks

TOL = 1e-12
F64 = torch.float64


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool((a - b).abs().max() <= TOL)


# ---------------------------------------------------------------- the vocabulary split


def test_padded_vocab_and_ranges_by_hand():
    """7 over 3 ranks pads to 9: (0, 3), (3, 6), (6, 9); 5 over 4 pads to 8."""
    assert padded_vocab(7, 3) == 9 and padded_vocab(9, 3) == 9 and padded_vocab(1, 1) == 1
    assert padded_vocab(5, 4) == 8 and padded_vocab(3, 4) == 4
    assert [vocab_range(7, r, 3, pad=True) for r in range(3)] == [(0, 3), (3, 6), (6, 9)]
    assert vocab_range(6, 2, 3) == (4, 6) and vocab_range(6, 0, 1) == (0, 6)
    assert vocab_range(7, 0, 1) == (0, 7)  # one rank: nothing to pad, pad or not


def test_the_refusals_name_the_valid_world_sizes():
    with pytest.raises(ValueError) as error:
        vocab_range(7, 0, 3)
    assert str(error.value) == ("vocab=7 is not divisible by world_size=3; valid world sizes "
                                "for vocab 7: 1, 7; or pad=True (pads the vocabulary to 9)")
    with pytest.raises(ValueError) as error:
        vocab_range(65, 0, 2)  # above 64: the list is cut, and says so
    assert str(error.value) == ("vocab=65 is not divisible by world_size=2; valid world sizes "
                                "for vocab 65: 1, 5, 13, ...; or pad=True (pads the vocabulary "
                                "to 66)")
    with pytest.raises(ValueError) as error:
        vocab_range(64, 0, 3)  # 64 itself is listed, and no "..."
    assert str(error.value).endswith("for vocab 64: 1, 2, 4, 8, 16, 32, 64; or pad=True "
                                     "(pads the vocabulary to 66)")
    with pytest.raises(ValueError) as error:
        vocab_range(6, 3, 3)
    assert str(error.value) == "rank=3; valid: 0 .. 2 for world size 3"
    with pytest.raises(ValueError) as error:
        padded_vocab(True, 2)
    assert str(error.value) == "vocab=True; valid: an integer >= 1"
    with pytest.raises(ValueError) as error:
        padded_vocab(4, 0)
    assert str(error.value) == "world_size=0; valid: an integer >= 1"
    padded_vocab(1, 1)  # 1 is valid for both


def test_rows_past_the_end_are_zero_and_the_last_real_row_is_kept():
    """7 rows over 3 ranks: rank 2 holds row 6 and two zero rows, rank 1 rows 3 to 5."""
    head = nn.Linear(2, 7, bias=True).to(F64)
    last, middle = shard_head(head, 2, 3, pad=True), shard_head(head, 1, 3, pad=True)
    assert last.weight.dtype == F64 and last.weight.shape == (3, 2)
    assert torch.equal(last.weight[0], head.weight[6]) and torch.all(last.weight[1:] == 0)
    assert torch.equal(last.bias, torch.cat([head.bias[6:], torch.zeros(2, dtype=F64)]))
    assert torch.equal(middle.weight, head.weight[3:6]) and torch.equal(middle.bias, head.bias[3:6])
    assert shard_head(nn.Linear(2, 6, bias=False), 0, 3).bias is None
    embedding = nn.Embedding(7, 2)
    for split in (lambda: shard_head(head, 0, 3),
                  lambda: VocabParallelEmbedding.from_full(embedding, 0, 3)):
        with pytest.raises(ValueError, match=r"not divisible by world_size=3; .* or pad=True"):
            split()  # padding is asked for, never the default
    shard = VocabParallelEmbedding.from_full(embedding, 2, 3, None, pad=True)
    assert (shard.start, shard.end, shard.vocab) == (6, 9, 7)
    assert torch.equal(shard.weight[0], embedding.weight[6]) and torch.all(shard.weight[1:] == 0)


def test_the_embedding_partial_is_zero_for_the_tokens_other_ranks_own():
    """Rank 1 of 3 over 6 rows owns tokens 2 and 3: its edges 1 and 4 are another rank's."""
    embedding = nn.Embedding(6, 3).to(F64)
    shard = VocabParallelEmbedding.from_full(embedding, 1, 3, None)
    tokens = torch.tensor([[1, 2, 3, 4], [0, 5, 3, 2]])
    partial = shard.partial(tokens)
    mine = ((tokens >= 2) & (tokens < 4)).unsqueeze(-1)
    assert torch.equal(partial, torch.where(mine, embedding(tokens), 0.0))
    single = VocabParallelEmbedding.from_full(embedding, 5, 6, None)  # one row: token 5
    assert torch.equal(single.partial(tokens), torch.where((tokens == 5).unsqueeze(-1),
                                                           embedding(tokens), 0.0))


def _logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g, dtype=F64) * 3


def _edge_targets(vocab: int, world_size: int, rows: int) -> torch.Tensor:
    """Every slice's first and last real column, then the rest cycling over the vocab."""
    per = padded_vocab(vocab, world_size) // world_size
    edges = sorted({c for r in range(world_size) for c in (r * per, min(vocab, (r + 1) * per) - 1)
                    if c < vocab})
    extra = [k % vocab for k in range(rows - len(edges))]
    return torch.tensor((edges + extra)[:rows])


# (world size, vocab, pad): one rank; 2 and 3 ranks dividing; 7 padded to 8 and 9;
# 5 over 3 (padded to 6); 2 over 3 (padded to 3: the last rank holds padding only)
LOSS_CASES = [(1, 7, False), (2, 6, False), (3, 9, False), (2, 7, True), (3, 7, True),
              (3, 5, True), (3, 2, True)]


@pytest.mark.parametrize(("world_size", "vocab", "pad"), LOSS_CASES)
def test_the_loss_on_ranks_is_cross_entropy_in_value_and_gradient(world_size, vocab, pad):
    """A mean over 2 x 5 tokens, its upstream gradient 0.37 (not 1): every rank's loss, and
    its slice of the gradient (its padding columns 0), against F.cross_entropy."""
    rows = (2, 5)
    logits = _logits(10, vocab).reshape(*rows, vocab)
    targets = _edge_targets(vocab, world_size, 10).reshape(rows)
    full = logits.clone().requires_grad_()
    expected = F.cross_entropy(full.reshape(-1, vocab), targets.reshape(-1))
    (0.37 * expected).backward()
    total = padded_vocab(vocab, world_size)
    padded = F.pad(logits, (0, total - vocab), value=5.0)  # padding logits: masked, any value

    def work(rank, group):
        start, end = vocab_range(vocab, rank, world_size, pad=pad)
        local = padded[..., start:end].clone().requires_grad_()
        loss = vocab_parallel_cross_entropy(local, targets, start, end, group, vocab=vocab)
        (0.37 * loss).backward()
        return loss.detach(), local.grad

    results = run_ranks(world_size, work, raise_errors=True)
    for loss, grad in results:
        assert loss.shape == () and abs(loss.item() - expected.item()) <= TOL
        assert grad.shape == (*rows, total // world_size)
    gathered = torch.cat([grad for _, grad in results], dim=-1)
    assert _close(gathered[..., :vocab], full.grad)
    assert torch.all(gathered[..., vocab:] == 0)


def test_a_row_whose_maximum_one_rank_holds_is_exact():
    """Logits 0 but one of 50, on rank 1's slice: rank 0 must shift by the global maximum
    50, not its own 0 (its terms would weigh e^50 times too much); by hand the losses are
    50 + log(1 + 3 e^-50) for target 0 and log(1 + 3 e^-50) for target 3."""
    logits = torch.zeros(2, 4, dtype=F64)
    logits[:, 3] = 50.0
    targets = torch.tensor([0, 3])
    by_hand = (50 + math.log1p(3 * math.exp(-50)) + math.log1p(3 * math.exp(-50))) / 2

    def work(rank, group):
        local = logits[:, 2 * rank:2 * rank + 2].clone().requires_grad_()
        loss = vocab_parallel_cross_entropy(local, targets, 2 * rank, 2 * rank + 2, group,
                                            vocab=4)
        loss.backward()
        return loss.item(), local.grad

    results = run_ranks(2, work, raise_errors=True)
    full = logits.clone().requires_grad_()
    F.cross_entropy(full, targets).backward()
    assert all(abs(loss - by_hand) <= TOL for loss, _ in results)
    assert _close(torch.cat([g for _, g in results], dim=-1), full.grad)


def test_the_refusals_of_the_loss_word_for_word():
    logits, targets = torch.zeros(3, 4), torch.tensor([0, 1, 2])
    cases = [
        ((logits, targets, 0, 5), {"vocab": 8},
         "vocab_start=0, vocab_end=5 with logits of width 4; valid: 0 <= start < end and "
         "end - start == width"),
        ((logits, targets, -1, 3), {"vocab": 8},
         "vocab_start=-1, vocab_end=3 with logits of width 4; valid: 0 <= start < end and "
         "end - start == width"),
        ((torch.zeros(0, 0), torch.zeros(0, dtype=torch.long), 0, 0), {"vocab": 8},
         "vocab_start=0, vocab_end=0 with logits of width 0; valid: 0 <= start < end and "
         "end - start == width"),
        ((torch.tensor(1.0), torch.tensor(0), 0, 1), {"vocab": 8},
         "vocab_start=0, vocab_end=1 with logits of width 0; valid: 0 <= start < end and "
         "end - start == width"),
        ((logits, targets[:2], 4, 8), {"vocab": 8},
         "targets of shape (2,); valid: the logits' shape without its last dim, (3,)"),
        ((torch.zeros(2, 3, 4), targets, 4, 8), {"vocab": 8},
         "targets of shape (3,); valid: the logits' shape without its last dim, (2, 3)"),
        ((logits, torch.tensor([0, 8, 9]), 4, 8), {"vocab": 8},
         "target 8 is out of range; valid: 0 .. 7 (vocab=8)"),
        ((logits, targets, 0, 4), {"vocab": 0}, "vocab=0; valid: an integer >= 1"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError) as error:
            vocab_parallel_cross_entropy(*args, None, **kwargs)
        assert str(error.value) == message


def test_the_simulation_partials_by_hand():
    """One token, logits [0, ln 2, ln 3, 0] over 2 ranks, target 1: the row max ln 3;
    rank 0 sums 1/3 + 2/3 = 1, rank 1 sums 1 + 1/3; the target logit ln 2 - ln 3 on rank 0
    (shifted), 0 from rank 1; the loss log(7/3) - log(2/3) = log(7/2)."""
    logits = torch.tensor([[0.0, math.log(2), math.log(3), 0.0]], dtype=F64)
    loss, parts = simulate_vocab_parallel_loss(logits, torch.tensor([1]), 2)
    assert abs(loss - math.log(7 / 2)) <= TOL
    assert parts["ranges"] == [(0, 2), (2, 4)]
    assert [m.tolist() for m in parts["max"]] == [[math.log(2)], [math.log(3)]]
    assert [round(s.item(), 12) for s in parts["sum_exp"]] == [1.0, round(4 / 3, 12)]
    assert abs(parts["target_logit"][0].item() - math.log(2 / 3)) <= TOL
    assert parts["target_logit"][1].tolist() == [0.0]
    # padded: 3 columns over 2 ranks, rank 1's padding column out of the softmax
    loss, parts = simulate_vocab_parallel_loss(logits[:, :3], torch.tensor([0]), 2, pad=True)
    assert parts["ranges"] == [(0, 2), (2, 4)] and abs(loss - math.log(6)) <= TOL
    assert parts["max"][1].tolist() == [math.log(3)]
    assert abs(parts["target_logit"][0].item() + math.log(3)) <= TOL


def test_rows_far_apart_each_take_their_own_maximum():
    """Rows around +1000 and -1000: shifted by one maximum for the whole batch, the second
    row's exponentials would all underflow to 0 (a loss of inf); by rows, each is exact."""
    logits = torch.tensor([[1000.0, 999.0, 998.0, 1000.0], [-1000.0, -999.0, -1001.0, -1000.0]],
                          dtype=F64)
    targets = torch.tensor([1, 1])
    loss, _ = simulate_vocab_parallel_loss(logits, targets, 2)
    assert abs(loss - F.cross_entropy(logits, targets).item()) <= TOL


def test_the_naive_split_by_hand_and_its_refusals():
    """Logits [0, 0, 0, ln 3] over 3 ranks take a column each: the last is dropped, so the
    loss of target 0 is log 3 (not log 6), and of target 3 it is log 3 - 0 (no rank has it,
    the max 0 reads as its logit): both log 3, against F.cross_entropy's mean of log 6 and
    log 2."""
    logits = torch.tensor([[0.0, 0.0, 0.0, math.log(3)]] * 2, dtype=F64)
    loss, error = naive_split_loss(logits, torch.tensor([0, 3]), 3)
    right = (math.log(6) + math.log(2)) / 2
    assert abs(loss - math.log(3)) <= TOL
    assert abs(error - abs(math.log(3) - right) / right) <= TOL
    with pytest.raises(ValueError) as error_info:
        naive_split_loss(logits, torch.tensor([0, 1]), 5)
    assert str(error_info.value) == "vocab=4 < world_size=5; valid: world_size <= 4"
    naive_split_loss(logits, torch.tensor([0, 1]), 4)  # one column a rank: allowed
    with pytest.raises(ValueError) as error_info:
        naive_split_loss(logits, torch.tensor([0, 1]), 0)
    assert str(error_info.value) == "world_size=0; valid: an integer >= 1"
    with pytest.raises(ValueError) as error_info:
        naive_split_loss(logits[0], torch.tensor(0), 2)
    assert str(error_info.value) == ("logits (4,) and targets (); valid: logits (..., vocab) "
                                     "and targets of the logits' shape without vocab")


def test_the_embedding_on_three_ranks_is_the_full_embedding_and_its_gradient():
    """7 rows padded to 9 over 3 ranks, tokens on every slice's edges."""
    torch.manual_seed(0)
    full = nn.Embedding(7, 3).to(F64)
    tokens = torch.tensor([[0, 2, 3, 5], [6, 1, 4, 6]])
    weights = torch.randn(2, 4, 3, dtype=F64)
    (weights * full(tokens)).sum().backward()

    def work(rank, group):
        shard = VocabParallelEmbedding.from_full(full, rank, 3, group, pad=True)
        out = shard(tokens)
        (weights * out).sum().backward()
        return out.detach(), shard.weight.grad

    expected = F.pad(full.weight.grad, (0, 0, 0, 2))
    for rank, (out, grad) in enumerate(run_ranks(3, work, raise_errors=True)):
        assert _close(out, full(tokens).detach()) and _close(grad, expected[3 * rank:3 * rank + 3])


# ---------------------------------------------------------------- the sequence split


def test_a_sequence_that_does_not_split_is_refused_with_the_valid_tp():
    with pytest.raises(ValueError) as error:
        check_sequence_split(6, 4)
    assert str(error.value) == ("seq=6 is not divisible by tp=4 (sequence parallelism gives "
                                "every rank seq/tp tokens); valid tp for seq=6: 1, 2, 3, 6")
    check_sequence_split(6, 3)
    check_sequence_split(6, 6)
    check_sequence_split(1, 1)


BATCH, HIDDEN = 4, 3  # (batch, seq, hidden): the sequence is dim 1; 2 tokens a rank


def _slices(tp: int, local: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(BATCH, local, HIDDEN, generator=g, dtype=F64) for _ in range(tp)]


@pytest.mark.parametrize("tp", [2, 3])
def test_gather_is_the_concatenation_and_its_backward_the_summed_slice(tp):
    """g: each rank's 2 tokens gathered in rank order along the sequence; backward, rank r
    gets the sum over ranks of the gradient's slice r (one process: autograd of the cat)."""
    xs, ws = _slices(tp, 2, seed=0), _slices(tp, 2 * tp, seed=1)
    leaves = [x.clone().requires_grad_() for x in xs]
    whole = torch.cat(leaves, dim=1)
    sum((w * whole).sum() for w in ws).backward()  # each rank's own loss of the whole

    def work(rank, group):
        x = xs[rank].clone().requires_grad_()
        out = gather_sequence(x, group)
        (ws[rank] * out).sum().backward()
        return out.detach(), out.is_contiguous(), x.grad

    for rank, (out, contiguous, grad) in enumerate(run_ranks(tp, work, raise_errors=True)):
        assert torch.equal(out, whole.detach()) and contiguous
        assert _close(grad, leaves[rank].grad) and grad.is_contiguous()


@pytest.mark.parametrize("tp", [2, 3])
def test_scatter_is_the_summed_slice_and_its_backward_the_gathered_gradient(tp):
    """g-bar: the sum over ranks, each keeping its 2 tokens; backward, every rank gets
    the gradients of all ranks' slices, concatenated (one process: autograd of the sum)."""
    ys, ws = _slices(tp, 2 * tp, seed=2), _slices(tp, 2, seed=3)
    leaves = [y.clone().requires_grad_() for y in ys]
    summed = sum(leaves)
    pieces = summed.split(2, dim=1)
    sum((w * p).sum() for w, p in zip(ws, pieces, strict=True)).backward()

    def work(rank, group):
        y = ys[rank].clone().requires_grad_()
        out = scatter_sequence(y, group)
        (ws[rank] * out).sum().backward()
        return out.detach(), out.is_contiguous(), y.grad

    for rank, (out, contiguous, grad) in enumerate(run_ranks(tp, work, raise_errors=True)):
        assert _close(out, pieces[rank].detach()) and contiguous
        assert _close(grad, leaves[rank].grad) and grad.is_contiguous()


def test_scatter_refuses_a_sequence_that_does_not_split():
    def work(rank, group):
        with pytest.raises(ValueError) as error:
            scatter_sequence(torch.zeros(1, 3, 2), group)
        return str(error.value)

    for message in run_ranks(2, work, raise_errors=True):
        assert message.startswith("seq=3 is not divisible by tp=2")


def test_the_norms_gradients_are_summed_over_the_ranks_in_one_flat_all_reduce():
    """Three weights with gradients (and one without, left alone) on 3 ranks: each ends
    with the sum over ranks; the count returned is the elements reduced, 4 + 3 + 2."""
    grads = [[torch.full((2, 2), float(r + 1)), torch.arange(3.0) * (r + 1),
              torch.tensor([1.0, -1.0]) * (r + 1)] for r in range(3)]

    def work(rank, group):
        a, b, c, d = (nn.Parameter(torch.zeros(n)) for n in ((2, 2), 3, 1, 2))
        a.grad, b.grad, d.grad = (g.clone() for g in grads[rank])
        n = all_reduce_sequence_grads([a, c, b, d], group)
        return n, a.grad, b.grad, c.grad, d.grad

    for n, a, b, c, d in run_ranks(3, work, raise_errors=True):
        assert n == 9 and c is None
        assert torch.equal(a, torch.full((2, 2), 6.0)) and torch.equal(b, torch.arange(3.0) * 6)
        assert torch.equal(d, torch.tensor([6.0, -6.0]))
    assert all_reduce_sequence_grads([nn.Parameter(torch.zeros(2))]) == 0  # nothing to send
