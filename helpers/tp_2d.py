"""Tensor parallel inside a group, data parallel across groups: a 2-D ``DeviceMesh``.

``torchrun --nproc-per-node=4 -m helpers.tp_2d --dp 2 [tp_demo's flags]`` arranges the
ranks as a (dp x tp) grid, the layout used across nodes (tp within a node, dp across).
Along ``tp`` the FFN is split as in lesson 06 (``parallelize_module``); along ``dp`` each
group takes its own slice of the batch and the gradients are averaged with an
all-reduce over the ``dp`` group. Every rank checks one training step against the full
model trained on the full batch: its output rows and its updated weight shards.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

from helpers.distributed import max_over_ranks, process_group, write_result
from helpers.tp_demo import DemoConfig, build_model, parser
from helpers.tp_dtensor import PLAN
from helpers.tp_ffn import resolve_dtype


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(parents=[parser()], add_help=False)
    ap.add_argument("--dp", type=int, default=2, help="data-parallel groups (the rest is tp)")
    ap.add_argument("--lr", type=float, default=0.1)
    ns = ap.parse_args(argv)
    config = DemoConfig.from_args(ns)
    config.validate()
    dtype = resolve_dtype(config.dtype)
    with process_group(config.rank_backend(int(os.environ["WORLD_SIZE"]))[0]) as rank:
        if rank.world_size % ns.dp or config.batch_size % ns.dp:
            raise ValueError(
                f"--dp {ns.dp} must divide the world size {rank.world_size} and the batch "
                f"{config.batch_size}; valid: a common divisor"
            )
        tp = rank.world_size // ns.dp
        mesh = init_device_mesh(rank.device.type, (ns.dp, tp), mesh_dim_names=("dp", "tp"))
        dp_rank, tp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
        reference = build_model(config).to(rank.device, dtype)
        model = parallelize_module(copy.deepcopy(reference), mesh["tp"], PLAN)
        x = config.input_batch(dtype, rank.device)
        rows = slice(dp_rank * (x.shape[0] // ns.dp), (dp_rank + 1) * (x.shape[0] // ns.dp))

        # one step of the 2-D model: own batch slice, gradients averaged over the dp group
        optimizer = torch.optim.SGD(model.parameters(), lr=ns.lr)
        out = model(x[rows])
        out.square().mean().backward()
        for p in model.parameters():
            grad = p.grad.to_local()
            dist.all_reduce(grad, group=mesh.get_group("dp"))
            grad /= ns.dp
        optimizer.step()

        # the same step on one device: full model, full batch
        ref_optimizer = torch.optim.SGD(reference.parameters(), lr=ns.lr)
        ref_out = reference(x)
        ref_out.square().mean().backward()
        ref_optimizer.step()

        per_rank = config.ffn_size // tp
        cols = slice(tp_rank * per_rank, (tp_rank + 1) * per_rank)
        weight_diff = max(
            (model.fc1.weight.to_local() - reference.fc1.weight[cols]).abs().max().item(),
            (model.fc2.weight.to_local() - reference.fc2.weight[:, cols]).abs().max().item(),
        )
        output_diff = (out.detach() - ref_out.detach()[rows]).abs().max().item()
        write_result(
            rank,
            {
                "world_size": rank.world_size,
                "dp": ns.dp,
                "tp": tp,
                "backend": rank.backend,
                "mesh": str(mesh.mesh.tolist()),
                "output_diff": max_over_ranks(output_diff, rank),
                "weight_diff": max_over_ranks(weight_diff, rank),
            },
        )
        dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
