"""The composed model as a mixture of experts: lesson 11's MoE layer in every block, its
experts split over the data-parallel ranks (ep = dp), beside tensor and pipeline parallelism.

Every block's MLP becomes an MoE layer (``moe_llama``) whose ``top_k`` experts per token
do the dense MLP's work (each ``ffn / top_k`` wide), and on each rank
:func:`split_experts` keeps ``E / dp`` of its experts: the ranks that share the
rank's pipeline stage and tensor-parallel position, its ``dp`` group, are its ep group.
Three things change in the composition:

- **tensor + sequence parallelism**: the experts are not split over ``tp``. The MoE layer
  takes the rank's own slice of the sequence, the ``Shard(1)`` tensor the norm hands it,
  as a plain tensor (:func:`moe_block_plan`), and returns its output for the same
  tokens. So the all-gather before the MLP and the reduce-scatter after it are gone;
  each tensor-parallel rank routes its own tokens among its ep group's experts, and the
  router and the experts are replicated over ``tp``.
- **fully_shard** leaves the experts alone (``ignored_params``): each is held by one rank
  of the ep group already. The router is sharded like any other weight.
- **the gradients** (:func:`reduce_moe_gradients`). The step's loss is the mean of the
  ``dp`` ranks' mean losses; each tensor-parallel rank back-propagates its dp rank's
  loss into its slice of the tokens only. ``fully_shard`` averages the router's
  gradient over ``dp``, but nothing sums what the ``tp`` ranks computed from their
  different tokens (the norms' gradients are summed by ``DTensor``; the MoE's weights are
  plain tensors): so the router's gradient is summed over ``tp``. An expert's gradient
  already holds every ep rank's tokens of its slice (the all-to-all's backward brought
  them home): it is summed over ``tp`` and divided by ``dp``, the mean over the ranks.

The auxiliary load-balancing loss is not used (its weight is 0): lesson 11 balances the
load; here every token reaches its ``k`` experts (no capacity, nothing dropped).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from helpers.expert_parallel.dispatch import ExpertParallelMoE, expert_range
from helpers.expert_parallel.llama import moe_llama
from helpers.expert_parallel.memory import LayerLoad, layer_load
from helpers.expert_parallel.moe import MoEFFN, MoEShape
from helpers.models.llama import LMConfig, TinyLM, build_lm


def moe_shape(lm: LMConfig, experts: int, top_k: int) -> MoEShape | None:
    """Each block's MoE layer: ``experts`` SwiGLU experts, ``top_k`` of them per token,
    each ``ffn / top_k`` wide, so that a token costs the dense MLP's work; no capacity, no
    shared expert (None: the dense model)."""
    if not experts:
        return None
    if top_k < 1 or lm.ffn % top_k:
        raise ValueError(f"top_k={top_k} does not divide ffn={lm.ffn}; valid: a divisor of "
                         f"ffn from 1 to experts={experts}")
    return MoEShape(hidden=lm.hidden, ffn=lm.ffn // top_k, experts=experts,
                    top_k=top_k).validate()


def build_model(lm: LMConfig, moe: MoEShape | None, seed: int) -> TinyLM:
    """The small Llama (``moe`` None), or its MoE variant, weights drawn from ``seed``."""
    return build_lm(lm, seed=seed) if moe is None else moe_llama(lm, moe, seed)


def model_structure(lm: LMConfig, moe: MoEShape | None) -> TinyLM:
    """The model's modules and parameter names on the meta device (no weights drawn)."""
    with torch.device("meta"):
        model = TinyLM(lm)
        if moe is not None:
            for block in model.blocks:
                block.mlp = MoEFFN(moe)
    return model


def layout_name(layout, experts: int) -> str:
    """A layout's name, with ``ep`` for its dp ranks when they also hold the experts
    (e.g. "ep=2 x tp=2 x pp=2")."""
    name = str(layout)
    return name.replace("dp=", "ep=") if experts else name


