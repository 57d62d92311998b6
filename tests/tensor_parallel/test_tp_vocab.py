"""The vocabulary split over ranks: ranges, the embedding, the loss, the simulation, the
naive split. Rank checks run on thread ranks of a real gloo group
(``helpers.torchrun.in_notebook.run_ranks``): the all-reduces really communicate."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers.comm.collectives import ring_bytes
from helpers.comm.meter import CommMeter
from helpers.core.checks import max_abs_diff
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

RTOL = 1e-6  # the loss, relative: float32 sums in another order (a few ulps)
ATOL = 1e-6  # outputs and gradients, absolute: values of order 1 in float32
# (world size, vocab, pad): divisible, and 10 over 4 ranks padded to 12 (2 padding rows)
CASES = [(2, 12, False), (4, 12, False), (2, 11, True), (4, 10, True)]


def _tokens(vocab, shape=(3, 5), seed=0):
    """Random tokens, the first one the vocabulary's last (in the last rank's slice)."""
    tokens = torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))
    tokens.view(-1)[0] = vocab - 1
    return tokens


def test_ranges_cover_the_vocabulary_once_and_padding_sits_on_the_last_rank():
    for vocab in (1, 8, 10, 13, 1000):
        for world_size in (1, 2, 3, 4, 8):
            ranges = [vocab_range(vocab, r, world_size, pad=True) for r in range(world_size)]
            assert ranges[0][0] == 0 and ranges[-1][1] == padded_vocab(vocab, world_size)
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
            assert len({end - start for start, end in ranges}) == 1
            if vocab % world_size == 0:
                assert ranges == [vocab_range(vocab, r, world_size) for r in range(world_size)]
    assert padded_vocab(10, 4) == 12 and vocab_range(10, 3, 4, pad=True) == (9, 12)
    assert [vocab_range(12, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 12)]


def test_a_vocabulary_that_does_not_divide_is_refused_without_pad():
    with pytest.raises(ValueError, match=r"vocab=10 is not divisible by world_size=4; valid "
                                         r"world sizes for vocab 10: 1, 2, 5, 10; or pad=True"):
        vocab_range(10, 0, 4)
    for bad in (-1, 4, "0", True):
        with pytest.raises(ValueError, match=r"rank=.*; valid: 0 \.\. 3 for world size 4"):
            vocab_range(12, bad, 4)
    for name, args in (("vocab", (0, 0, 1)), ("world_size", (8, 0, 0)), ("vocab", (2.5, 0, 1))):
        with pytest.raises(ValueError, match=rf"{name}=.*; valid: an integer >= 1"):
            vocab_range(*args)


@pytest.mark.parametrize(("world_size", "vocab", "pad"), CASES)
def test_embedding_on_ranks_equals_the_full_embedding_and_its_gradient(world_size, vocab, pad):
    torch.manual_seed(0)
    full = nn.Embedding(vocab, 6)
    tokens = _tokens(vocab)
    weights = torch.randn(*tokens.shape, 6)  # a random loss: sum(weights * output)
    (weights * full(tokens)).sum().backward()

    def work(rank, group):
        shard = VocabParallelEmbedding.from_full(full, rank, world_size, group, pad=pad)
        out = shard(tokens)
        (weights * out).sum().backward()
        return out.detach(), shard.weight.grad, (shard.start, shard.end)

    expected_grad = F.pad(full.weight.grad, (0, 0, 0, padded_vocab(vocab, world_size) - vocab))
    for out, grad, (start, end) in run_ranks(world_size, work, raise_errors=True):
        assert max_abs_diff(out, full(tokens)) <= ATOL
        assert max_abs_diff(grad, expected_grad[start:end]) <= ATOL


def _full_loss(vocab, shape=(3, 5)):
    torch.manual_seed(0)
    head = nn.Linear(8, vocab, bias=False)
    x, targets = torch.randn(*shape, 8), _tokens(vocab, shape, seed=1)
    logits = head(x).detach().requires_grad_()
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    return head, x, targets, loss.item(), logits.grad


@pytest.mark.parametrize(("world_size", "vocab", "pad"), [*CASES, (4, 5, True)])
def test_loss_on_ranks_equals_cross_entropy_and_its_gradient(world_size, vocab, pad):
    """(4, 5, True): 5 padded to 8, rank 3 holds padding only; its logits never win."""
    head, x, targets, expected, expected_grad = _full_loss(vocab)

    def work(rank, group):
        start, end = vocab_range(vocab, rank, world_size, pad=pad)
        local = shard_head(head, rank, world_size, pad=pad)(x).detach().requires_grad_()
        loss = vocab_parallel_cross_entropy(local, targets, start, end, group, vocab=vocab)
        loss.backward()
        return loss.item(), local.grad

    results = run_ranks(world_size, work, raise_errors=True)
    for loss, _ in results:
        assert abs(loss - expected) <= RTOL * abs(expected)
    gathered = torch.cat([grad for _, grad in results], dim=-1)
    assert max_abs_diff(gathered[..., :vocab], expected_grad) <= ATOL
    assert torch.all(gathered[..., vocab:] == 0)  # the padding columns get no gradient


def test_the_loss_sends_three_all_reduces_of_one_number_per_token_and_backward_none():
    tokens, world_size = 15, 2
    head, x, targets, *_ = _full_loss(12)

    def work(rank, group):
        local = shard_head(head, rank, world_size)(x).detach().requires_grad_()
        forward, backward = CommMeter(), CommMeter()
        with forward:
            loss = vocab_parallel_cross_entropy(local, targets, *vocab_range(12, rank, 2),
                                                group, vocab=12)
        with backward:
            loss.backward()
        return (dict(forward.per_collective.calls), forward.per_collective.ring["all_reduce"],
                backward.total_ring)

    expected = 3 * ring_bytes("all_reduce", world_size, tokens * 4)  # float32 numbers
    for calls, sent, backward_sent in run_ranks(world_size, work, raise_errors=True):
        assert calls == {"all_reduce": 3} and sent == expected and backward_sent == 0


def test_shard_head_keeps_rows_and_zeroes_padding():
    head = nn.Linear(4, 10)
    last = shard_head(head, 3, 4, pad=True)
    assert last.weight.shape == (3, 4)
    assert torch.equal(last.weight[0], head.weight[9]) and torch.all(last.weight[1:] == 0)
    assert torch.equal(last.bias, torch.cat([head.bias[9:], torch.zeros(2)]))


@pytest.mark.parametrize(("world_size", "vocab", "pad"), [*CASES, (3, 10, True), (4, 5, True)])
def test_simulation_equals_cross_entropy(world_size, vocab, pad):
    head, x, targets, expected, _ = _full_loss(vocab)
    loss, partials = simulate_vocab_parallel_loss(head(x), targets, world_size, pad=pad)
    assert abs(loss - expected) <= RTOL * abs(expected)
    assert len(partials["sum_exp"]) == world_size and partials["ranges"][-1][1] >= vocab


def test_naive_split_is_far_off_when_the_vocabulary_does_not_divide():
    torch.manual_seed(0)
    logits, targets = torch.randn(64, 10), torch.randint(0, 10, (64,))
    naive, error = naive_split_loss(logits, targets, 4)  # columns 8 and 9 belong to no rank
    right, _ = simulate_vocab_parallel_loss(logits, targets, 4, pad=True)
    assert error > 0.10
    assert abs(right - F.cross_entropy(logits, targets).item()) <= RTOL * right
    assert naive_split_loss(logits, targets, 2)[1] <= RTOL  # 10 divides by 2: nothing dropped


def test_bad_inputs_are_refused():
    logits, targets = torch.randn(4, 10), torch.tensor([0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"target 10 is out of range; valid: 0 \.\. 9"):
        simulate_vocab_parallel_loss(logits, torch.tensor([0, 1, 10, 3]), 2)
    with pytest.raises(ValueError, match="or pad=True"):
        simulate_vocab_parallel_loss(logits, targets, 4)
    with pytest.raises(ValueError, match=r"targets \(3,\); valid"):
        naive_split_loss(logits, targets[:3], 2)
    with pytest.raises(ValueError, match=r"vocab=10 < world_size=11; valid: world_size <= 10"):
        naive_split_loss(logits, targets, 11)
    with pytest.raises(ValueError, match=r"end - start == width"):
        vocab_parallel_cross_entropy(logits[:, :5], targets, 0, 6, None, vocab=10)
    with pytest.raises(ValueError, match=r"targets of shape \(3,\)"):
        vocab_parallel_cross_entropy(logits[:, :5], targets[:3], 0, 5, None, vocab=10)
    with pytest.raises(ValueError, match=r"target -1 is out of range"):
        vocab_parallel_cross_entropy(logits[:, :5], -targets, 0, 5, None, vocab=10)
    shard = VocabParallelEmbedding.from_full(nn.Embedding(10, 2), 0, 2, None)
    with pytest.raises(ValueError, match=r"token 12 is out of range; valid: 0 \.\. 9"):
        shard(torch.tensor([1, 12]))
