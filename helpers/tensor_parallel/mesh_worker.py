"""Tensor parallel inside a group, data parallel across groups: a 2-D ``DeviceMesh``.

    torchrun --nproc-per-node=4 -m helpers.tensor_parallel.mesh_worker --dp 2 [tp_demo's flags]

The ranks form a (dp x tp) grid, the layout used across nodes (tp within a node, dp
across). Along ``tp`` the FFN is split with ``parallelize_module``; along ``dp`` each
group takes its own slice of the batch and the gradients are averaged with an
all-reduce over the ``dp`` group. Every rank checks one training step against the full
model trained on the full batch: its output rows and its updated weight shards.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

from helpers.core.devices import resolve_dtype
from helpers.distributed.ranks import max_over_ranks, process_group, worker_main, write_result
from helpers.tensor_parallel.config import DemoConfig, build_model, parser
from helpers.tensor_parallel.ffn import dtensor_plan, shard_rows, shard_vs_full

MODULE = "helpers.tensor_parallel.mesh_worker"


def sgd_step(model: torch.nn.Module, x: torch.Tensor, lr: float, dp_group=None, dp: int = 1):
    """Loss mean(y^2), backward, gradients averaged over ``dp_group``, one SGD step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    out = model(x)
    out.square().mean().backward()
    if dp_group is not None:
        for p in model.parameters():
            grad = p.grad.to_local()
            dist.all_reduce(grad, group=dp_group)
            grad /= dp
    optimizer.step()
    return out.detach()


def run(config: DemoConfig, dp: int, lr: float) -> dict:
    """One step of the 2-D model vs one step of the full model; rank 0's result."""
    config.validate()
    dtype = resolve_dtype(config.dtype)
    with process_group(MODULE, device=config.device, backend=config.backend) as rank:
        if dp < 1 or rank.world_size % dp or config.batch_size % dp:
            raise ValueError(
                f"--dp {dp} must divide the world size {rank.world_size} and the batch "
                f"{config.batch_size}; valid: a common divisor"
            )
        tp = rank.world_size // dp
        mesh = init_device_mesh(rank.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
        dp_rank, tp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
        reference = build_model(config).to(rank.device, dtype)
        model = parallelize_module(copy.deepcopy(reference), mesh["tp"], dtensor_plan())
        x = config.input_batch(dtype, rank.device)
        per = x.shape[0] // dp
        batch_rows = slice(dp_rank * per, (dp_rank + 1) * per)
        out = sgd_step(model, x[batch_rows], lr, mesh.get_group("dp"), dp)
        ref_out = sgd_step(reference, x, lr)  # the full model on the full batch
        weight_diff = shard_vs_full(
            (model.fc1.weight.to_local(), model.fc2.weight.to_local()),
            (reference.fc1.weight, reference.fc2.weight),
            shard_rows(config.ffn_size, tp, tp_rank),
        )
        output_diff = (out - ref_out[batch_rows]).abs().max().item()
        result = {
            "world_size": rank.world_size,
            "dp": dp,
            "tp": tp,
            "backend": rank.backend,
            "mesh": str(mesh.mesh.tolist()),
            "output_diff": max_over_ranks(output_diff, rank),
            "weight_diff": max_over_ranks(weight_diff, rank),
        }
        write_result(rank, result)
        dist.barrier()
        return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(parents=[parser(f"torchrun ... -m {MODULE}")], add_help=False)
    ap.add_argument("--dp", type=int, default=2, help="data-parallel groups (the rest is tp)")
    ap.add_argument("--lr", type=float, default=0.1)
    ns = ap.parse_args(argv)
    return worker_main(MODULE, lambda: run(DemoConfig.from_args(ns), ns.dp, ns.lr))


if __name__ == "__main__":
    sys.exit(main())
