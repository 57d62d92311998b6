"""A torchrun worker for the tests: one training step through Megatron's f and g.

Every rank builds the same full model (same seed), cuts its own shard, and runs
``g(shard(f(x)))``; its shard's gradients must be the matching slices of the full
model's gradients, and the input gradient (all-reduced by f) the full model's.
"""

import torch
import torch.distributed as dist

from helpers.distributed import init_rank, write_result
from helpers.tp_comm import tp_forward
from helpers.tp_ffn import FeedForward, FeedForwardShard, make_input

rank = init_rank("gloo")
torch.manual_seed(1)
full = FeedForward(16, 32, "gelu")
shard = FeedForwardShard.from_full(full, rank.world_size, rank.rank, "gelu")
target = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(2))

x_full = make_input(2, 3, 16).requires_grad_()
torch.nn.functional.mse_loss(full(x_full), target).backward()
x_tp = make_input(2, 3, 16).requires_grad_()
out = tp_forward(shard, x_tp)
torch.nn.functional.mse_loss(out, target).backward()

rows = shard.rows()
diffs = {
    "output": (out - full(x_full)).abs().max().item(),
    "fc1": (shard.fc1.weight.grad - full.fc1.weight.grad[rows]).abs().max().item(),
    "fc2": (shard.fc2.weight.grad - full.fc2.weight.grad[:, rows]).abs().max().item(),
    "input": (x_tp.grad - x_full.grad).abs().max().item(),
}
worst = torch.tensor([max(diffs.values())])
dist.all_reduce(worst, op=dist.ReduceOp.MAX)
write_result(rank, {"diffs_rank0": diffs, "worst_all_ranks": worst.item()})
dist.destroy_process_group()
