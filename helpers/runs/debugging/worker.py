"""One rank of lesson 12's traced launch: ``torchrun --nproc-per-node=2 -m
helpers.runs.debugging.worker --trace-dir results/traces``.

Every rank profiles (``torch.profiler``) and writes its own Chrome trace for:

1. a DDP step of the small Llama with its buckets' all-reduces overlapping the backward
   (``--bucket-cap-mb``), and one with a single bucket, which can only start once the
   backward is done; a communication hook timestamps each bucket (lesson 06's way);
2. a GPipe step of an MLP stack on ``torch.distributed.pipelining``, its actions
   recorded (lesson 04's way);
3. without the profiler, ``CommDebugMode`` counts the collectives of one training step
   of the tensor-parallel plan (lesson 09's ``parallelize_module``), without and with
   sequence parallelism.

Rank 0 prints its result as one JSON line.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from helpers.data_parallel.ddp import BucketLog, wrap
from helpers.models.llama import build_lm
from helpers.models.mlp_stack import build_stack, chunk_of
from helpers.pipeline.events import idle_fractions, record_actions
from helpers.pipeline.runtime import build_pipeline, train_step
from helpers.runs.contract import serve
from helpers.runs.debugging.config import TraceConfig
from helpers.runs.debugging.results import (
    BucketSpan,
    DDPTrace,
    PipelineTrace,
    PlanCounts,
    TraceRunResult,
)
from helpers.runs.tp_llama.step import make_batch, native_step
from helpers.torchrun.ranks import Rank
from helpers.torchrun.status import say

DDP_STEP, PIPELINE_STEP = "ddp step", "pipeline step"
ONE_BUCKET_MB = 1024.0  # larger than the model: one bucket, all-reduced after the backward


def activities(rank: Rank) -> list[ProfilerActivity]:
    """The CPU's operators, and on a GPU its kernels too."""
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if rank.device.type == "cuda"
                                     else [])


def sync(rank: Rank) -> None:
    if rank.device.type == "cuda":
        torch.cuda.synchronize(rank.device)


def trace_ddp(config: TraceConfig, rank: Rank, setting: str, cap_mb: float) -> DDPTrace:
    """Warm up, then profile one DDP step; this rank's trace file and its buckets."""
    model = build_lm(config.model, seed=0).train()
    ddp = wrap(model, rank.device, cap_mb, rank.group)
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    log = BucketLog(names, rank.world_size, rank.group)
    ddp.register_comm_hook(None, log.hook)
    ids, targets = make_batch(config.model.vocab, config.batch, config.seq, seed=rank.rank)
    ids, targets = ids.to(rank.device), targets.to(rank.device)

    def step() -> None:
        logits = ddp(ids)
        F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
        sync(rank)

    for _ in range(config.warmup):
        step()
    log.buckets.clear()
    path = Path(config.trace_dir) / f"ddp_{setting}_rank{rank.rank}.json"
    dist.barrier(group=rank.group)
    with profile(activities=activities(rank)) as prof:
        with record_function(DDP_STEP):
            step()
    prof.export_chrome_trace(str(path))
    spans = [BucketSpan(b["index"], b["bytes"], b["start_ns"], b["end_ns"]) for b in log.buckets]
    return DDPTrace(setting, cap_mb, str(path), spans)


def trace_pipeline(config: TraceConfig, rank: Rank) -> PipelineTrace:
    """Warm up, then profile one GPipe step; this rank's trace and its recorded actions."""
    model = build_stack(config.pipe_width, config.pipe_blocks, seed=0)
    mine = {rank.rank: chunk_of(model, rank.world_size, rank.rank).to(rank.device)}
    pipe = build_pipeline(mine, rank.world_size, "gpipe", config.microbatches, rank.device,
                          lr=0.01)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(config.pipe_batch, config.pipe_width, generator=g).to(rank.device)
    y = torch.randn(config.pipe_batch, config.pipe_width, generator=g).to(rank.device)
    for _ in range(max(1, config.warmup)):  # a stage's first step infers its shapes
        train_step(pipe, x, y)
    path = Path(config.trace_dir) / f"pipeline_rank{rank.rank}.json"
    dist.barrier(group=rank.group)
    with profile(activities=activities(rank)) as prof:
        with record_function(PIPELINE_STEP):
            start = time.monotonic_ns()
            with record_actions(rank.rank, pipe.stages) as actions:
                train_step(pipe, x, y)
            sync(rank)
            end = time.monotonic_ns()
    prof.export_chrome_trace(str(path))
    idle = idle_fractions(actions, rank.world_size, start, end)[rank.rank]
    return PipelineTrace(str(path), idle, config.microbatches)


def op_name(op: object) -> str:
    """``all_reduce`` for the operator ``_c10d_functional.all_reduce.default``."""
    parts = str(op).split(".")
    return parts[-2] if parts[-1] == "default" else parts[-1]


def count_plan(config: TraceConfig, rank: Rank, sequence_parallel: bool) -> PlanCounts:
    """``CommDebugMode``'s count of one training step of the tensor-parallel plan."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    from helpers.tensor_parallel.plans import parallelize_llama

    mesh = init_device_mesh(rank.device.type, (rank.world_size,), mesh_dim_names=("tp",))
    model = parallelize_llama(build_lm(config.model, seed=0).to(rank.device), mesh,
                              sequence_parallel=sequence_parallel)
    ids, targets = make_batch(config.model.vocab, config.batch, config.seq, seed=0)
    with CommDebugMode() as mode:
        native_step(model, ids.to(rank.device), targets.to(rank.device), lr=0.1)
    total = {op_name(op): n for op, n in mode.get_comm_counts().items()}
    per_module = {f"{module} ({direction})": {op_name(op): n for op, n in ops.items() if n}
                  for module, passes in mode.comm_module_counts.items()
                  for direction, ops in passes.items() if direction in ("forward", "backward")}
    return PlanCounts(sequence_parallel, total, {m: c for m, c in per_module.items() if c})


def main(config: TraceConfig, rank: Rank) -> TraceRunResult:
    Path(config.trace_dir).mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    say(rank, "DDP step, buckets overlapping the backward")
    overlapped = trace_ddp(config, rank, "overlap", config.bucket_cap_mb)
    say(rank, "DDP step, one bucket after the backward")
    after = trace_ddp(config, rank, "one_bucket", ONE_BUCKET_MB)
    say(rank, "GPipe step")
    pipeline = trace_pipeline(config, rank)
    say(rank, "CommDebugMode on the tensor-parallel plan")
    plans = [count_plan(config, rank, sp) for sp in (False, True)]
    mine = (overlapped, after, pipeline)
    everyone: list = [None] * rank.world_size
    dist.all_gather_object(everyone, [m.to_dict() for m in mine], group=rank.group)
    result = TraceRunResult(
        config.model, config.batch, config.seq,
        [DDPTrace.from_dict(e[0]) for e in everyone],
        [DDPTrace.from_dict(e[1]) for e in everyone],
        [PipelineTrace.from_dict(e[2]) for e in everyone], plans,
        rank.device.type)
    if rank.rank == 0:
        print(json.dumps({"ranks": rank.world_size, "traces": len(everyone) * 3,
                          "plans": [p.total for p in plans]}), flush=True)
    return result


if __name__ == "__main__":
    serve(TraceConfig, main)
