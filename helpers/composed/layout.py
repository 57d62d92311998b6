"""A layout of the small Llama: pipeline stages x data-parallel shards x context-parallel
ranks x tensor-parallel ranks.

Ranks form a ``DeviceMesh`` of shape ``(pp, dp, cp, tp)``, the order torchtitan uses.
Applied in this order: the model is cut into ``pp`` stages of whole blocks (the first with
the embedding, the last with the final norm and the head); every block's attention becomes
lesson 10's context-parallel attention over ``cp`` (the zig-zag ring; torchtitan swaps it
after tensor parallelism, and the two commute: the swap keeps the projections);
each stage is split over its ``tp`` ranks by ``parallelize_module`` with lesson 09's plan
(tensor and sequence parallelism); each block, then the stage, is sharded by
``fully_shard`` over ``dp`` and ``cp`` together (a context-parallel rank holds every weight
and sees other tokens, so its gradients are summed like a data-parallel rank's); and
``torch.distributed.pipelining`` runs the stages with a 1F1B schedule. A mixture-of-experts
model has its experts split over ``dp`` first (``experts``), and kept out of the
tensor-parallel plan and of ``fully_shard``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from helpers.models.attention import divisors
from helpers.models.llama import LMConfig, TinyLM

DIMS = ("pp", "dp", "cp", "tp")  # the mesh's dimensions, outermost first
CP_VARIANT = "zigzag"  # the composed run's context parallelism: lesson 10's balanced ring


@dataclass(frozen=True)
class Layout:
    """Sizes of the mesh's four dimensions. The mesh orders them pp, dp, cp, tp; ``cp``
    comes last here and defaults to 1, so that ``Layout(pp, dp, tp)`` keeps its meaning."""

    pp: int = 1
    dp: int = 1
    tp: int = 1
    cp: int = 1

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def shards(self) -> int:
        """Ranks ``fully_shard`` cuts each weight over: dp x cp."""
        return self.dp * self.cp

    @property
    def fsdp_dim(self) -> str:
        """The mesh dimension ``fully_shard`` runs over: "dp", or "dp_cp" (the two
        flattened into one) when there is context parallelism."""
        return "dp_cp" if self.cp > 1 else "dp"

    @property
    def fsdp_group(self) -> str:
        """The dimension whose ranks ``fully_shard``'s traffic is counted under: "dp", or
        "cp" when dp = 1 (dp x cp flattened then spans the cp ranks: PyTorch builds a
        second group over them, and the byte meter names a group by its ranks)."""
        return "cp" if self.cp > 1 and self.dp == 1 else "dp"

    def grid(self, ranks: list[int] | None = None) -> torch.Tensor:
        """``ranks`` (default: 0 .. world size - 1) laid out on the mesh, shape ``(pp, dp,
        cp, tp)``, row-major as ``DeviceMesh`` takes them: ``tp``, the innermost, varies
        fastest."""
        ranks = list(range(self.world_size)) if ranks is None else ranks
        if len(ranks) != self.world_size:
            raise ValueError(f"{len(ranks)} ranks for a mesh of {self.world_size}; valid: "
                             f"{self.world_size} ranks")
        return torch.tensor(ranks).reshape(self.pp, self.dp, self.cp, self.tp)

    def groups(self, dim: str) -> list[list[int]]:
        """Every group along ``dim``: the ranks whose indices differ only along ``dim``."""
        if dim not in DIMS:
            raise ValueError(f"dim={dim!r}; valid: {', '.join(DIMS)}")
        size = getattr(self, dim)
        return self.grid().movedim(DIMS.index(dim), -1).reshape(-1, size).tolist()

    def coords(self, rank: int) -> dict[str, int]:
        """``rank``'s index along each dimension, e.g. ``{"pp": 0, "dp": 1, "cp": 0,
        "tp": 1}``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank}; valid: 0 .. {self.world_size - 1}")
        return dict(zip(DIMS, ((self.grid() == rank).nonzero()[0]).tolist(), strict=True))

    def __str__(self) -> str:
        parts = [f"{name}={getattr(self, name)}" for name in ("dp", "cp", "tp", "pp")
                 if getattr(self, name) > 1]
        return " x ".join(parts) or "one device"

    def validate(self, lm: LMConfig, *, batch: int, microbatches: int,
                 world_size: int | None = None, seq: int | None = None) -> Layout:
        """Refuse, naming the value and the valid choices, a layout this model, batch,
        sequence length and world cannot take."""
        for name in DIMS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}; valid: an integer >= 1")
        if world_size is not None and self.world_size != world_size:
            raise ValueError(f"pp x dp x cp x tp = {self.pp} x {self.dp} x {self.cp} x "
                             f"{self.tp} = {self.world_size}, but the world size is "
                             f"{world_size}; valid: a mesh whose product is {world_size}")
        if seq is not None and self.cp > 1 and seq % (2 * self.cp):
            valid = [c for c in divisors(seq) if seq % (2 * c) == 0]
            raise ValueError(f"cp={self.cp} cannot cut seq={seq} into 2 x cp zig-zag chunks; "
                             f"valid cp: {valid}")
        if lm.blocks % self.pp:
            raise ValueError(f"pp={self.pp} does not divide the {lm.blocks} blocks into whole "
                             f"stages; valid pp: {divisors(lm.blocks)}")
        for size, what in ((lm.heads, "heads"), (lm.kv, "kv_heads"), (lm.ffn, "ffn"),
                           (lm.vocab, "vocab")):
            if size % self.tp:
                raise ValueError(f"tp={self.tp} does not divide {what}={size}; valid tp: "
                                 f"{divisors(math.gcd(lm.heads, lm.kv, lm.ffn, lm.vocab))}")
        if batch % self.dp:
            raise ValueError(f"batch={batch} does not split over dp={self.dp}; valid dp: "
                             f"{divisors(batch)}")
        rows = batch // self.dp
        if microbatches < 1 or rows % microbatches:
            raise ValueError(f"microbatches={microbatches} do not divide a data-parallel "
                             f"rank's {rows} sequences; valid: {divisors(rows)}")
        if self.pp > 1 and microbatches < self.pp:
            raise ValueError(f"microbatches={microbatches} < pp={self.pp}: 1F1B needs at "
                             f"least one micro-batch per stage; valid: "
                             f"{[m for m in divisors(rows) if m >= self.pp]}")
        return self


