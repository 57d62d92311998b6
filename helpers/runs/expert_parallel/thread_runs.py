"""Lesson 11's runs on thread ranks (a real gloo group inside the notebook's process):
one MoE layer split over ``ep`` ranks, and one training step of the MoE small Llama with
its experts split over the data-parallel ranks (dp2ep), each against one process; what
each rank of that step holds.

The layer's tolerance is derived (:func:`~helpers.expert_parallel.bounds.moe_bounds`,
element by element). The training step's is chosen, not derived: the library's bound
covers one MoE layer given its inputs, not a whole model. It is lesson 10's budget for the
small Llama, ``(tokens + 10 ranks)`` float64 epsilons of ``max(1, |largest value|)`` of
each gradient and of the loss; the weights' budget follows from it through AdamW's first
step, which moves a weight by ``lr g / (|g| + eps)``, whose slope in ``g`` is
``eps / (|g| + eps)^2``, plus the two sides' roundings.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers.core.checks import Proof, Verdict
from helpers.expert_parallel.bounds import U, bound_ratios, moe_bounds
from helpers.expert_parallel.dispatch import (
    ExpertParallelMoE,
    Splits,
    expert_range,
    sum_replicated_grads,
)
from helpers.expert_parallel.llama import (
    aux_loss,
    batch_rows,
    expert_parallel,
    moe_layers,
    rank_loss,
    reduce_gradients,
)
from helpers.expert_parallel.memory import LayerLoad, held, layer_load
from helpers.expert_parallel.moe import MoEFFN
from helpers.memory.ledger import DeviceMemory
from helpers.memory.saved import SavedTensorMeter
from helpers.runs.context_parallel.results import tolerance
from helpers.torchrun.in_notebook import run_mesh, run_ranks


def grads_of(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient by name (zeros where none arrived), a copy."""
    return {n: torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
            for n, p in module.named_parameters()}


# --- one MoE layer ----------------------------------------------------------------------


def layer_on_one_device(moe: MoEFFN, x: torch.Tensor, dout: torch.Tensor,
                        aux_weight: float = 1.0) -> dict[str, torch.Tensor]:
    """One process on the whole batch: output, auxiliary loss, input gradient, every
    parameter's gradient."""
    moe.zero_grad(set_to_none=True)
    xx = x.clone().requires_grad_()
    out, aux = moe(xx)
    ((out * dout).sum() + aux_weight * aux).backward()
    return {"out": out.detach(), "aux": aux.detach(), "input": xx.grad, **grads_of(moe)}


def layer_on_ranks(moe: MoEFFN, x: torch.Tensor, dout: torch.Tensor, ep: int,
                   aux_weight: float = 1.0) -> tuple[dict[str, torch.Tensor], list[Splits]]:
    """The same on ``ep`` thread ranks, each with its rows of ``x`` (split on the first
    dimension): the ranks' quantities put together as one process's, and each rank's
    splits. The router's and shared expert's gradients are summed over the ranks, as a
    training step does; each expert's gradient comes from the rank that holds it."""
    def work(rank: int, group: dist.ProcessGroup):
        layer = ExpertParallelMoE(moe, group)
        mine = x.chunk(ep)[rank].clone().requires_grad_()
        out, aux = layer(mine)
        ((out * dout.chunk(ep)[rank]).sum() + aux_weight * aux).backward()
        sum_replicated_grads(layer)
        total = aux.detach().clone()
        dist.all_reduce(total, group=group)
        return out.detach(), total, mine.grad, grads_of(layer), layer.last_splits

    results = run_ranks(ep, work, timeout=60, raise_errors=True)
    got = {"out": torch.cat([r[0] for r in results]), "aux": results[0][1],
           "input": torch.cat([r[2] for r in results])}
    for rank, result in enumerate(results):
        for name, grad in result[3].items():
            if name.startswith("experts."):
                if int(name.split(".")[1]) not in expert_range(moe.shape.experts, ep, rank):
                    raise AssertionError(f"rank {rank} holds {name}, not one of its experts")
                got[name] = grad
            elif rank == 0:
                got[name] = grad
    return got, [r[4] for r in results]


@dataclass(frozen=True)
class LayerProof:
    """The layer on ``ep`` ranks against one device, within the derived bound."""

    verdict: Verdict
    worst_ratio: float  # the largest |difference| / bound over every element
    splits: list[Splits]


