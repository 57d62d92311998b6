"""DDP on the ranks: the proof against one process, its buckets, their overlap with the
backward (timestamps from a communication hook), and ``no_sync`` gradient accumulation.

``DistributedDataParallel`` groups the gradients into buckets, each closed by the
parameter that brings it to ``bucket_cap_mb`` or past it (in the first step one bucket;
after it, in the order the backward produced the gradients), and starts a bucket's
all-reduce as soon as its last gradient is written, while the backward goes on with the
layers before. A communication hook (``register_comm_hook``) is DDP's own place
to run code on each bucket: ours timestamps it and does what the default hook does
(divide by N, all-reduce).
The step that is counted (``CommMeter``) and measured (``SavedTensorMeter``) is not the
step that is timed: both meters slow what they watch.
"""

from __future__ import annotations

import copy
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.comm.meter import CommMeter
from helpers.data_parallel.rank_step import (
    adam,
    named_copy,
    optimizer_state,
    rows_of,
    storage_bytes,
)
from helpers.memory.ledger import DeviceMemory
from helpers.memory.measure import default_loss
from helpers.memory.saved import SavedTensorMeter


@dataclass
class BucketLog:
    """What a communication hook saw of one step: each bucket's parameters, size and times.

    ``communicate=False`` makes the hook skip the all-reduce (the bucket is returned as it
    is): the same DDP step without its communication, for timing only."""

    names: dict[int, str]
    world_size: int
    group: object = None
    communicate: bool = True
    buckets: list[dict] = field(default_factory=list)

    def hook(self, state, bucket):  # unannotated: DDP checks the annotation's type
        """DDP's default all-reduce (mean over the ranks) of a ``dist.GradBucket``,
        timestamped; returns its future."""
        buffer = bucket.buffer()
        record = {"index": bucket.index(), "bytes": buffer.numel() * buffer.element_size(),
                  "params": [self.names[id(p)] for p in bucket.parameters()],
                  "param_bytes": [p.numel() * p.element_size() for p in bucket.parameters()],
                  "start_ns": time.perf_counter_ns(), "end_ns": None}
        self.buckets.append(record)
        if not self.communicate:
            record["end_ns"] = record["start_ns"]
            skipped: torch.futures.Future = torch.futures.Future()
            skipped.set_result(buffer)
            return skipped
        buffer.div_(self.world_size)
        future = dist.all_reduce(buffer, group=self.group, async_op=True).get_future()

        def done(fut: torch.futures.Future) -> torch.Tensor:
            record["end_ns"] = time.perf_counter_ns()
            return fut.value()[0]

        return future.then(done)


def wrap(model: nn.Module, device: torch.device, bucket_cap_mb: float, group=None) -> DDP:
    """DDP over a copy of ``model``; gradients live in the buckets (no second copy)."""
    return DDP(copy.deepcopy(model), device_ids=[device] if device.type == "cuda" else None,
               bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=True, process_group=group)


def _hooked(model: nn.Module, *, lr: float, bucket_cap_mb: float, world_size: int,
            device, communicate: bool) -> tuple[DDP, torch.optim.Optimizer, BucketLog]:
    ddp = wrap(model, device, bucket_cap_mb)
    log = BucketLog({id(p): n for n, p in ddp.module.named_parameters()}, world_size,
                    communicate=communicate)
    ddp.register_comm_hook(None, log.hook)
    return ddp, adam(ddp.parameters(), lr), log


