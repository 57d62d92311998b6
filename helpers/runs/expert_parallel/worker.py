"""One rank of the expert-parallel run: ``torchrun --nproc-per-node=EP -m
helpers.runs.expert_parallel.worker --experts 4 --top-k 2``.

Every rank builds the same one-process MoE layer from ``--seed`` (float64) and draws the
same global batch, the ranks' tokens concatenated rank after rank, and its output
gradient; it keeps its own rows. It runs its part of the layer forward and backward,
counting what it sends (``CommMeter`` at the dispatcher, forward and backward apart) and
reading its sockets, then sums the router's and shared expert's gradients as a training
step would. The ranks gather their outputs, input gradients, gradients and routing;
each compares them with one process on the whole batch, within the bound derived from
the inputs. Then every rank times ``--repeats`` passes, and then all-to-alls alone, a
barrier before each call (no meter running while a clock does): ``all_to_all_single``
with even splits at each of ``--a2a-sizes`` (the alpha-beta fit), and the layer's own
dispatch and combine with the splits its router chose, ``--a2a-repeats`` calls each.
Rank 0 prints its result as one JSON line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from helpers.comm.collectives import all_to_all_sent
from helpers.comm.meter import CommMeter
from helpers.comm.wire import WireMeter
from helpers.core.checks import Proof
from helpers.core.timing import synchronized_clock
from helpers.expert_parallel.bounds import bound_ratios, moe_bounds
from helpers.expert_parallel.dispatch import (
    ExpertParallelMoE,
    Splits,
    combine,
    dispatch,
    expert_range,
    permute,
    sum_replicated_grads,
)
from helpers.expert_parallel.moe import MoEFFN, Routing, capacity
from helpers.runs.contract import serve
from helpers.runs.expert_parallel.config import EPLayerConfig, block_elements
from helpers.runs.expert_parallel.results import EPLayerResult, RankSide
from helpers.torchrun.ranks import Rank

LABELS = {"out": "output", "aux": "aux loss", "input": "grad input"}


def label(name: str) -> str:
    """A quantity's name as its proof shows it: ``grad experts.0.up_proj.weight``."""
    return LABELS.get(name, f"grad {name}")


def inputs(config: EPLayerConfig, ep: int) -> tuple[MoEFFN, torch.Tensor, torch.Tensor]:
    """The one-process layer, the global batch (``ep x tokens`` rows) and its output
    gradient: the same on every rank."""
    torch.manual_seed(config.seed)
    moe = MoEFFN(config.shape(), torch.float64)
    g = torch.Generator().manual_seed(config.seed + 1)
    rows = ep * config.tokens
    x = torch.randn(rows, config.hidden, generator=g, dtype=torch.float64)
    dout = torch.randn(rows, config.hidden, generator=g, dtype=torch.float64)
    return moe, x, dout


def grads_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient by name, on the CPU (zeros where none arrived)."""
    return {n: (torch.zeros_like(p) if p.grad is None else p.grad).detach().cpu()
            for n, p in module.named_parameters()}


def reference(moe: MoEFFN, x: torch.Tensor, dout: torch.Tensor,
              aux_weight: float) -> tuple[dict[str, torch.Tensor], int]:
    """One process on the whole batch: every quantity, and the assignments it dropped."""
    moe.zero_grad(set_to_none=True)
    xx = x.clone().requires_grad_()
    out, aux = moe(xx)
    ((out * dout).sum() + aux_weight * aux).backward()
    dropped = int((~moe.last_routing.kept).sum())
    return {"out": out.detach(), "aux": aux.detach(), "input": xx.grad, **grads_of(moe)}, dropped


def pass_once(layer: ExpertParallelMoE, x: torch.Tensor, dout: torch.Tensor,
              aux_weight: float) -> None:
    """One forward and backward of this rank's tokens."""
    layer.zero_grad(set_to_none=True)
    out, aux = layer(x.detach().clone().requires_grad_())
    ((out * dout).sum() + aux_weight * aux).backward()