class StageModule(nn.Module):
    """One pipeline stage of a :class:`TinyLM`: its blocks, and the embedding (first stage)
    or the final norm and head (last stage). Parameter names are the model's."""

    def __init__(self, model: TinyLM, stage: int, stages: int) -> None:
        super().__init__()
        per = len(model.blocks) // stages
        first, last = stage == 0, stage == stages - 1
        self.embed = model.embed if first else None
        self.blocks = nn.ModuleDict({str(k): model.blocks[k]
                                     for k in range(stage * per, (stage + 1) * per)})
        self.norm = model.norm if last else None
        self.head = model.head if last else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def build_stage(model: TinyLM, layout: Layout, mesh, stage: int, shards=None) -> StageModule:
    """Stage ``stage`` of a copy of ``model``: its experts, if it has any, split over
    ``mesh["dp"]``; context-parallel over ``mesh["cp"]``, tensor-parallel over
    ``mesh["tp"]`` (with sequence parallelism) and fully sharded over ``shards`` (default
    ``mesh["dp"]``; with context parallelism, dp and cp flattened), the experts left out."""
    from helpers.composed import experts

    moe = experts.is_moe(model)
    if moe and (layout.dp < 2 or layout.cp > 1):
        raise ValueError(f"an MoE model on {layout}; valid: dp >= 2 (the experts are split "
                         "over the dp ranks) and cp=1")
    model = copy.deepcopy(model)
    if moe:
        experts.split_experts(model, mesh["dp"].get_group())
    if layout.cp > 1:
        from helpers.context_parallel.llama import context_parallel

        context_parallel(model, mesh["cp"].get_group(), CP_VARIANT)
    module = StageModule(model, stage, layout.pp)
    if layout.tp > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        from helpers.tensor_parallel.plans import llama_plans

        top, block = llama_plans(sequence_parallel=True)
        parallelize_module(module, mesh["tp"],
                           {k: v for k, v in top.items() if getattr(module, k) is not None})
        block = experts.moe_block_plan(block) if moe else block
        for each in module.blocks.values():
            parallelize_module(each, mesh["tp"], block)
    if layout.shards > 1:
        from torch.distributed.fsdp import fully_shard

        keep = layout.pp == 1  # under a pipeline the weights stay gathered between micro-batches
        shards = mesh["dp"] if shards is None else shards
        for each in module.blocks.values():
            fully_shard(each, mesh=shards, reshard_after_forward=keep,
                        ignored_params=set(experts.expert_parameters(each)))
        fully_shard(module, mesh=shards, reshard_after_forward=keep)
    return module
