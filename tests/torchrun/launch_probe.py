"""A tiny torchrun worker for the launcher tests.

Modes: ok, crash (rank 1 raises once rank 0 has written the all-reduce's result, while rank 0
waits in the next all-reduce) and hang (rank 1); max_over_ranks is tested on threads
(tests/torchrun/test_launch.py).
Each rank writes its pid into $PROBE_PID_DIR so tests check exactly their processes.
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from helpers.torchrun.ranks import init_rank, write_result

rank = init_rank("launch_probe")
if os.environ.get("PROBE_PID_DIR"):
    (Path(os.environ["PROBE_PID_DIR"]) / f"{rank.rank}.pid").write_text(str(os.getpid()))
mode = sys.argv[1]
if mode == "hang" and rank.rank == 1:
    time.sleep(600)
total = torch.tensor([rank.rank + 1.0])
dist.all_reduce(total)
result = {"sum": total.item(), "world": rank.world_size, "backend": rank.backend}
write_result(rank, result)
if mode == "crash":
    dist.barrier()  # rank 0's result is written
    if rank.rank == 1:
        raise RuntimeError("rank 1 exploded on purpose")
    dist.all_reduce(total)  # rank 0 waits here for the rank that failed
dist.destroy_process_group()
