"""DDP on the ranks: the proof against one process, its buckets, their overlap with the
backward (timestamps from a communication hook), and ``no_sync`` gradient accumulation.

``DistributedDataParallel`` groups the gradients into buckets of about ``bucket_cap_mb``
(in reverse order of the parameters, the order the backward produces them) and starts a
bucket's all-reduce as soon as its last gradient is written, while the backward goes on
with the layers before. A communication hook (``register_comm_hook``) is DDP's own place
to run code on each bucket: ours timestamps it and does what the default hook does
(divide by N, all-reduce).
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
    """What a communication hook saw of one step: each bucket's parameters, size and times."""

    names: dict[int, str]
    world_size: int
    group: object = None
    buckets: list[dict] = field(default_factory=list)

    def hook(self, state, bucket):  # unannotated: DDP checks the annotation's type
        """DDP's default all-reduce (mean over the ranks) of a ``dist.GradBucket``,
        timestamped; returns its future."""
        buffer = bucket.buffer()
        record = {"index": bucket.index(), "bytes": buffer.numel() * buffer.element_size(),
                  "params": [self.names[id(p)] for p in bucket.parameters()],
                  "start_ns": time.perf_counter_ns(), "end_ns": None}
        self.buckets.append(record)
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


def ddp_step(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, *, lr: float,
             bucket_cap_mb: float, rank: int, world_size: int, steps: int, device) -> dict:
    """DDP's first step (proof, ledger, bytes sent), then ``steps`` more for the timeline."""
    ddp = wrap(model, device, bucket_cap_mb)
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    opt = adam(ddp.parameters(), lr)
    x, y = rows_of(ids, rank, world_size), rows_of(labels, rank, world_size)
    log = BucketLog(names, world_size)
    ddp.register_comm_hook(None, log.hook)
    runs = [_timed_step(ddp, opt, x, y, log) for _ in range(1 + steps)]
    return {"first": runs[0], "last": runs[-1]}


def _timed_step(ddp: DDP, opt, x, y, log: BucketLog) -> dict:
    log.buckets.clear()
    opt.zero_grad(set_to_none=False)
    computed = []
    hooks = [p.register_post_accumulate_grad_hook(lambda p: computed.append(time.perf_counter_ns()))
             for p in ddp.module.parameters()]
    counter = CommMeter()
    meter = SavedTensorMeter(ddp.module)
    with counter, meter:
        start = time.perf_counter_ns()
        out = ddp(x)
        loss = default_loss(out, y)
        backward_start = time.perf_counter_ns()
        loss.backward()
        backward_end = time.perf_counter_ns()
    for h in hooks:
        h.remove()
    grads = named_copy((n, p.grad) for n, p in ddp.module.named_parameters())
    opt.step()
    params = list(ddp.module.parameters())
    ledger = DeviceMemory(
        weights=storage_bytes(params), grads=storage_bytes(p.grad for p in params),
        optimizer_state=storage_bytes(optimizer_state(opt)),
        activations=sum(meter.peak.values()))
    return {"output": out.detach().cpu(), "grads": grads, "log": log,
            "buckets": [dict(b) for b in log.buckets], "counter": counter, "ledger": ledger,
            "start_ns": start, "backward_start_ns": backward_start,
            "compute_end_ns": max(computed), "backward_end_ns": backward_end,
            "weights": named_copy(ddp.module.named_parameters())}


def no_sync_step(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, *, lr: float,
                 bucket_cap_mb: float, rank: int, world_size: int, micro_steps: int,
                 device) -> dict:
    """``micro_steps`` forward-backward passes per rank, all but the last inside
    ``no_sync()``, then one Adam step: the all-reduces each micro-step issued, and the
    updated weights."""
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
    opt.step()
    return {"all_reduces": calls, "weights": named_copy(ddp.module.named_parameters())}

