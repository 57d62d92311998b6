"""Tensor parallel inside a group, data parallel across groups: a 2-D ``DeviceMesh``.

    torchrun --nproc-per-node=4 -m helpers.runs.tp_ffn.mesh_worker --dp 2 [tp_demo's flags]

The ranks form a (dp x tp) grid, the layout used across nodes (tp within a node, dp
across). Along ``tp`` the FFN is split with ``parallelize_module``; along ``dp`` each
group takes its own slice of the batch and the gradients are averaged with an
all-reduce over the ``dp`` group. Every rank checks one training step against the full
model trained on the full batch: its output rows and its updated weight shards, each
within ``output_tolerance`` (a few units in the last place per rank).
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

from helpers.core.checks import Proof
from helpers.core.devices import resolve_dtype
from helpers.runs.tp_ffn.config import DemoConfig, build_model, parser
from helpers.tensor_parallel.block import shard_vs_full
from helpers.tensor_parallel.proofs import output_tolerance
from helpers.torchrun.ranks import (
    exit_worker,
    max_over_ranks,
    process_group,
    worker_main,
    write_result,
)

MODULE = "helpers.runs.tp_ffn.mesh_worker"


@dataclass(frozen=True)
class MeshRun:
    """Rank 0's result: one step on a (dp x tp) mesh against one device."""

    world_size: int
    dp: int
    tp: int
    backend: str
    mesh: tuple[tuple[int, ...], ...]
    proofs: tuple[Proof, ...]  # outputs (each group's rows), updated weight shards
    node_commands: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.proofs)

    def as_dict(self) -> dict:
        return {
            "world_size": self.world_size,
            "dp": self.dp,
            "tp": self.tp,
            "backend": self.backend,
            "mesh": [list(r) for r in self.mesh],
            "proofs": [p.as_dict() for p in self.proofs],
        }

    @classmethod
    def from_dict(cls, d: dict) -> MeshRun:
        return cls(
            d["world_size"],
            d["dp"],
            d["tp"],
            d["backend"],
            tuple(tuple(r) for r in d["mesh"]),
            tuple(Proof.from_dict(p) for p in d["proofs"]),
            tuple(d.get("node_commands", ())),
        )

    def report(self) -> str:
        head = (
            f"{self.world_size} ranks as a (dp={self.dp}) x (tp={self.tp}) mesh "
            f"{[list(r) for r in self.mesh]}, {self.backend}"
        )
        return "\n".join([head] + ["  " + p.line(22) for p in self.proofs])


@dataclass(frozen=True)
class MeshOptions:
    """What ``mesh_worker`` takes beyond tp_demo's flags: data-parallel groups, the step's lr."""

    dp: int = 2  # the rest of the world is tp
    lr: float = 0.1

    def args(self) -> list[str]:
        return ["--dp", str(self.dp), "--lr", str(self.lr)]

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> tuple[DemoConfig, MeshOptions]:
        """The worker's command line: the config and these options."""
        ap = argparse.ArgumentParser(parents=[parser(f"torchrun ... -m {MODULE}")], add_help=False)
        ap.add_argument("--dp", type=int, default=cls.dp, help="data-parallel groups")
        ap.add_argument("--lr", type=float, default=cls.lr, help="SGD learning rate of the step")
        ns = ap.parse_args(argv)
        return DemoConfig.from_args(ns), cls(ns.dp, ns.lr)


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


def run(config: DemoConfig, options: MeshOptions) -> MeshRun:
    """One step of the 2-D model vs one step of the full model; rank 0's result."""
    config.validate()
    dtype, dp, lr = resolve_dtype(config.dtype), options.dp, options.lr
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
        model = parallelize_module(copy.deepcopy(reference), mesh["tp"], reference.plan())
        x = config.input_batch(dtype, rank.device)
        per = x.shape[0] // dp
        batch_rows = slice(dp_rank * per, (dp_rank + 1) * per)
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
        write_result(rank, result.as_dict())
        dist.barrier()
        return result


def main(argv: list[str] | None = None) -> int:
    config, options = MeshOptions.from_args(argv)
    return worker_main(MODULE, lambda: run(config, options))


if __name__ == "__main__":
    exit_worker(main())