def prove_layer(claim: str, moe: MoEFFN, x: torch.Tensor, dout: torch.Tensor, ep: int,
                aux_weight: float = 1.0) -> LayerProof:
    """:func:`layer_on_ranks` against :func:`layer_on_one_device`: one proof per quantity
    (its largest difference against its largest bound), and the worst element's ratio."""
    want = layer_on_one_device(moe, x, dout, aux_weight)
    got, splits = layer_on_ranks(moe, x, dout, ep, aux_weight)
    bounds = moe_bounds(moe, x, dout, ranks=ep, aux_weight=aux_weight)
    proofs = [Proof(name, (got[name] - want[name]).abs().max().item(), bounds[name].max().item())
              for name in want]
    worst = max(bound_ratios(got, want, bounds).values())
    return LayerProof(Verdict(claim, proofs), worst, splits)


# --- one training step of the MoE small Llama, dp2ep ----------------------------------------


@dataclass(frozen=True)
class StepSettings:
    """The training step both sides take."""

    aux_weight: float = 0.1
    lr: float = 1e-2
    eps: float = 1e-8
    weight_decay: float = 0.1

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=self.lr, eps=self.eps,
                                 weight_decay=self.weight_decay)


def step_on_one_process(model: nn.Module, ids: torch.Tensor, targets: torch.Tensor,
                        settings: StepSettings, micro: int = 1) -> dict:
    """The reference: the whole batch, in ``micro`` accumulated micro-batches (one per ep
    group when ``ep < dp``), then one AdamW step."""
    model = copy.deepcopy(model)
    optimizer = settings.optimizer(model)
    loss, routes, kept = torch.zeros((), dtype=torch.float64), [], []
    vocab = model.head.out_features
    for part, want in zip(ids.chunk(micro), targets.chunk(micro), strict=True):
        logits = model(part)
        mine = F.cross_entropy(logits.reshape(-1, vocab), want.reshape(-1)) \
            + settings.aux_weight * aux_loss(model)
        (mine / micro).backward()
        loss = loss + mine.detach() / micro
        routes.append([m.last_routing.experts for m in moe_layers(model)])
        kept.append([torch.bincount(m.last_routing.experts[m.last_routing.kept],
                                    minlength=m.shape.experts) for m in moe_layers(model)])
    grads = grads_of(model)
    optimizer.step()
    return {"loss": loss, "grads": grads, "routes": routes, "kept": kept,
            "weights": {n: p.detach().clone() for n, p in model.named_parameters()}}


def step_on_rank(model: nn.Module, ids: torch.Tensor, targets: torch.Tensor,
                 group: dist.ProcessGroup, settings: StepSettings,
                 replicas: dist.ProcessGroup | None = None) -> dict:
    """One rank's step: its rows, its experts, :func:`rank_loss`, backward,
    :func:`reduce_gradients`, AdamW; the loss averaged over the dp ranks."""
    model = expert_parallel(copy.deepcopy(model), group)
    optimizer = settings.optimizer(model)
    loss = rank_loss(model, model(batch_rows(ids, group, replicas)),
                     batch_rows(targets, group, replicas), settings.aux_weight)
    loss.backward()
    counts = reduce_gradients(model, group, replicas)
    total = loss.detach().clone()
    for each in (group, replicas):
        if each is not None:
            dist.all_reduce(total, group=each)
    dp = group.size() * (replicas.size() if replicas is not None else 1)
    grads = grads_of(model)
    optimizer.step()
    return {"loss": total / dp, "grads": grads, "counts": counts,
            "routes": [m.last_routing.experts for m in moe_layers(model)],
            "kept": [m.last_splits.kept for m in moe_layers(model)],
            "weights": {n: p.detach().clone() for n, p in model.named_parameters()}}


def step_proofs(results: list[dict], want: dict, experts: int, ep: int, tokens: int,
                settings: StepSettings) -> list[Proof]:
    """The loss and each gradient: the worst difference over every rank against its
    tolerance; each weight: the worst ``|difference| / budget`` element against 1 (its
    budget is element by element). Raises if a rank holds an expert that is not its own,
    or an expert is held nowhere."""
    ranks, worst = len(results), {}
    loss = max(abs(r["loss"] - want["loss"]).item() for r in results)
    proofs = [Proof("loss", loss, tolerance(tokens, ranks, want["loss"]))]
    for rank, result in enumerate(results):
        local = expert_range(experts, ep, rank % ep)
        for name, grad in result["grads"].items():
            if ".experts." in name and int(name.split(".experts.")[1].split(".")[0]) not in local:
                raise AssertionError(f"rank {rank} holds {name}, not one of its experts")
            ref, w_ref = want["grads"][name], want["weights"][name]
            allowed = tolerance(tokens, ranks, ref)
            slope = settings.eps / ((ref.abs() - allowed).clamp(min=0) + settings.eps) ** 2
            budget = settings.lr * (allowed * slope + 16 * U) + 2 * U * w_ref.abs()
            g, w = worst.get(name, (0.0, 0.0))
            worst[name] = (max(g, (grad - ref).abs().max().item()),
                           max(w, ((result["weights"][name] - w_ref).abs() / budget).max().item()))
    missing = {n for n in want["grads"] if ".experts." in n} - set(worst)
    if missing:
        raise AssertionError(f"experts held by no rank: {sorted(missing)[:3]}")
    proofs += [Proof(f"grad {n}", g, tolerance(tokens, ranks, want["grads"][n]))
               for n, (g, _) in worst.items()]
    proofs += [Proof(f"weight {n} (|diff| / budget)", w, 1.0) for n, (_, w) in worst.items()]
    return proofs


