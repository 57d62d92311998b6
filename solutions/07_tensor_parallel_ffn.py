"""Lesson 07's exercises, solved. Try them in the notebook first."""

import torch
import torch.distributed as dist


# %% Exercise 07.1: a rank's slices
def my_shard(fc1_weight: torch.Tensor, fc2_weight: torch.Tensor, rank: int,
             world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of fc1 (its output features), the same columns of fc2 (its input features)."""
    per = fc1_weight.shape[0] // world_size
    rows = slice(rank * per, (rank + 1) * per)
    return fc1_weight[rows], fc2_weight[:, rows]


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


ANSWERS = {"07.1": my_shard, "07.2": AllReduceSum, "07.3": step_bytes}
