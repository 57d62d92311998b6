"""One rank of lesson 06: ``torchrun -m helpers.runs.data_parallel.worker --config '{...}'``.

Every rank, in one launch: checks and times the four collectives; runs one Adam step of
lesson 05's small Llama under DDP, the hand-written ZeRO stages 1-3 and FSDP2, each from
the same weights on its share of the same batch; proves each against one process on the
whole batch (which every rank computes for itself); measures what it holds and counts what
it sends. Rank 0 writes the JSON that ``helpers.runs.data_parallel.results`` reads.
"""

from __future__ import annotations

import copy
from dataclasses import asdict

import torch
import torch.distributed as dist

from helpers.comm.collectives import (
    COLLECTIVES,
    CommCounter,
    expected_result,
    rank_input,
    ring_bytes,
    run_collective,
)
from helpers.core.timing import synchronized_clock
from helpers.data_parallel.ddp import ddp_step, no_sync_step
from helpers.data_parallel.fsdp import describe_parameter, fsdp_step, fsdp_units, shard
from helpers.data_parallel.zero import HandZero
from helpers.memory.ledger import DeviceMemory
from helpers.memory.measure import default_loss
from helpers.memory.saved import SavedTensorMeter
from helpers.memory.torch_trackers import track_fsdp_step
from helpers.runs.data_parallel.config import WORKER, DataParallelConfig
from helpers.runs.data_parallel.step import (
    build_model,
    global_batch,
    max_diff,
    max_relative_diff,
    reference_step,
    rows_of,
)
from helpers.torchrun.ranks import (
    Rank,
    exit_worker,
    max_over_ranks,
    process_group,
    worker_main,
    write_result,
)

MODULE = WORKER


def collectives_section(rank: Rank, config: DataParallelConfig) -> dict:
    """What each collective computes (checked against a local computation), and its times:
    after warm-up calls, ``repeats`` rounds of ``collective_repeats`` calls back to back (as
    nccl-tests times them), each round's time divided by its calls."""
    n, r, device = rank.world_size, rank.rank, rank.device
    checks = {}
    for name in COLLECTIVES:
        inputs = [rank_input(q, 4 * n) for q in range(n)]
        got = run_collective(name, inputs[r].to(device), r, n)
        wrong = (got.cpu() - expected_result(name, inputs, r)).abs().max().item()
        checks[name] = max_over_ranks(wrong, rank)
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
            rows.append({"bytes": full.numel() * 4,
                         "sent_bytes": ring_bytes(name, n, full.numel() * 4), "times_s": times})
        timings[name] = rows
    return {"checks": checks, "timings": timings}


def _counted(counter: CommCounter) -> dict:
    return {"calls": dict(counter.calls), "sent": dict(counter.sent)}


def ddp_section(rank: Rank, config: DataParallelConfig, model, ids, labels, ref) -> dict:
    """DDP's proof, ledger, bytes and bucket timeline; the no_sync proof."""
    n, r = rank.world_size, rank.rank
    run = ddp_step(model, ids, labels, lr=config.lr, bucket_cap_mb=config.bucket_cap_mb,
                   rank=r, world_size=n, steps=config.steps, device=rank.device)
    first, last = run["first"], run["last"]
    diffs = {
        "output": max_over_ranks(
            (first["output"] - rows_of(ref.output, r, n)).abs().max().item(), rank),
        "grads": max_over_ranks(max_diff(first["grads"], ref.grads), rank),
        "weights": max_over_ranks(max_diff(first["weights"], ref.weights), rank),
    }
    accumulated = no_sync_step(model, ids, labels, lr=config.lr,
                               bucket_cap_mb=config.bucket_cap_mb, rank=r, world_size=n,
                               micro_steps=config.accumulation, device=rank.device)
    timeline = {k: last[k] - last["start_ns"] for k in
                ("backward_start_ns", "compute_end_ns", "backward_end_ns")}
    timeline["buckets"] = [{**b, "start_ns": b["start_ns"] - last["start_ns"],
                            "end_ns": b["end_ns"] - last["start_ns"]} for b in last["buckets"]]
    return {
        "diffs": diffs, "ledger": asdict(first["ledger"]), "comm": _counted(first["counter"]),
        "first_buckets": len(first["buckets"]),  # DDP's first step: one bucket (see ddp.py)
        "buckets": [{"index": b["index"], "bytes": b["bytes"], "params": b["params"]}
                    for b in last["buckets"]],
        "timeline": timeline,
        "no_sync": {"all_reduces": accumulated["all_reduces"],
                    "weights_diff": max_over_ranks(
                        max_diff(accumulated["weights"], ref.weights), rank)},
    }, first


