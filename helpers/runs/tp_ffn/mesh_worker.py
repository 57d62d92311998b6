"""Tensor parallel inside a group, data parallel across groups: a 2-D ``DeviceMesh``.

    torchrun --nproc-per-node=4 -m helpers.runs.tp_ffn.mesh_worker --dp 2 [--hidden-size ...]

The ranks form a (dp x tp) grid, the layout used across nodes (tp within a node, dp
across). Along ``tp`` the FFN is split with ``parallelize_module``; along ``dp`` each
group takes its own slice of the batch and the gradients are averaged with an
all-reduce over the ``dp`` group. Every rank checks one training step against the full
model trained on the full batch: its output rows and its updated weight shards, each
within ``output_tolerance`` (a few units in the last place per rank).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

from helpers.core.checks import Proof
from helpers.core.devices import resolve_dtype
from helpers.runs.contract import serve
from helpers.runs.tp_ffn.config import MeshConfig
from helpers.runs.tp_ffn.results import MeshRun
from helpers.tensor_parallel.block import shard_vs_full
from helpers.tensor_parallel.proofs import output_tolerance
from helpers.torchrun.ranks import Rank, max_over_ranks
from helpers.torchrun.status import say


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


def main(config: MeshConfig, rank: Rank) -> MeshRun:
    """One step of the 2-D model vs one step of the full model; rank 0's result."""
    dtype, dp, lr = resolve_dtype(config.dtype), config.dp, config.lr
    tp = rank.world_size // dp
    say(rank, f"building the {dp} x {tp} mesh")
    mesh = init_device_mesh(rank.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    dp_rank, tp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    reference = config.model().to(rank.device, dtype)
    model = parallelize_module(copy.deepcopy(reference), mesh["tp"], reference.plan())
    x = config.input_batch(dtype, rank.device)
    per = x.shape[0] // dp
    batch_rows = slice(dp_rank * per, (dp_rank + 1) * per)
    say(rank, "one step on the mesh, proven")
    out = sgd_step(model, x[batch_rows], lr, mesh.get_group("dp"), dp)
    ref_out = sgd_step(reference, x, lr)  # the full model on the full batch
    weight_diff = shard_vs_full(model, reference, tp, tp_rank)
    output_diff = (out - ref_out[batch_rows]).abs().max().item()
    weights = torch.cat([reference.fc1.weight.flatten(), reference.fc2.weight.flatten()])
    world = rank.world_size
    result = MeshRun(
        world, dp, tp, rank.backend, tuple(tuple(r) for r in mesh.mesh.tolist()),
        (Proof("outputs", max_over_ranks(output_diff, rank),
               output_tolerance(ref_out, dtype, world)),
         Proof("updated weight shards", max_over_ranks(weight_diff, rank),
               output_tolerance(weights.detach(), dtype, world))),
    )  # fmt: skip
    dist.barrier()
    return result


if __name__ == "__main__":
    serve(MeshConfig, main)
