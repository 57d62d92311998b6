"""The small Llama as a mixture of experts, and its training step with expert parallelism
beside data parallelism.

Every block's gated MLP becomes an MoE layer of the same width: a router, ``E`` SwiGLU
experts and, optionally, a shared one (:mod:`.moe`). The rest of the model is unchanged.

Expert parallelism with data parallelism (torchtitan's "dp2ep"): ``dp`` ranks each take
their rows of the global batch, as data parallelism does, and the experts of every block
are split over the same ranks (``ep = dp``). Which gradients are summed over which group:

- the embedding, attention, norms, head, routers and shared experts are *replicated*:
  each rank's gradient sums only its own rows, so they are all-reduced over the dp group
  and divided by ``dp`` (averaged), exactly as data parallelism does;
- an expert's weights live on one rank. Every token routed to it, from every rank,
  arrived there, and the all-to-all's backward sent each token's gradient back the same
  way: its gradient already holds every rank's rows. It is *not* all-reduced (there is
  nothing to add it to), only divided by ``dp`` like the averaged ones.

With ``ep < dp`` the experts are split over groups of ``ep`` ranks, and each expert is
held by ``dp / ep`` *replicas*, one per group: its gradient is summed over those replicas
only. Each ep group routes its own rows among its own experts, so its capacity and its
auxiliary loss are those of its sub-batch: the step equals one device running the
``dp / ep`` sub-batches as accumulated micro-batches.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers.expert_parallel.dispatch import ExpertParallelMoE
from helpers.expert_parallel.moe import MoEFFN, MoEShape
from helpers.models.llama import LMConfig, TinyLM


class _KeepsAux:
    """A block's MLP returns its output only; the auxiliary loss waits in ``aux``."""

    aux: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        out, self.aux = super().forward(x)
        return out


class BlockMoE(_KeepsAux, MoEFFN):
    """An :class:`~helpers.expert_parallel.moe.MoEFFN` in a block's MLP slot."""


class BlockExpertParallelMoE(_KeepsAux, ExpertParallelMoE):
    """An :class:`~helpers.expert_parallel.dispatch.ExpertParallelMoE` in a block's MLP
    slot: this rank's experts, the router and the shared expert."""


def moe_llama(lm: LMConfig, shape: MoEShape, seed: int = 0) -> TinyLM:
    """The small Llama of ``lm`` with every block's MLP an MoE layer of ``shape`` (its
    ``hidden`` must be the model's), weights drawn from ``seed`` (CPU, float32). Build it
    once, outside thread ranks: the draw uses the global generator."""
    shape.validate()
    if shape.hidden != lm.hidden:
        raise ValueError(f"MoEShape hidden={shape.hidden} but the model's hidden={lm.hidden}; "
                         f"valid: hidden={lm.hidden}")
    torch.manual_seed(seed)
    model = TinyLM(lm)
    for block in model.blocks:
        block.mlp = BlockMoE(shape)
    return model.eval()


def moe_layers(model: nn.Module) -> list[MoEFFN | ExpertParallelMoE]:
    """Each block's MoE layer, in order (a ValueError if a block has a dense MLP)."""
    layers = [block.mlp for block in model.blocks]
    dense = [i for i, m in enumerate(layers) if not isinstance(m, (MoEFFN, ExpertParallelMoE))]
    if dense:
        raise ValueError(f"blocks {dense} have a dense MLP; valid: a model from moe_llama")
    return layers


def aux_loss(model: nn.Module) -> torch.Tensor:
    """The blocks' auxiliary losses of the last forward, summed (on an expert-parallel
    rank: its shares, which add up over the ep group to the whole batch's)."""
    terms = [layer.aux for layer in moe_layers(model)]
    if any(t is None for t in terms):
        raise ValueError("no auxiliary loss yet; valid: call aux_loss after a forward")
    return torch.stack(terms).sum()


def expert_parallel(model: TinyLM, group: dist.ProcessGroup) -> TinyLM:
    """``model`` with each block's MoE layer split over ``group``: this rank keeps its
    ``E / ep`` experts (names unchanged), the router and the shared expert; in place."""
    for block, layer in zip(model.blocks, moe_layers(model), strict=True):
        if not isinstance(layer, MoEFFN):
            raise ValueError("the model is already expert-parallel; valid: a moe_llama model")
        block.mlp = BlockExpertParallelMoE(layer, group)
    return model


def ep_size(model: nn.Module) -> int:
    """Over how many ranks each block's experts are split (1: not expert-parallel)."""
    sizes = {m.group.size() if isinstance(m, ExpertParallelMoE) else 1 for m in moe_layers(model)}
    if len(sizes) != 1:
        raise ValueError(f"blocks split over different ep sizes {sorted(sizes)}; valid: one")
    return sizes.pop()


