"""Lesson 06's exercises, solved. Try them in the notebook first."""

import torch
import torch.distributed as dist


# %% Exercise 06.1: what a rank holds under ZeRO-2
def zero2_bytes(params: int, world_size: int) -> int:
    """Mixed-precision Adam, as the ZeRO paper counts it: every rank keeps all the 16-bit
    weights (2 bytes per parameter); the 16-bit gradients (2) and the float32 master
    weights, momentum and variance (12) are split over the ranks."""
    return 2 * params + (2 + 12) * params // world_size


# %% Exercise 06.2: the smallest ZeRO stage for Llama-7B on 8 cards of 24 GiB
# from helpers.memory import LLAMA_7B_SHAPE, estimate_training_memory
# [k for k in range(4)
#  if estimate_training_memory(LLAMA_7B_SHAPE, batch=1, seq=4096, optimizer="adam",
#                              precision="mixed", dp=8, zero=k, recompute=True).sum().total
#  <= 24 * 2**30][0]
smallest_zero_stage_7b = 3


# %% Exercise 06.3: reduce-scatter from point-to-point sends
def my_reduce_scatter(full: torch.Tensor, rank: int, world_size: int, group) -> torch.Tensor:
    """A ring, as NCCL runs it: in N-1 steps each rank passes a running sum of one chunk to
    its right neighbour and adds the chunk it gets from its left one; after the last step
    chunk r of rank r holds the sum of every rank's chunk r. Each rank sends (N-1)/N of the
    tensor. (dist.all_reduce on a copy, then keeping chunk r, also works, and is how gloo
    runs its own reduce-scatter, but an all-reduce sends 2(N-1)/N: twice as much.)"""
    chunks = list(full.clone().chunk(world_size))  # the caller's tensor stays as it was
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(world_size - 1):
        send = chunks[(rank - step - 1) % world_size]
        into = chunks[(rank - step - 2) % world_size]
        incoming = torch.empty_like(into)
        request = dist.isend(send, right, group=group)  # no wait: the left neighbour sends too
        dist.recv(incoming, left, group=group)
        request.wait()
        into += incoming
    return chunks[rank]


ANSWERS = {"06.1": zero2_bytes, "06.2": smallest_zero_stage_7b, "06.3": my_reduce_scatter}
