"""Lesson 07's exercises, solved. Try them in the notebook first."""

import torch
import torch.distributed as dist


# %% Exercise 07.1: Why one all-reduce is enough
def forward_values(tokens: int, hidden: int, ffn: int, world_size: int, plan: str) -> int:
    """Column-row: each rank's inner units are whole, so only g sums the output. Row-column:
    every unit is a partial sum until an all-reduce before the GeLU, and each rank ends
    with some output features, which an all-gather hands to all."""
    if world_size == 1:
        return 0  # one rank holds everything
    if plan == "column-row":
        return tokens * hidden
    return tokens * ffn + tokens * hidden


# %% Exercise 07.2: g as an autograd function
class AllReduceSum(torch.autograd.Function):
    """Megatron's g: sum the partial outputs forward; pass the gradient through backward."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor, group) -> torch.Tensor:
        out = partial.clone()  # all_reduce works in place; the input stays untouched
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None  # no gradient for the group argument


# %% Exercise 07.3: bytes one rank sends in a training step
def step_bytes(tokens: int, hidden: int, world_size: int, layers: int) -> float:
    """Per layer, g all-reduces the output forward and f the input gradient backward: two
    float32 tensors of tokens x hidden. A ring all-reduce of n bytes sends 2(p-1)/p of n."""
    n = tokens * hidden * 4
    return layers * 2 * (2 * (world_size - 1) / world_size * n)


ANSWERS = {"07.1": forward_values, "07.2": AllReduceSum, "07.3": step_bytes}
