"""The same FFN through PyTorch's own tensor parallelism, on the ranks that ran it by hand.

Every rank builds the source's FFN (``torch.manual_seed(seed)``) and ``parallelize_module``
shards it over a 1-D ``DeviceMesh`` with the block's ``plan()``: ``ColwiseParallel`` on fc1,
``RowwiseParallel`` on fc2. Each rank checks that its local weight shards equal the
hand-made shard files, and that the output equals the hand-made ``g(shard(f(x)))``.
``ffn_worker --dtensor`` runs it after its own proofs, in the same processes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from helpers.core.checks import Proof
from helpers.core.timing import Timing, measure
from helpers.runs.tp_ffn.config import DemoConfig, build_model
from helpers.tensor_parallel.mappings import tp_forward
from helpers.tensor_parallel.proofs import output_tolerance
from helpers.torchrun.ranks import Rank, max_over_ranks


def prove_parallelize_module(
    config: DemoConfig, rank: Rank, hand: nn.Module, x: torch.Tensor
) -> DTensorRun:
    """Shard with ``parallelize_module``, compare with this rank's hand-made shard ``hand``."""
    from torch.distributed.device_mesh import init_device_mesh  # imported when used: slow
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    model = build_model(config).to(rank.device, x.dtype).eval()
    parallelize_module(model, mesh, model.plan())
    split = {s.tensor: model.get_parameter(s.tensor) for s in model.splits()}
    same = all(torch.equal(w.to_local(), hand.get_parameter(n)) for n, w in split.items())
    with torch.no_grad():
        out = model(x)  # a plain tensor: RowwiseParallel all-reduces its output (Replicate)
        expected = tp_forward(hand, x)
        diff = max_over_ranks((out.double() - expected.double()).abs().max().item(), rank)
        timing = measure(
            lambda: model(x), repeats=config.iters - config.warmup, warmup=config.warmup
        )
    return DTensorRun(
        rank.world_size, rank.backend,
        tuple((n, str(w.placements[0]), tuple(w.to_local().shape)) for n, w in split.items()),
        max_over_ranks(0.0 if same else 1.0, rank) == 0.0,
        Proof("output", diff, output_tolerance(expected, x.dtype, rank.world_size)),
        timing,
    )  # fmt: skip


@dataclass(frozen=True)
class DTensorRun:
    """``parallelize_module`` on the ranks against the hand-made shards (rank 0's view)."""

    world_size: int
    backend: str
    local: tuple[tuple[str, str, tuple[int, ...]], ...]  # per split weight: placement, shape
    shards_equal_files: bool  # on every rank, bit for bit
    vs_hand: Proof  # output against the hand-made g(shard(f(x)))
    timing: Timing

    @property
    def ok(self) -> bool:
        return self.shards_equal_files and self.vs_hand.ok

    def as_dict(self) -> dict:
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            "local": [[n, p, list(s)] for n, p, s in self.local],
            "shards_equal_files": self.shards_equal_files,
            "vs_hand": self.vs_hand.as_dict(),
            "times_s": self.timing.times,
        }

    @classmethod
    def from_dict(cls, d: dict) -> DTensorRun:
        return cls(
            d["world_size"],
            d["backend"],
            tuple((n, p, tuple(s)) for n, p, s in d["local"]),
            d["shards_equal_files"],
            Proof.from_dict(d["vs_hand"]),
            Timing("parallelize_module", d["times_s"]),
        )

    def report(self) -> str:
        local = ", ".join(f"{n} {p} local {list(s)}" for n, p, s in self.local)
        return "\n".join([
            f"{self.world_size} ranks, {self.backend}: {local}",
            f"local weight shards equal the hand-made shard files: {self.shards_equal_files}",
            "output vs hand-made tensor parallel: " + self.vs_hand.line(0).lstrip(),
        ])  # fmt: skip