@dataclass(frozen=True)
class StepProof:
    """The dp2ep step on every rank against one process."""

    verdict: Verdict
    results: list[dict]  # each rank's loss, gradients, reduction counts, routing, weights
    want: dict  # one process's

    def dropped_per_block(self) -> list[int]:
        """Assignments one process dropped in each block (its first micro-batch)."""
        kept = self.want["kept"][0]
        chosen = self.want["routes"][0][0].numel()  # tokens x top_k, the same in every block
        return [chosen - int(k.sum()) for k in kept]

    def reduction(self, rank: int = 0) -> str:
        """What ``reduce_gradients`` did on ``rank``: elements all-reduced, left alone."""
        counts = self.results[rank]["counts"]
        return (f"rank {rank}: {counts['reduced']:,} elements all-reduced over dp, "
                f"{counts['left_alone']:,} expert elements left alone")

    def same_routing(self, ep: int) -> bool:
        """Each ep group chose, block by block, the experts one process chose for its rows,
        and its experts kept as many rows as one process's did under capacity."""
        groups = [self.results[i:i + ep] for i in range(0, len(self.results), ep)]
        return all(torch.equal(torch.cat([r["routes"][b] for r in group]),
                               self.want["routes"][g][b])
                   and torch.equal(torch.cat([r["kept"][b] for r in group]),
                                   self.want["kept"][g][b])
                   for g, group in enumerate(groups) for b in range(len(group[0]["routes"])))


def prove_step(claim: str, model: nn.Module, ids: torch.Tensor, targets: torch.Tensor,
               dp: int, ep: int | None = None,
               settings: StepSettings | None = None) -> StepProof:
    """One dp2ep training step on ``dp`` thread ranks, its experts split over groups of
    ``ep`` (default ``dp``), against one process (float64 ``model``)."""
    ep, settings = ep or dp, settings or StepSettings()
    if dp % ep:
        raise ValueError(f"ep={ep} does not divide dp={dp}; valid ep: "
                         f"{[e for e in range(1, dp + 1) if dp % e == 0]}")
    want = step_on_one_process(model, ids, targets, settings, micro=dp // ep)
    if ep == dp:
        results = run_ranks(dp, lambda r, g: step_on_rank(model, ids, targets, g, settings),
                            timeout=60, raise_errors=True)
    else:
        results = run_mesh({"replicas": dp // ep, "ep": ep}, lambda r, g: step_on_rank(
            model, ids, targets, g["ep"], settings, g["replicas"]), timeout=60,
            raise_errors=True)
    experts = moe_layers(model)[0].shape.experts
    proofs = step_proofs(results, want, experts, ep, ids.numel(), settings)
    return StepProof(Verdict(claim, proofs), results, want)


# --- what each rank holds ---------------------------------------------------------------


def memory_on_ranks(model: nn.Module, ids: torch.Tensor, targets: torch.Tensor, ep: int,
                    aux_weight: float = 0.01) -> list[tuple[DeviceMemory, list[LayerLoad]]]:
    """Each of ``ep`` thread ranks' ledger after one dp2ep AdamW step of ``model``, measured
    (its weights, gradients and AdamW state; the bytes autograd keeps at the loss), and
    what each block's MoE layer met on it (its load, which the prediction needs)."""
    def work(rank: int, group: dist.ProcessGroup):
        mine = expert_parallel(copy.deepcopy(model), group)
        optimizer = torch.optim.AdamW(mine.parameters(), lr=1e-3)
        with SavedTensorMeter(mine) as meter:
            loss = rank_loss(mine, mine(batch_rows(ids, group)), batch_rows(targets, group),
                             aux_weight)
            kept = meter.live_bytes  # at the loss: everything backward will need
        loss.backward()
        reduce_gradients(mine, group)
        optimizer.step()
        return held(mine, optimizer, kept), [layer_load(m) for m in moe_layers(mine)]

    return run_ranks(ep, work, timeout=60, raise_errors=True)
