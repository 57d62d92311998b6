"""One rank of lesson 06: ``torchrun -m helpers.runs.data_parallel.worker --model-vocab ...``.

Every rank, in one launch: checks and times the four collectives; runs one Adam step of
lesson 05's small Llama under DDP, the hand-written ZeRO stages 1-3 and FSDP2, each from
the same weights on its share of the same batch; proves each against one process on the
whole batch (which every rank computes for itself); measures what it holds and counts what
it sends. Rank 0's :class:`DataParallelResult` goes back to the launch.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from helpers.comm.collectives import (
    COLLECTIVES,
    expected_result,
    rank_input,
    ring_bytes,
    run_collective,
)
from helpers.comm.meter import CommMeter
from helpers.core.checks import StepResult, max_abs_diff, training_step
from helpers.core.timing import synchronized_clock
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
    ShardedParameter,
    Timeline,
    TrackedMemory,
)
from helpers.runs.data_parallel.results import (
    DataParallelResult,
    Run,
    bf16_proofs,
    collective_check,
    fsdp_proofs,
    no_sync_proof,
    step_proofs,
    zero_proofs,
)
from helpers.torchrun.ranks import Rank, max_over_ranks

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


def _sent(counter: CommMeter) -> dict:
    return {"sent": dict(counter.per_collective.ring),
            "calls": dict(counter.per_collective.calls)}


# -- the sections of the launch ---------------------------------------------------------
def collectives_section(rank: Rank, config: DataParallelConfig) -> dict:
    """What each collective computes (checked against a local computation), and its times:
    after warm-up calls, ``repeats`` rounds of ``collective_repeats`` calls back to back (as
    nccl-tests times them), each round's time divided by its calls."""
    n, r, device = rank.world_size, rank.rank, rank.device
    checks = []
    for name in COLLECTIVES:
        inputs = [rank_input(q, 4 * n) for q in range(n)]
        got = run_collective(name, inputs[r].to(device), r, n)
        wrong = (got.cpu() - expected_result(name, inputs, r)).abs().max().item()
        checks.append(collective_check(name, max_over_ranks(wrong, rank)))
    timings = {}
    for name in COLLECTIVES:
        rows = []
        for nbytes in config.collective_sizes:
            full = torch.ones(max(n, nbytes // 4), device=device)
            for _ in range(config.warmup):
                run_collective(name, full, r, n)
            times = []  # per call, averaged over a round of back-to-back calls
            for _ in range(config.repeats):
                dist.barrier()
                start = synchronized_clock()
                for _ in range(config.collective_repeats):
                    run_collective(name, full, r, n)
                times.append((synchronized_clock() - start) / config.collective_repeats)
            rows.append((full.numel() * 4, ring_bytes(name, n, full.numel() * 4), times))
        timings[name] = rows
    return {"collective_checks": checks, "timings": timings}


def ddp_section(rank: Rank, config: DataParallelConfig, model, ids, labels,
                ref: StepResult) -> tuple[dict, dict]:
    """DDP's proof, ledger, bytes and bucket timeline; the no_sync proof."""
    n, r = rank.world_size, rank.rank
    run = ddp_step(model, ids, labels, lr=config.lr, bucket_cap_mb=config.bucket_cap_mb,
                   rank=r, world_size=n, steps=config.steps, device=rank.device)
    first, last = run["first"], run["last"]
    proofs = step_proofs(
        config.lr,
        output=max_over_ranks((first["output"] - rows_of(ref.output, r, n)).abs().max().item(),
                              rank),
        grads=max_over_ranks(max_diff(first["grads"], ref.grads), rank),
        weights=max_over_ranks(max_diff(first["weights"], ref.weights), rank))
    accumulated = no_sync_step(model, ids, labels, lr=config.lr,
                               bucket_cap_mb=config.bucket_cap_mb, rank=r, world_size=n,
                               micro_steps=config.accumulation, device=rank.device)
    t0 = last["start_ns"]
    spans = [BucketSpan(b["index"], b["bytes"], b["params"], b["start_ns"] - t0,
                        b["end_ns"] - t0) for b in last["buckets"]]
    return {
        "runs": {"DDP": Run("DDP", **_sent(first["counter"]), proofs=proofs,
                            ledger=first["ledger"])},
        "first_step_buckets": len(first["buckets"]),  # DDP's first step: one bucket (ddp.py)
        "timeline": Timeline(last["backward_start_ns"] - t0, last["compute_end_ns"] - t0,
                             last["backward_end_ns"] - t0, spans),
        "no_sync_all_reduces": accumulated["all_reduces"],
        "no_sync_proof": no_sync_proof(config.lr, max_over_ranks(
            max_diff(accumulated["weights"], ref.weights), rank)),
    }, first


def zero_section(rank: Rank, config: DataParallelConfig, model, ids, labels, ref: StepResult,
                 ddp_first: dict) -> tuple[dict[str, Run], Pairs]:
    """Each hand-written ZeRO stage: one step, its ledger, its bytes, its proofs."""
    n, r = rank.world_size, rank.rank
    x, y = rows_of(ids, r, n), rows_of(labels, r, n)
    runs, weights = {}, []
    for stage in (1, 2, 3):
        local = copy.deepcopy(model)
        zero = HandZero(local, fsdp_units(local), stage, lr=config.lr)
        counter, meter = CommMeter(), SavedTensorMeter(local)
        with counter, meter:
            output = zero.step(x, y, default_loss)
        zero.remove()
        weights = zero.full_weights()
        mine = [(name, g.view(-1).chunk(n)[r]) for name, g in ref.grads]  # slice r of each
        proofs = zero_proofs(
            config.lr,
            grads=max_over_ranks(max_diff(zero.grad_slices(), mine), rank),
            weights=max_over_ranks(max_diff(weights, ref.weights), rank),
            output_vs_ddp=max_over_ranks(
                (output.cpu() - ddp_first["output"]).abs().max().item(), rank),
            weights_vs_ddp=max_over_ranks(max_diff(weights, ddp_first["weights"]), rank))
        name = f"ZeRO-{stage}"
        runs[name] = Run(name, **_sent(counter), proofs=proofs, ledger=DeviceMemory(
            **zero.peak, activations=sum(meter.peak.values())))
    return runs, weights  # the last: ZeRO-3's


def fsdp_section(rank: Rank, config: DataParallelConfig, model, ids, labels, ref: StepResult,
                 zero3_weights: Pairs) -> tuple[dict[str, Run], ShardedParameter]:
    """FSDP2: its DTensor parameters, its proofs against one process and against the hand
    ZeRO-3, its bytes with and without resharding, and its mixed-precision step."""
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
    for name, options in variants.items():
        sharded = shard(model, mesh, **options)
        if name == "FSDP2":
            parameter = ShardedParameter(
                **describe_parameter(sharded, "blocks.0.mlp.gate_proj.weight"))
        step = fsdp_step(sharded, x, y, lr=config.lr, world_size=n)
        # the same step again, on a fresh copy, under PyTorch's FSDPMemTracker
        tracked = track_fsdp_step(shard(model, mesh, **options), x, y, optimizer="adam",
                                  lr=config.lr)
        output = [("output", step["output"])], [("output", rows_of(ref.output, r, n))]
        weights = max_over_ranks(max_diff(step["weights"], ref.weights), rank)
        if name == "FSDP2 bf16":
            proofs = bf16_proofs(
                config.lr, output=max_over_ranks(max_relative_diff(*output), rank),
                grads=max_over_ranks(max_relative_diff(step["grads"], ref.grads), rank),
                weights=weights)
        else:
            proofs = fsdp_proofs(
                config.lr, output=max_over_ranks(max_diff(*output), rank),
                grads=max_over_ranks(max_diff(step["grads"], ref.grads), rank),
                weights=weights,
                weights_vs_zero3=max_over_ranks(max_diff(step["weights"], zero3_weights), rank))
        runs[name] = Run(name, **_sent(step["counter"]), proofs=proofs,
                         tracker=TrackedMemory.of(tracked.own_peaks))
    return runs, parameter


def main(config: DataParallelConfig, rank: Rank) -> DataParallelResult:
    """Every section on this rank, from the same weights and batch; rank 0's result."""
    torch.set_num_threads(1)
    model = build_lm(config.model, seed=0).train().to(rank.device)
    ids, labels = global_batch(config, rank.device)
    ref = reference_step(model, ids, labels, config.lr)
    collectives = collectives_section(rank, config)
    ddp, ddp_first = ddp_section(rank, config, model, ids, labels, ref)
    zero, zero3_weights = zero_section(rank, config, model, ids, labels, ref, ddp_first)
    fsdp, parameter = fsdp_section(rank, config, model, ids, labels, ref, zero3_weights)
    return DataParallelResult(
        config=config, world_size=rank.world_size, backend=rank.backend, reason=rank.reason,
        parameters=sum(p.numel() for p in model.parameters()),
        parameter_tensors=len(list(model.parameters())),
        **collectives, **{**ddp, "runs": {**ddp["runs"], **zero, **fsdp}},
        fsdp_parameter=parameter)


if __name__ == "__main__":
    serve(DataParallelConfig, main)
