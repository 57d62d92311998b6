"""The same FFN through PyTorch's own tensor parallelism, one process per rank.

``torchrun --nproc-per-node=P -m helpers.tp_dtensor [tp_demo's flags]``: every rank builds
the source's FFN (``torch.manual_seed(seed)``), and ``parallelize_module`` shards it over a
1-D ``DeviceMesh``: ``ColwiseParallel`` on fc1 (each rank keeps ffn/P output rows) and
``RowwiseParallel`` on fc2 (the matching input columns, outputs all-reduced). Each rank
then checks that its local weight shards equal the hand-made shard files, and that the
output equals the hand-made tensor-parallel output (its partial, all-reduced).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from helpers.distributed import max_over_ranks, process_group, write_result
from helpers.timing import measure
from helpers.tp_demo import DemoConfig, build_model, parser
from helpers.tp_ffn import resolve_dtype

PLAN = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    config = DemoConfig.from_args(ns)
    config.validate()
    dtype = resolve_dtype(config.dtype)
    with process_group(config.rank_backend(int(os.environ["WORLD_SIZE"]))[0]) as rank:
        mesh = init_device_mesh(rank.device.type, (rank.world_size,))
        model = build_model(config).to(rank.device, dtype).eval()
        parallelize_module(model, mesh, PLAN)
        hand = config.load_shard(rank.world_size, rank.rank).to(rank.device, dtype)
        fc1_equal = torch.equal(model.fc1.weight.to_local(), hand.fc1.weight)
        fc2_equal = torch.equal(model.fc2.weight.to_local(), hand.fc2.weight)
        x = config.input_batch(dtype, rank.device)
        with torch.no_grad():
            out = model(x)  # a plain tensor: RowwiseParallel's output is all-reduced (Replicate)
            expected = hand(x)
            dist.all_reduce(expected)
            diff = max_over_ranks((out.float() - expected.float()).abs().max().item(), rank)
            timing = measure(
                lambda: model(x), repeats=config.iters - config.warmup, warmup=config.warmup
            )
        equal = max_over_ranks(0.0 if (fc1_equal and fc2_equal) else 1.0, rank) == 0.0
        write_result(
            rank,
            {
                "world_size": rank.world_size,
                "backend": rank.backend,
                "dtype": str(dtype),
                "fc1_local_shape": list(model.fc1.weight.to_local().shape),
                "fc2_local_shape": list(model.fc2.weight.to_local().shape),
                "fc1_placement": str(model.fc1.weight.placements[0]),
                "fc2_placement": str(model.fc2.weight.placements[0]),
                "local_shards_equal_files": equal,
                "max_diff_vs_hand_tp": diff,
                "checksum": out.double().sum().item(),
                "times_s": timing.times,
            },
        )
        dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
