"""The same FFN through PyTorch's own tensor parallelism, one process per rank.

    torchrun --nproc-per-node=P -m helpers.tensor_parallel.dtensor_worker [tp_demo's flags]

Every rank builds the source's FFN (``torch.manual_seed(seed)``) and ``parallelize_module``
shards it over a 1-D ``DeviceMesh`` with ``dtensor_plan()``: ``ColwiseParallel`` on fc1,
``RowwiseParallel`` on fc2. Each rank checks that its local weight shards equal the
hand-made shard files, and that the output equals the hand-made ``g(shard(f(x)))``.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

from helpers.core.devices import resolve_dtype
from helpers.core.timing import measure
from helpers.distributed.ranks import max_over_ranks, process_group, worker_main, write_result
from helpers.tensor_parallel.comm import tp_forward
from helpers.tensor_parallel.config import DemoConfig, build_model, parser
from helpers.tensor_parallel.ffn import dtensor_plan
from helpers.tensor_parallel.proofs import output_tolerance
from helpers.tensor_parallel.shards import load_shard

MODULE = "helpers.tensor_parallel.dtensor_worker"


def run(config: DemoConfig) -> dict:
    """Shard with ``parallelize_module``, compare with the hand-made shards; rank 0's result."""
    config.validate()
    dtype = resolve_dtype(config.dtype)
    with process_group(MODULE, device=config.device, backend=config.backend) as rank:
        mesh = init_device_mesh(rank.device.type, (rank.world_size,))
        model = build_model(config).to(rank.device, dtype).eval()
        parallelize_module(model, mesh, dtensor_plan())
        hand = load_shard(config.folder(rank.world_size), rank.world_size, rank.rank)
        hand = hand.to(rank.device, dtype)
        fc1, fc2 = model.fc1.weight.to_local(), model.fc2.weight.to_local()
        same = torch.equal(fc1, hand.fc1.weight) and torch.equal(fc2, hand.fc2.weight)
        x = config.input_batch(dtype, rank.device)
        with torch.no_grad():
            out = model(x)  # a plain tensor: RowwiseParallel all-reduces its output (Replicate)
            expected = tp_forward(hand, x)
            diff = max_over_ranks((out.double() - expected.double()).abs().max().item(), rank)
            timing = measure(
                lambda: model(x), repeats=config.iters - config.warmup, warmup=config.warmup
            )
        result = {
            "world_size": rank.world_size,
            "backend": rank.backend,
            "dtype": str(dtype),
            "fc1_local_shape": list(fc1.shape),
            "fc2_local_shape": list(fc2.shape),
            "fc1_placement": str(model.fc1.weight.placements[0]),
            "fc2_placement": str(model.fc2.weight.placements[0]),
            "local_shards_equal_files": max_over_ranks(0.0 if same else 1.0, rank) == 0.0,
            "max_diff_vs_hand_tp": diff,
            "tolerance": output_tolerance(expected, dtype, rank.world_size),
            "times_s": timing.times,
        }
        write_result(rank, result)
        dist.barrier()
        return result


def main(argv: list[str] | None = None) -> int:
    config = DemoConfig.from_args(parser(f"torchrun ... -m {MODULE}").parse_args(argv))
    return worker_main(MODULE, lambda: run(config))


if __name__ == "__main__":
    sys.exit(main())