def assemble(parts: list[dict[str, torch.Tensor]], experts: int) -> dict[str, torch.Tensor]:
    """The ranks' parts as one process's quantities: rows concatenated rank after rank,
    the auxiliary loss's shares summed, each expert's gradient from the rank that holds it,
    the replicated gradients (summed already) from rank 0."""
    got = {"out": torch.cat([p["out"] for p in parts]),
           "aux": torch.stack([p["aux"] for p in parts]).sum(),
           "input": torch.cat([p["input"] for p in parts])}
    ep = len(parts)
    for rank, part in enumerate(parts):
        held = {f"experts.{e}." for e in expert_range(experts, ep, rank)}
        for name, grad in part.items():
            if any(name.startswith(h) for h in held) or \
                    (rank == 0 and name.startswith(("router.", "shared."))):
                got[name] = grad
    return got


def timed(config: EPLayerConfig, layer: ExpertParallelMoE, x: torch.Tensor,
          dout: torch.Tensor, rank: Rank) -> list[float]:
    """Seconds of each of ``repeats`` passes after ``warmup``, a barrier before each."""
    group, cuda = rank.group or dist.group.WORLD, rank.device.type == "cuda"
    for _ in range(config.warmup):
        pass_once(layer, x, dout, config.aux_weight)
    seconds = []
    for _ in range(config.repeats):
        dist.barrier(group=group)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        pass_once(layer, x, dout, config.aux_weight)
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return seconds


def timed_calls(call: Callable[[], object], repeats: int, warmup: int,
                group: dist.ProcessGroup) -> list[float]:
    """Seconds of each of ``repeats`` calls after ``warmup`` untimed ones, a barrier before
    each (the clock waits for the GPU, where there is one)."""
    for _ in range(warmup):
        call()
    seconds = []
    for _ in range(repeats):
        dist.barrier(group=group)
        start = synchronized_clock()
        call()
        seconds.append(synchronized_clock() - start)
    return seconds


def even_all_to_all(sent: int, ep: int, device: torch.device,
                    group: dist.ProcessGroup) -> tuple[Callable[[], object], int]:
    """One ``all_to_all_single`` call with even splits in which this rank sends about
    ``sent`` bytes to the other ranks (whole float64 elements, at least one per block), on
    buffers allocated once; and the bytes it really sends."""
    block = block_elements(sent, ep)
    data = torch.zeros(ep * block, dtype=torch.float64, device=device)
    out = torch.empty_like(data)
    return (lambda: dist.all_to_all_single(out, data, group=group),
            all_to_all_sent(data, [], group.rank(), ep))


def time_all_to_alls(config: EPLayerConfig, x: torch.Tensor, routing: Routing, splits: Splits,
                     rank: Rank) -> tuple[list[int], list[list[float]], list[float], list[float]]:
    """The fit's all-to-alls (bytes each rank sent per call, and each size's seconds), then
    the layer's dispatch and combine with the splits its router chose (``splits``, for this
    rank's tokens ``x`` routed as ``routing``)."""
    group, ep = rank.group or dist.group.WORLD, rank.world_size
    sent, fit_seconds = [], []
    for size in config.a2a_sizes:
        call, really = even_all_to_all(size, ep, rank.device, group)
        sent.append(really)
        fit_seconds.append(timed_calls(call, config.a2a_repeats, config.warmup, group))
    with torch.no_grad():
        tokens = permute(x.detach(), routing).tokens  # what the layer's forward dispatches
        arrived = dispatch(tokens, splits.sent, splits.received, group)  # what it combines
        there = timed_calls(lambda: dispatch(tokens, splits.sent, splits.received, group),
                            config.a2a_repeats, config.warmup, group)
        back = timed_calls(lambda: combine(arrived, splits.sent, splits.received, group),
                           config.a2a_repeats, config.warmup, group)
    return sent, fit_seconds, there, back


