"""Load balance: how uneven the experts' work is, and DeepSeek-V3's way to even it.

The slowest expert sets the pace: every rank waits for the rank whose experts got the
most tokens. ``imbalance`` is the most loaded expert's (or rank's) tokens over the mean:
1 is perfect balance, ``E`` is everything on one expert.

The auxiliary loss (:func:`~helpers.expert_parallel.moe.load_balancing_loss`) evens the
load through the gradient, at some cost to the language-model loss. DeepSeek-V3 does
without it: after each step every expert's selection bias moves a fixed ``rate`` towards
balance, up if it got fewer tokens than the mean, down if more. The bias changes only
which experts are chosen, never the gates (DeepSeek-V3 Technical Report, arXiv
2412.19437, section 2.1.2, "Auxiliary-Loss-Free Load Balancing").
"""

from __future__ import annotations

import torch

from helpers.expert_parallel.moe import Router


def imbalance(counts: torch.Tensor, ep: int | None = None) -> float:
    """Max over mean of ``counts`` (tokens per expert); with ``ep``, of the tokens per rank
    (experts split evenly over ``ep`` ranks, in order)."""
    counts = counts.to(torch.float64)
    if ep is not None:
        if ep < 1 or len(counts) % ep:
            raise ValueError(f"ep={ep!r} does not divide experts={len(counts)}")
        counts = counts.view(ep, -1).sum(1)
    mean = counts.mean()
    if mean == 0:
        raise ValueError("no tokens counted: imbalance is undefined")
    return (counts.max() / mean).item()


@torch.no_grad()
def update_bias(router: Router, counts: torch.Tensor, rate: float) -> None:
    """DeepSeek-V3's update, in place: ``bias_e += rate x sign(mean - count_e)`` for the
    batch's tokens per expert ``counts`` (in expert parallelism, summed over ranks)."""
    counts = counts.to(router.bias.dtype)
    router.bias += rate * torch.sign(counts.mean() - counts)