class ComposedMoE(ExpertParallelMoE):
    """One rank's MoE layer in the composed run: lesson 11's expert-parallel layer, with
    the auxiliary loss dropped, and each forward's routing kept in ``seen``: this rank's
    rows per expert, and its load (:class:`~helpers.expert_parallel.memory.LayerLoad`)."""

    def __init__(self, moe: MoEFFN, group: dist.ProcessGroup) -> None:
        super().__init__(moe, group)
        self.seen: list[tuple[list[int], LayerLoad]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        out, _ = super().forward(x)  # the auxiliary loss is not used
        self.seen.append((self.last_splits.counts.tolist(), layer_load(self)))
        self.last_routing = None  # it would keep the forward's graph alive
        return out


def moe_layers(module: nn.Module) -> list[ComposedMoE]:
    """The expert-parallel MoE layers of ``module``, in forward order."""
    return [m for m in module.modules() if isinstance(m, ComposedMoE)]


def is_moe(model: nn.Module) -> bool:
    """Whether ``model``'s blocks hold MoE layers (split or not)."""
    return any(isinstance(m, (MoEFFN, ExpertParallelMoE)) for m in model.modules())


def split_experts(model: TinyLM, group: dist.ProcessGroup) -> TinyLM:
    """``model`` (from ``moe_llama``) with every block's MoE layer split over ``group``:
    this rank keeps ``E / ep`` experts, under their global numbers; in place."""
    for block in model.blocks:
        if not isinstance(block.mlp, MoEFFN):
            raise ValueError("a block without an MoE layer; valid: a model from build_model "
                             "with experts")
        block.mlp = ComposedMoE(block.mlp, group)
    return model


def expert_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The experts' weights on this rank (each held by one rank of its ep group)."""
    return [p for m in moe_layers(module) for p in m.experts.parameters()]


def replicated_moe_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The MoE weights every rank holds: the routers (and shared experts, if any)."""
    out = []
    for m in moe_layers(module):
        out += list(m.router.parameters())
        out += [] if m.shared is None else list(m.shared.parameters())
    return out


def moe_block_plan(block_plan: dict) -> dict:
    """Lesson 09's plan for a block (with sequence parallelism) with the MLP's entries
    replaced: the MoE layer gets the rank's ``Shard(1)`` slice of the tokens as a plain
    tensor, and returns a plain tensor for the same tokens (the residual stream's)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput

    plan = {k: v for k, v in block_plan.items() if k != "mlp" and not k.startswith("mlp.")}
    plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                     use_local_output=True)
    return plan


def _local(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor``'s local piece (``fully_shard``'s shard); a plain tensor as it is."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


@torch.no_grad()
def reduce_moe_gradients(module: nn.Module, tp: dist.ProcessGroup | None, dp: int) -> int:
    """After the backward: the MoE weights' gradients made the whole batch's (see the
    module's docstring). Experts: summed over ``tp``, divided by ``dp``; routers: summed
    over ``tp`` (``fully_shard`` already averaged them over ``dp``). All in one all-reduce
    over ``tp``, with one flag per expert tensor, so that an expert no token of any
    tensor-parallel rank reached keeps no gradient, as in one process. Returns the
    elements all-reduced (0 when ``tp`` is None or one rank)."""
    experts, routers = expert_parameters(module), replicated_moe_parameters(module)
    for p in experts:
        if p.grad is not None:
            p.grad.div_(dp)
    if tp is None or tp.size() == 1 or not experts:
        return 0
    pieces = [_local(p.grad) if p.grad is not None else torch.zeros_like(p) for p in experts]
    pieces += [_local(p.grad) for p in routers]
    flags = torch.tensor([p.grad is not None for p in experts], dtype=experts[0].dtype,
                         device=experts[0].device)
    flat = torch.cat([t.reshape(-1) for t in pieces] + [flags])
    dist.all_reduce(flat, group=tp)
    summed = flat[:-len(flags)].split([t.numel() for t in pieces])
    for k, p in enumerate(experts):
        p.grad = summed[k].view_as(p).clone() if flat[len(flat) - len(flags) + k] else None
    for p, value in zip(routers, summed[len(experts):], strict=True):
        _local(p.grad).copy_(value.view_as(_local(p.grad)))
    return flat.numel()


@dataclass(frozen=True)
class RankRouting:
    """What the routers did, as one rank's predictions need it.

    ``matrices``: for each timed step, the ``(ep, E)`` rows per expert of every rank of
    this rank's ep group, one matrix per MoE forward (block and micro-batch). ``loads``:
    the last step's load of each of this rank's layers, per micro-batch. ``trained``: its
    local experts that had a gradient in the last step (a token of some tensor-parallel
    peer reached them); ``kept``: those that ever had one (AdamW holds their state)."""

    ep_rank: int
    matrices: list[list[torch.Tensor]]
    loads: list[list[LayerLoad]]
    trained: int
    kept: int


def rank_routing(history: dict[int, list], coords: dict[str, dict[int, int]], rank: int,
                 timed: list[int], microbatches: int) -> RankRouting:
    """``rank``'s :class:`RankRouting` from every rank's ``history`` (per step, per layer,
    per forward: (rows per expert, load)) and ``coords`` (rank -> index per dimension).
    Each step's last ``microbatches`` forwards of a layer are its micro-batches (a
    pipeline's first step also runs one to infer the shapes)."""
    me = coords[rank]

    def line(dim: str) -> list[int]:  # the ranks that differ from ``rank`` along ``dim`` only
        ranks = [r for r, c in coords.items()
                 if all(c[d] == me[d] for d in c if d != dim)]
        return sorted(ranks, key=lambda r: coords[r][dim])

    def real(step: list) -> list:
        return [layer[-microbatches:] for layer in step]

    peers = line("dp")
    matrices = []
    for step in timed:
        steps = [real(history[r][step]) for r in peers]
        matrices.append([torch.tensor([s[k][j][0] for s in steps])
                         for k in range(len(steps[0])) for j in range(len(steps[0][k]))])
    mine = real(history[rank][-1])
    loads = [[load for _, load in layer] for layer in mine]

    def reached(step: int) -> set[tuple[int, int]]:  # (layer, local expert) that got rows
        return {(k, e) for r in line("tp") for k, layer in enumerate(real(history[r][step]))
                for _, load in layer for e, n in enumerate(load.arrived) if n}

    trained = reached(len(history[rank]) - 1)
    kept = set().union(*(reached(s) for s in range(len(history[rank]))))
    return RankRouting(me["dp"], matrices, loads, len(trained), len(kept))


def local_experts(moe: MoEShape, ep: int) -> int:
    """Experts per block on one rank."""
    return len(expert_range(moe.experts, ep, 0))
