"""The same FFN through PyTorch's own tensor parallelism, on the ranks that ran it by hand.

Every rank builds the source's FFN (``torch.manual_seed(seed)``) and ``parallelize_module``
shards it over a 1-D ``DeviceMesh`` with the block's ``plan()``: ``ColwiseParallel`` on fc1,
``RowwiseParallel`` on fc2. Each rank checks that its local weight shards equal the
hand-made shard files, and that the output equals the hand-made ``g(shard(f(x)))``.
Lesson 08's worker runs it after its own proofs, in the same processes (``dtensor=True``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from helpers.core.checks import Proof
from helpers.core.timing import Timing, measure
from helpers.tensor_parallel.mappings import tp_forward
from helpers.tensor_parallel.proofs import output_tolerance
from helpers.torchrun.ranks import Rank, max_over_ranks

if TYPE_CHECKING:
    from helpers.tensor_parallel.rank_work import TPFFNConfig


def prove_parallelize_module(
    config: TPFFNConfig, rank: Rank, hand: nn.Module, x: torch.Tensor
) -> DTensorRun:
    """Shard with ``parallelize_module``, compare with this rank's hand-made shard ``hand``."""
    from torch.distributed.device_mesh import init_device_mesh  # imported when used: slow
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    model = config.model().to(rank.device, x.dtype).eval()
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
    """``parallelize_module`` on the ranks against the hand-made shards (rank 0's view);
    a launch's result carries it as its fields (``helpers.runs.contract.Record``)."""

    world_size: int
    backend: str
    local: tuple[tuple[str, str, tuple[int, ...]], ...]  # per split weight: placement, shape
    shards_equal_files: bool  # on every rank, bit for bit
    vs_hand: Proof  # output against the hand-made g(shard(f(x)))
    timing: Timing

    @property
    def ok(self) -> bool:
        return self.shards_equal_files and self.vs_hand.ok

    def report(self) -> str:
        local = ", ".join(f"{n} {p} local {list(s)}" for n, p, s in self.local)
        return "\n".join([
            f"{self.world_size} ranks, {self.backend}: {local}",
            f"local weight shards equal the hand-made shard files: {self.shards_equal_files}",
            "output vs hand-made tensor parallel: " + self.vs_hand.line(0).lstrip(),
        ])  # fmt: skip
