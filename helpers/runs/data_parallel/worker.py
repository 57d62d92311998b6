"""One rank of lesson 06: ``torchrun -m helpers.runs.data_parallel.worker --model-vocab ...``.

Every rank, in one launch: checks and times the four collectives (``sweep``); runs one
Adam step of lesson 05's small Llama under DDP, the hand-written ZeRO stages 1-3 (stage 3
also in bfloat16) and FSDP2, each from the same weights on its share of the same batch;
proves each against one process on the whole batch (which every rank computes for
itself); measures what it holds and what it sends (the calls and their sizes, and the
bytes its sockets sent, read outside every timed window); times DDP's overlap in steps
that nothing counts. Rank 0's :class:`DataParallelResult` goes back to the launch.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from helpers.comm.wire import wire_unavailable
from helpers.core.checks import StepResult, max_abs_diff, training_step
from helpers.data_parallel.ddp import ddp_step, no_sync_step
from helpers.data_parallel.fsdp import describe_parameter, fsdp_step, fsdp_units, shard
from helpers.data_parallel.rank_step import adam, rows_of
from helpers.data_parallel.zero import HandZero
from helpers.memory.ledger import DeviceMemory
from helpers.memory.measure import default_loss
from helpers.memory.saved import SavedTensorMeter
from helpers.memory.torch_trackers import track_fsdp_step
from helpers.models.llama import build_lm
from helpers.runs.contract import serve
from helpers.runs.data_parallel.config import DataParallelConfig
from helpers.runs.data_parallel.measured import (
    BucketSpan,
    OverlapCost,
    ShardedParameter,
    Timeline,
    TrackedMemory,
)
from helpers.runs.data_parallel.results import (
    DataParallelResult,
    Run,
    bf16_proofs,
    fsdp_proofs,
    no_sync_proofs,
    step_proofs,
    zero_proofs,
)
from helpers.runs.data_parallel.sweep import collectives_section
from helpers.runs.data_parallel.traffic import NCCL_WIRE, CallLog, Traffic
from helpers.torchrun.ranks import Rank, max_over_ranks
from helpers.torchrun.status import say

Pairs = list[tuple[str, torch.Tensor]]


# -- the one-process reference, and how far a run is from it ------------------------------
def global_batch(config: DataParallelConfig, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, next-token labels) of the whole step, the same on every rank."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.model.vocab, (config.batch, config.seq + 1), generator=g)
    return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)


def reference_step(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor,
                   lr: float) -> StepResult:
    """One process, the whole batch, one Adam step, on a copy of ``model``."""
    return training_step(copy.deepcopy(model), ids, labels, loss_fn=default_loss,
                         optimizer=lambda params: adam(params, lr))


def _pairs(pairs_a: Pairs, pairs_b: Pairs):
    for (na, a), (nb, b) in zip(pairs_a, pairs_b, strict=True):
        if na != nb:
            raise ValueError(f"parameters out of order: {na!r} vs {nb!r}")
        yield a, b


def max_diff(pairs_a: Pairs, pairs_b: Pairs) -> float:
    """Largest |a - b| over matching named tensors (names must agree)."""
    return max((max_abs_diff(a, b) for a, b in _pairs(pairs_a, pairs_b)), default=0.0)


def max_relative_diff(pairs_a: Pairs, pairs_b: Pairs) -> float:
    """Largest ||a - b|| / ||b|| over matching named tensors (a whole tensor's relative error)."""
    worst = 0.0
    for a, b in _pairs(pairs_a, pairs_b):
        a, b = a.detach().cpu().float(), b.detach().cpu().float()
        worst = max(worst, ((a - b).norm() / b.norm().clamp_min(1e-30)).item())
    return worst


# -- the sections of the launch ---------------------------------------------------------
def _span_s(step: dict, start: str, end: str) -> float:
    return (step[end] - step[start]) / 1e9


def ddp_section(rank: Rank, config: DataParallelConfig, model, ids, labels,
                ref: StepResult, wire: bool) -> tuple[dict, dict]:
    """DDP's proof, ledger and bytes (its first step, counted, untimed); its bucket
    timeline and the cost of its overlap (later steps, timed, no meter); the no_sync proof."""
    n, r = rank.world_size, rank.rank
    log = CallLog()
    say(rank, f"DDP: 1 counted + {config.steps} timed steps")
    run = ddp_step(model, ids, labels, lr=config.lr, bucket_cap_mb=config.bucket_cap_mb,
                   rank=r, world_size=n, steps=config.steps, device=rank.device, meter=log)
    first, last = run["first"], run["timed"][-1]
    proofs = step_proofs(
        config.lr,
        output=max_over_ranks((first["output"] - rows_of(ref.output, r, n)).abs().max().item(),
                              rank),
        grads=max_over_ranks(max_diff(first["grads"], ref.grads), rank),
        weights=max_over_ranks(max_diff(first["weights"], ref.weights), rank))
    say(rank, f"DDP: no_sync, {config.accumulation} micro-batches")
    accumulated = no_sync_step(model, ids, labels, lr=config.lr,
                               bucket_cap_mb=config.bucket_cap_mb, rank=r, world_size=n,
                               micro_steps=config.accumulation, device=rank.device)
    t0 = last["start_ns"]
    spans = [BucketSpan(b["index"], b["bytes"], b["params"], b["param_bytes"],
                        b["start_ns"] - t0, b["end_ns"] - t0) for b in last["buckets"]]
    compute = ("backward_start_ns", "compute_end_ns")
    return {
        "runs": {"DDP": Run("DDP", Traffic.of(log, wire), proofs=proofs,
                            ledger=first["ledger"])},
        "first_step_buckets": len(first["buckets"]),  # DDP's first step: one bucket (ddp.py)
        "timeline": Timeline(last["backward_start_ns"] - t0, last["compute_end_ns"] - t0,
                             last["backward_end_ns"] - t0, spans),
        "overlap_cost": OverlapCost([_span_s(s, *compute) for s in run["timed"]],
                                    [_span_s(s, *compute) for s in run["silent"]]),
        "no_sync_all_reduces": accumulated["all_reduces"],
        "no_sync_proofs": no_sync_proofs(
            config.lr, grads=max_over_ranks(max_diff(accumulated["grads"], ref.grads), rank),
            weights=max_over_ranks(max_diff(accumulated["weights"], ref.weights), rank)),
    }, first


Hand = dict[str, tuple[Pairs, Pairs]]  # a hand ZeRO-3's (weights, gradient slices), by name
ZERO_RUNS = {"ZeRO-1": (1, None), "ZeRO-2": (2, None), "ZeRO-3": (3, None),
             "ZeRO-3 bf16": (3, torch.bfloat16)}  # (stage, the dtype weights are gathered in)


def zero_section(rank: Rank, config: DataParallelConfig, model, ids, labels, ref: StepResult,
                 ddp_first: dict, wire: bool) -> tuple[dict[str, Run], Hand]:
    """Each hand-written ZeRO stage (and stage 3 in bfloat16): one step, its ledger, what
    it sent, its proofs."""
    n, r = rank.world_size, rank.rank
    x, y = rows_of(ids, r, n), rows_of(labels, r, n)
    mine = [(name, g.view(-1).chunk(n)[r]) for name, g in ref.grads]  # slice r of each
    runs, hand = {}, {}
    for k, (name, (stage, dtype)) in enumerate(ZERO_RUNS.items(), 1):
        say(rank, f"hand {name} ({k} of {len(ZERO_RUNS)})")
        local = copy.deepcopy(model)
        zero = HandZero(local, fsdp_units(local), stage, lr=config.lr, param_dtype=dtype)
        log, meter = CallLog(), SavedTensorMeter(local)
        with log, meter:
            output = zero.step(x, y, lambda out, t: default_loss(out.float(), t))
        zero.remove()
        weights, slices = zero.full_weights(), zero.grad_slices()
        hand[name] = (weights, slices)
        if dtype is not None:  # within bfloat16's rounding of the float32 step
            proofs = bf16_proofs(output=max_over_ranks(max_relative_diff(
                [("output", output.float())], [("output", rows_of(ref.output, r, n))]), rank),
                grads=max_over_ranks(max_relative_diff(slices, mine), rank))
            runs[name] = Run(name, Traffic.of(log, wire), proofs=proofs)
            continue
        proofs = zero_proofs(
            config.lr,
            grads=max_over_ranks(max_diff(slices, mine), rank),
            weights=max_over_ranks(max_diff(weights, ref.weights), rank),
            output_vs_ddp=max_over_ranks(
                (output.cpu() - ddp_first["output"]).abs().max().item(), rank),
            weights_vs_ddp=max_over_ranks(max_diff(weights, ddp_first["weights"]), rank))
        runs[name] = Run(name, Traffic.of(log, wire), proofs=proofs, ledger=DeviceMemory(
            **zero.peak, activations=sum(meter.peak.values())))
    return runs, hand


def fsdp_section(rank: Rank, config: DataParallelConfig, model, ids, labels, ref: StepResult,
                 hand: Hand, wire: bool) -> tuple[dict[str, Run], ShardedParameter]:
    """FSDP2: its DTensor parameters, its proofs against one process and against the hand
    ZeRO-3 (in bfloat16, against the hand ZeRO-3 in bfloat16), what it sent with and
    without resharding, and its memory by PyTorch's FSDPMemTracker."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    n, r = rank.world_size, rank.rank
    x, y = rows_of(ids, r, n), rows_of(labels, r, n)
    mesh = init_device_mesh(rank.device.type, (n,), mesh_dim_names=("dp",))
    runs = {}
    variants = {
        "FSDP2": {"reshard_after_forward": True},
        "FSDP2 no reshard": {"reshard_after_forward": False},
        "FSDP2 bf16": {"reshard_after_forward": True, "mp_policy": MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32)},
    }
    for k, (name, options) in enumerate(variants.items(), 1):
        say(rank, f"{name} ({k} of {len(variants)})")
        sharded = shard(model, mesh, **options)
        if name == "FSDP2":
            parameter = ShardedParameter(
                **describe_parameter(sharded, "blocks.0.mlp.gate_proj.weight"))
        log = CallLog()
        step = fsdp_step(sharded, x, y, lr=config.lr, world_size=n, meter=log)
        # the same step again, on a fresh copy, under PyTorch's FSDPMemTracker
        tracked = track_fsdp_step(shard(model, mesh, **options), x, y, optimizer="adam",
                                  lr=config.lr)
        output = [("output", step["output"])], [("output", rows_of(ref.output, r, n))]
        weights, slices = hand["ZeRO-3 bf16" if name == "FSDP2 bf16" else "ZeRO-3"]
        mine = [(k, g.view(-1).chunk(n)[r]) for k, g in step["grads"]]  # slice r of each
        if name == "FSDP2 bf16":
            proofs = bf16_proofs(
                output=max_over_ranks(max_relative_diff(*output), rank),
                grads=max_over_ranks(max_relative_diff(step["grads"], ref.grads), rank),
                grads_vs_hand=max_over_ranks(max_diff(mine, slices), rank),
                weights_vs_hand=max_over_ranks(max_diff(step["weights"], weights), rank))
        else:
            proofs = fsdp_proofs(
                config.lr, output=max_over_ranks(max_diff(*output), rank),
                grads=max_over_ranks(max_diff(step["grads"], ref.grads), rank),
                weights=max_over_ranks(max_diff(step["weights"], ref.weights), rank),
                weights_vs_zero3=max_over_ranks(max_diff(step["weights"], weights), rank))
        runs[name] = Run(name, Traffic.of(log, wire), proofs=proofs,
                         tracker=TrackedMemory.of(tracked.own_peaks))
    return runs, parameter


def main(config: DataParallelConfig, rank: Rank) -> DataParallelResult:
    """Every section on this rank, from the same weights and batch; rank 0's result."""
    torch.set_num_threads(1)  # one thread of compute per rank; nothing pins it to a core
    model = build_lm(config.model, seed=0).train().to(rank.device)
    ids, labels = global_batch(config, rank.device)
    say(rank, "reference step (one process)")
    ref = reference_step(model, ids, labels, config.lr)
    wire_reason = NCCL_WIRE if rank.backend == "nccl" else wire_unavailable()
    wire = wire_reason is None
    collectives = collectives_section(rank, config, wire)
    ddp, ddp_first = ddp_section(rank, config, model, ids, labels, ref, wire)
    zero, hand = zero_section(rank, config, model, ids, labels, ref, ddp_first, wire)
    fsdp, parameter = fsdp_section(rank, config, model, ids, labels, ref, hand, wire)
    say(rank, "done: sending the result")
    units = {u: [p.numel() * p.element_size() for m in ms for p in m.parameters()]
             for u, ms in fsdp_units(model).items()}
    return DataParallelResult(
        config=config, world_size=rank.world_size, backend=rank.backend, reason=rank.reason,
        parameters=sum(p.numel() for p in model.parameters()),
        parameter_tensors=len(list(model.parameters())), unit_bytes=units,
        wire_reason=wire_reason, gloo_threads=gloo_threads(rank),
        **collectives, **{**ddp, "runs": {**ddp["runs"], **zero, **fsdp}},
        fsdp_parameter=parameter)


def gloo_threads(rank: Rank) -> int | None:
    """The worker threads of this rank's gloo process group (None: not gloo)."""
    if rank.backend != "gloo":
        return None
    return dist.group.WORLD._get_backend(torch.device("cpu")).options._threads


if __name__ == "__main__":
    serve(DataParallelConfig, main)
