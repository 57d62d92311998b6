"""Load imbalance is max over mean, per expert or per rank; DeepSeek-V3's bias update moves
each expert's bias towards balance, and repeated, evens a skewed router's load."""

from __future__ import annotations

import pytest
import torch

from helpers.expert_parallel.balance import imbalance, update_bias
from helpers.expert_parallel.moe import MoEShape, Router


def test_imbalance_is_the_most_loaded_over_the_mean():
    assert imbalance(torch.tensor([4, 4, 4, 4])) == 1.0
    assert imbalance(torch.tensor([16, 0, 0, 0])) == 4.0
    counts = torch.tensor([3, 1, 2, 2])
    assert imbalance(counts) == 1.5 and imbalance(counts, ep=2) == 1.0  # ranks hold 4 and 4


def test_imbalance_refuses_what_it_cannot_measure():
    with pytest.raises(ValueError, match="ep=3 does not divide experts=4"):
        imbalance(torch.tensor([1, 2, 3, 4]), ep=3)
    with pytest.raises(ValueError, match="no tokens counted"):
        imbalance(torch.zeros(4))


def test_the_bias_moves_by_the_rate_towards_the_mean():
    router = Router(MoEShape(hidden=4, ffn=4, experts=4, top_k=1), torch.float64)
    update_bias(router, torch.tensor([6, 2, 4, 4]), rate=0.5)
    assert router.bias.tolist() == [-0.5, 0.5, 0.0, 0.0]
    assert not router.bias.requires_grad


def test_repeated_updates_even_a_skewed_router():
    torch.manual_seed(0)
    router = Router(MoEShape(hidden=8, ffn=8, experts=8, top_k=2), torch.float64)
    x = torch.randn(256, 8, dtype=torch.float64) + 1.0  # tokens share a direction
    load = lambda: torch.bincount(router(x).experts.reshape(-1), minlength=8)  # noqa: E731
    before = imbalance(load())
    for _ in range(100):
        update_bias(router, load(), rate=0.003)
    assert before > 2.5 and imbalance(load()) < 1.15