def zero_section(rank: Rank, config: DataParallelConfig, model, ids, labels, ref,
                 ddp_first: dict) -> dict:
    """Each hand-written ZeRO stage: one step, its ledger, its bytes, its proofs."""
    n, r = rank.world_size, rank.rank
    x, y = rows_of(ids, r, n), rows_of(labels, r, n)
    out, weights = {}, {}
    for stage in (1, 2, 3):
        local = copy.deepcopy(model)
        zero = HandZero(local, fsdp_units(local), stage, lr=config.lr)
        counter, meter = CommCounter(n), SavedTensorMeter(local)
        with counter, meter:
            output = zero.step(x, y, default_loss)
        zero.remove()
        ledger = DeviceMemory(**zero.peak, activations=sum(meter.peak.values()))
        weights[stage] = zero.full_weights()
        mine = [(name, g.view(-1).chunk(n)[r]) for name, g in ref.grads]  # slice r of each
        out[stage] = {
            "grads_vs_one_process": max_over_ranks(max_diff(zero.grad_slices(), mine), rank),
            "ledger": asdict(ledger), "comm": _counted(counter),
            "vs_ddp": {"output": max_over_ranks(
                           (output.cpu() - ddp_first["output"]).abs().max().item(), rank),
                       "weights": max_over_ranks(max_diff(weights[stage], ddp_first["weights"]),
                                                 rank)},
            "vs_one_process": max_over_ranks(max_diff(weights[stage], ref.weights), rank),
        }
    return out, weights[3]


def fsdp_section(rank: Rank, config: DataParallelConfig, model, ids, labels, ref,
                 zero3_weights: list) -> dict:
    """FSDP2: its DTensor parameters, its proofs against one process and against the hand
    ZeRO-3, its bytes with and without resharding, and its mixed-precision step."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    n, r = rank.world_size, rank.rank
    x, y = rows_of(ids, r, n), rows_of(labels, r, n)
    mesh = init_device_mesh(rank.device.type, (n,), mesh_dim_names=("dp",))
    runs = {}
    variants = {
        "reshard": {"reshard_after_forward": True},
        "keep": {"reshard_after_forward": False},
        "bf16": {"reshard_after_forward": True, "mp_policy": MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32)},
    }
    for name, options in variants.items():
        sharded = shard(model, mesh, **options)
        described = describe_parameter(sharded, "blocks.0.mlp.gate_proj.weight")
        step = fsdp_step(sharded, x, y, lr=config.lr, world_size=n)
        output = [("output", step["output"])], [("output", rows_of(ref.output, r, n))]
        # the same step again, on a fresh copy, under PyTorch's FSDPMemTracker
        tracked = track_fsdp_step(shard(model, mesh, **options), x, y, optimizer="adam",
                                  lr=config.lr)
        runs[name] = {
            "tracker": dict(tracked.own_peaks),
            "parameter": described, "comm": _counted(step["counter"]),
            "diffs": {"output": max_over_ranks(max_diff(*output), rank),
                      "grads": max_over_ranks(max_diff(step["grads"], ref.grads), rank),
                      "weights": max_over_ranks(max_diff(step["weights"], ref.weights), rank),
                      "zero3_weights": max_over_ranks(max_diff(step["weights"], zero3_weights),
                                                      rank)},
            "relative": {"output": max_over_ranks(max_relative_diff(*output), rank),
                         "grads": max_over_ranks(max_relative_diff(step["grads"], ref.grads),
                                                 rank)},
        }
    return runs


def main(argv: list[str] | None = None) -> None:
    config = DataParallelConfig.from_args(argv)
    with process_group(MODULE, device=config.device) as rank:
        torch.set_num_threads(1)
        config.validate(rank.world_size)  # on every rank, before any step
        model = build_model(config.lm, rank.device)
        ids, labels = global_batch(config.vocab, config.batch, config.seq, rank.device)
        ref = reference_step(model, ids, labels, config.lr)
        result = {"world_size": rank.world_size, "backend": rank.backend,
                  "reason": rank.reason, "config": asdict(config),
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "parameter_tensors": len(list(model.parameters()))}
        result["collectives"] = collectives_section(rank, config)
        result["ddp"], ddp_first = ddp_section(rank, config, model, ids, labels, ref)
        result["zero"], zero3_weights = zero_section(rank, config, model, ids, labels, ref,
                                                     ddp_first)
        result["fsdp"] = fsdp_section(rank, config, model, ids, labels, ref, zero3_weights)
        write_result(rank, result)


if __name__ == "__main__":
    exit_worker(worker_main(MODULE, main))