def main(config: EPLayerConfig, rank: Rank) -> EPLayerResult:
    group = rank.group or dist.group.WORLD
    ep, me = rank.world_size, rank.rank
    moe, x, dout = inputs(config, ep)
    layer = ExpertParallelMoE(moe, group).to(rank.device)
    mine = x.chunk(ep)[me].to(rank.device).requires_grad_()  # as a layer's input in a model
    my_dout = dout.chunk(ep)[me].to(rank.device)
    with WireMeter() as wire:
        with CommMeter() as forward:
            out, aux = layer(mine)
        with CommMeter() as backward:
            ((out * my_dout).sum() + config.aux_weight * aux).backward()
    with CommMeter() as summing:
        sum_replicated_grads(layer)
    splits, routing = layer.last_splits, layer.last_routing
    part = {"out": out.detach().cpu(), "aux": aux.detach().cpu(), "input": mine.grad.cpu(),
            **grads_of(layer)}
    parts: list[dict | None] = [None] * ep
    dist.all_gather_object(parts, part, group=group)
    seconds = timed(config, layer, mine, my_dout, rank)
    if ep > 1:  # no meter runs from here on: the clock would time it
        a2a_sent, a2a_seconds, there, back = time_all_to_alls(config, mine, routing, splits, rank)
    else:  # one rank sends nothing: no all-to-all to time
        a2a_sent, a2a_seconds, there, back = [], [], [], []
    side = RankSide(me, list(expert_range(config.experts, ep, me)), splits.counts.tolist(),
                    splits.sent, splits.received, splits.arrived.sum(0).tolist(),
                    splits.kept.tolist(), dict(forward.per_collective.ring),
                    dict(backward.per_collective.ring), dict(summing.per_collective.ring),
                    forward.total_gloo + backward.total_gloo,
                    wire.sent if wire.available else None, seconds, a2a_seconds, there, back)
    sides: list[dict | None] = [None] * ep
    dist.all_gather_object(sides, side.to_dict(), group=group)
    got = assemble(parts, config.experts)
    want, dropped = reference(moe, x, dout, config.aux_weight)
    bounds = moe_bounds(moe, x, dout, ranks=ep, aux_weight=config.aux_weight)  # derived
    proofs = [Proof(label(n), (got[n] - want[n]).abs().max().item(), bounds[n].max().item())
              for n in want]
    ratios = {label(n): r for n, r in bound_ratios(got, want, bounds).items()}
    replicated = [p.numel() * p.element_size() for p in layer.router.parameters()]
    if layer.shared is not None:
        replicated += [p.numel() * p.element_size() for p in layer.shared.parameters()]
    result = EPLayerResult(ep, config.experts, config.top_k, config.hidden, config.tokens,
                           capacity(ep * config.tokens, config.shape()), proofs, ratios,
                           [RankSide.from_dict(s) for s in sides], replicated, dropped,
                           a2a_sent)
    if me == 0:
        timing = {}
        if a2a_sent:  # the all-to-all: the fit, and the slowest rank's dispatch against it
            fit = result.a2a_fit
            row = next(r for r in result.a2a_rows()
                       if r.call == "dispatch" and r.who == "slowest rank")
            timing = {"a2a_alpha_us": round(fit.alpha_s * 1e6, 1),
                      "a2a_GBps": round(fit.bandwidth / 1e9, 3),
                      "dispatch_ms": round(row.mean_ms, 3),
                      "dispatch_fit_ms": round(row.predicted_ms, 3)}
        print(json.dumps({"ep": ep, **result.verdicts,
                          "worst_ratio": round(result.worst_ratio, 4),
                          "imbalance": round(result.imbalance, 3),
                          "dropped": result.dropped,
                          "mean_ms": round(max(r.mean_ms for r in result.ranks), 2),
                          **timing}),
              flush=True)
    return result


if __name__ == "__main__":
    serve(EPLayerConfig, main)
