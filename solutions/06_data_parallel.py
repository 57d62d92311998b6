"""Lesson 06's exercises, solved. Try them in the notebook first."""

import torch
import torch.distributed as dist


# %% Exercise 06.1: what a rank holds under ZeRO-2
def zero2_bytes(params: int, world_size: int) -> int:
    """Mixed-precision Adam, as the ZeRO paper counts it: every rank keeps all the 16-bit
    weights (2 bytes per parameter); the 16-bit gradients (2) and the float32 master
    weights, momentum and variance (12) are split over the ranks."""
    return 2 * params + (2 + 12) * params // world_size


# %% Exercise 06.2: why ZeRO-3 sends half as much again as DDP
def ring_bytes_per_step(stage: int, weight_bytes: int, world_size: int) -> float:
    """One ring pass (a reduce-scatter, or an all-gather) sends (N-1)/N of the tensor from
    each rank. DDP all-reduces the gradients: two passes. ZeRO-1 and -2 reduce-scatter the
    gradients and all-gather the updated weights once: two passes. ZeRO-3 frees each unit's
    weights after its forward, so it gathers them before the forward and again before the
    backward, then reduce-scatters the gradients: three passes, 1.5 times DDP's."""
    passes = 3 if stage == 3 else 2
    return passes * (world_size - 1) / world_size * weight_bytes


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


ANSWERS = {"06.1": zero2_bytes, "06.2": ring_bytes_per_step, "06.3": my_reduce_scatter}
