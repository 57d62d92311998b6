"""A tiny torchrun worker for the launcher tests: ok, crash (rank 1) or hang (rank 1)."""

import os
import sys
import time

import torch
import torch.distributed as dist

from helpers.distributed import init_rank, write_result

rank = init_rank()
mode = sys.argv[1]
if mode == "crash" and rank.rank == 1:
    raise RuntimeError("rank 1 exploded on purpose")
if mode == "hang" and rank.rank == 1:
    time.sleep(600)
total = torch.tensor([rank.rank + 1.0])
dist.all_reduce(total)
write_result(
    rank,
    {"sum": total.item(), "world": rank.world_size, "backend": rank.backend, "pid": os.getpid()},
)
dist.destroy_process_group()