def ddp_step(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, *, lr: float,
             bucket_cap_mb: float, rank: int, world_size: int, steps: int, device,
             meter: CommMeter | None = None) -> dict:
    """DDP's first step, counted and measured but not timed (proof, ledger, bytes sent, under
    ``meter``), then ``steps`` timed steps with no meter, alternating with the same steps of
    a second DDP whose hook skips the all-reduces (``"silent"``): hook timestamps only."""
    x, y = rows_of(ids, rank, world_size), rows_of(labels, rank, world_size)
    options = {"lr": lr, "bucket_cap_mb": bucket_cap_mb, "world_size": world_size,
               "device": device}
    ddp, opt, log = _hooked(model, communicate=True, **options)
    silent, silent_opt, silent_log = _hooked(model, communicate=False, **options)
    first = _counted_step(ddp, opt, x, y, log, meter or CommMeter())
    _timed_step(silent, silent_opt, x, y, silent_log)  # its first step: one bucket, a warm-up
    timed, quiet = [], []
    for _ in range(steps):
        timed.append(_timed_step(ddp, opt, x, y, log))
        quiet.append(_timed_step(silent, silent_opt, x, y, silent_log))
    return {"first": first, "timed": timed, "silent": quiet}


def _counted_step(ddp: DDP, opt, x, y, log: BucketLog, counter: CommMeter) -> dict:
    """One step under the meters: what it sent, and what it held (not timed)."""
    log.buckets.clear()
    opt.zero_grad(set_to_none=False)
    meter = SavedTensorMeter(ddp.module)
    with counter, meter:
        out = ddp(x)
        default_loss(out, y).backward()
    grads = named_copy((n, p.grad) for n, p in ddp.module.named_parameters())
    opt.step()
    params = list(ddp.module.parameters())
    ledger = DeviceMemory(
        weights=storage_bytes(params), grads=storage_bytes(p.grad for p in params),
        optimizer_state=storage_bytes(optimizer_state(opt)),
        activations=sum(meter.peak.values()))
    return {"output": out.detach().cpu(), "grads": grads, "counter": counter,
            "buckets": [dict(b) for b in log.buckets], "ledger": ledger,
            "weights": named_copy(ddp.module.named_parameters())}


def _timed_step(ddp: DDP, opt, x, y, log: BucketLog) -> dict:
    """One step with no meter: timestamps from the hooks (each parameter's gradient, each
    bucket's all-reduce) and around the backward."""
    log.buckets.clear()
    opt.zero_grad(set_to_none=False)
    computed = []
    hooks = [p.register_post_accumulate_grad_hook(lambda p: computed.append(time.perf_counter_ns()))
             for p in ddp.module.parameters()]
    start = time.perf_counter_ns()
    loss = default_loss(ddp(x), y)
    backward_start = time.perf_counter_ns()
    loss.backward()
    backward_end = time.perf_counter_ns()
    for h in hooks:
        h.remove()
    opt.step()
    return {"buckets": [dict(b) for b in log.buckets], "start_ns": start,
            "backward_start_ns": backward_start, "compute_end_ns": max(computed),
            "backward_end_ns": backward_end}


def no_sync_step(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, *, lr: float,
                 bucket_cap_mb: float, rank: int, world_size: int, micro_steps: int,
                 device) -> dict:
    """``micro_steps`` forward-backward passes per rank, all but the last inside
    ``no_sync()``, then one Adam step: the all-reduces each micro-step issued, the
    gradients after the last micro-step (summed over the micro-steps, averaged over the
    ranks) and the updated weights."""
    ddp = wrap(model, device, bucket_cap_mb)
    opt = adam(ddp.parameters(), lr)
    calls = []
    for k in range(micro_steps):
        x = rows_of(ids, rank, world_size, k, micro_steps)
        y = rows_of(labels, rank, world_size, k, micro_steps)
        counter = CommMeter()
        context = ddp.no_sync() if k < micro_steps - 1 else nullcontext()
        with context, counter:
            (default_loss(ddp(x), y) / micro_steps).backward()
        calls.append(counter.per_collective.calls["all_reduce"])
    grads = named_copy((n, p.grad) for n, p in ddp.module.named_parameters())
    opt.step()
    return {"all_reduces": calls, "grads": grads,
            "weights": named_copy(ddp.module.named_parameters())}

