"""The expert-parallelism lesson's exercises, solved. Try them in the notebook first."""

import torch


# %% Exercise 11.1: the bytes one rank sends in the dispatch all-to-all
def bytes_sent(counts: torch.Tensor, rank: int, hidden: int, element_bytes: int) -> int:
    """``counts`` (ep, E): each rank's (token, slot) rows per expert. Rank r holds experts
    r E/ep to (r+1) E/ep - 1; its rows for those stay home, every other row is sent."""
    ep, experts = counts.shape
    local = experts // ep
    mine = counts[rank]
    away = mine.sum() - mine[rank * local:(rank + 1) * local].sum()
    return int(away) * hidden * element_bytes


# %% Exercise 11.2: which assignments capacity drops
def capacity_drops(expert_choices: torch.Tensor, num_experts: int,
                   capacity: int) -> torch.Tensor:
    """Walk the (token, slot) assignments in token order, then slot order; each expert
    keeps its first ``capacity`` and drops the rest. True where dropped."""
    seen = [0] * num_experts
    dropped = torch.zeros_like(expert_choices, dtype=torch.bool)
    for token, slots in enumerate(expert_choices.tolist()):
        for slot, expert in enumerate(slots):
            seen[expert] += 1
            dropped[token, slot] = seen[expert] > capacity
    return dropped


# %% Exercise 11.3: why the experts' gradients are not all-reduced
# Each expert has one copy in the group, and every token routed to it, from every rank,
# reached it through the dispatch; the combine's backward sent each of those tokens'
# gradients back to it. Its weight gradient already sums every token: there is nothing to
# add it to. The router is copied on every rank and each copy saw its own tokens only.
why_not_all_reduced = "b"


ANSWERS = {"11.1": bytes_sent, "11.2": capacity_drops, "11.3": why_not_all_reduced}