def rank_loss(model: nn.Module, logits: torch.Tensor, targets: torch.Tensor,
              aux_weight: float) -> torch.Tensor:
    """This rank's loss, the convention of :func:`reduce_gradients`: the mean cross-entropy
    of its own tokens plus ``aux_weight x ep x`` its share of the auxiliary losses.

    The shares of one ep group add up to its batch's auxiliary loss, once; the ranks'
    losses are *averaged*, so each share counts ``ep`` times. Then the mean of the ``dp``
    ranks' losses is one device's ``cross-entropy + aux_weight x aux`` on the whole batch
    (with ``ep < dp``: the mean over the ep groups' sub-batches), and the mean of their
    gradients is its gradient."""
    data = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return data + aux_weight * ep_size(model) * aux_loss(model)


def split_parameters(model: nn.Module) -> tuple[list, list]:
    """(replicated, experts): ``(name, parameter)`` pairs. Experts are those of the
    expert-parallel layers: held by one rank of the ep group; everything else (an MoE
    layer that is not split included) is held by every rank."""
    sharded = {id(p) for m in moe_layers(model) if isinstance(m, ExpertParallelMoE)
               for p in m.experts.parameters()}
    named = list(model.named_parameters())
    return ([(n, p) for n, p in named if id(p) not in sharded],
            [(n, p) for n, p in named if id(p) in sharded])


def _sum(params: list, groups: list[dist.ProcessGroup]) -> int:
    """All-reduce (sum) each gradient over each of ``groups``; elements reduced. A missing
    gradient becomes zeros, so that every rank joins the same collectives."""
    count = 0
    for _, p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        for group in groups:
            dist.all_reduce(p.grad, group=group)
        count += p.numel()
    return count


def reduce_gradients(model: nn.Module, group: dist.ProcessGroup,
                     replicas: dist.ProcessGroup | None = None) -> dict[str, int]:
    """After backward of :func:`rank_loss`: every gradient made the whole batch's.

    ``group``: the ranks the experts are split over, the ep group, which is the whole dp
    group when ``ep = dp``; ``replicas`` (``ep < dp``): the ranks holding the same experts,
    one per ep group, so ``dp = ep x replicas``. Replicated weights: summed over both,
    then divided by ``dp``. Experts: summed over ``replicas`` only (never over the ep
    group, whose other ranks hold *other* experts), then divided by ``dp``.

    A gradient to be all-reduced that is missing (with ``ep < dp``: an expert no row of
    this group reached) becomes zeros first, so that every rank joins the same
    collectives. Returns the elements ``"reduced"`` over the whole dp group,
    ``"reduced_over_replicas"`` and ``"left_alone"`` (expert elements no collective
    touched)."""
    for layer in moe_layers(model):
        if isinstance(layer, ExpertParallelMoE) and layer.group is not group:
            raise ValueError(f"the experts are split over a group of {layer.group.size()} ranks "
                             "that is not `group`; valid: the group given to expert_parallel")
    dp = group.size() * (replicas.size() if replicas is not None else 1)
    replicated, experts = split_parameters(model)
    others = [replicas] if replicas is not None else []
    counts = {"reduced": _sum(replicated, [group, *others]),
              "reduced_over_replicas": _sum(experts, others) if others else 0}
    counts["left_alone"] = 0 if others else sum(p.numel() for _, p in experts)
    for _, p in replicated + experts:
        if p.grad is not None:
            p.grad.div_(dp)
    return counts


def dp_rank(group: dist.ProcessGroup, replicas: dist.ProcessGroup | None = None) -> tuple[int, int]:
    """(this rank's place in the dp group, dp): the ep groups one after another, and the
    ranks of each in order, so that each ep group holds consecutive rows of the batch."""
    if replicas is None:
        return group.rank(), group.size()
    return replicas.rank() * group.size() + group.rank(), replicas.size() * group.size()


def batch_rows(batch: torch.Tensor, group: dist.ProcessGroup,
               replicas: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's rows of the global ``batch`` (its first dimension split ``dp`` ways), a
    copy: a rank holds its own rows only, as if it had loaded them (a view would keep the
    whole batch's storage alive for backward)."""
    rank, dp = dp_rank(group, replicas)
    if len(batch) % dp:
        raise ValueError(f"batch of {len(batch)} rows for dp={dp} ranks; valid: a multiple "
                         f"of {dp}")
    return batch.chunk(dp)[rank].clone()
