"""One rank of the pipeline-schedules lesson: ``torchrun -m helpers.runs.schedules.worker``.

Every rank builds the same MLP stack, keeps its chunks, and for each schedule first proves
one training step against the one-process step with gradients accumulated over the same
micro-batches, runs ``--warmup`` untimed steps, then times ``--steps`` steps, recording
every stage action (F, B, I, W and send and receive waits) of the last one. A last,
untimed step runs under every meter: ``SavedTensorMeter`` (a hook on every tensor saved
for backward, which would slow a timed step), for the live activation bytes after each
action, and the counts of the sends and receives the schedule posts and of the bytes that
leave this rank's sockets (``transfers``). Rank 0 prints what it is doing (the launcher shows its
last line while the cell waits) and returns a ``SchedulesResult``.
The step and its proof are ``helpers.pipeline.runtime``'s, the same code as lesson 03's.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
from torch import nn

from helpers.comm.wire import WireMeter
from helpers.memory.saved import SavedTensorMeter
from helpers.models.mlp_stack import build_stack, chunk_of
from helpers.pipeline.events import record_actions
from helpers.pipeline.runtime import build_pipeline, prove_step, rank_chunks, train_step
from helpers.runs.contract import serve
from helpers.runs.schedules.config import SchedulesConfig, validate_plan
from helpers.runs.schedules.results import ScheduleRun, SchedulesResult, StepProof
from helpers.runs.schedules.transfers import RankTransfers, count_transfers
from helpers.torchrun.ranks import Rank
from helpers.torchrun.status import say


def wire_reason(backend: str, wire: WireMeter) -> str | None:
    """Why the wire is not read on this run (None: it is)."""
    if backend != "gloo":
        return f"backend {backend}: the tensors go device to device, not through the sockets"
    return wire.reason


def metered_step(pipe, rank: Rank, x: torch.Tensor, y: torch.Tensor) -> dict:
    """One untimed step under every meter: its compute actions with the live activation
    bytes after each (``memory``), its ``start`` (ns), this rank's ``peak`` of activation
    bytes, the sends and receives it posted and its socket bytes (``transfers``), and why
    the sockets were not read (``reason``, None when they were)."""
    meter = SavedTensorMeter(nn.ModuleList(pipe.chunks.values()))
    dist.barrier()
    start = time.monotonic_ns()
    with (WireMeter() as wire, count_transfers() as counted, meter,
          record_actions(rank.rank, pipe.stages, meter) as recorded):
        train_step(pipe, x, y)
    reason = wire_reason(rank.backend, wire)
    transfers = RankTransfers(counted.sends, counted.receives, counted.sent_bytes,
                              None if reason else wire.sent)
    return {"memory": [a.as_dict() for a in recorded if a.kind != "wait"], "start": start,
            "peak": sum(meter.peak.values()), "transfers": transfers.to_dict(),
            "reason": reason}


def run(
    name: str,
    model: nn.Sequential,
    rank: Rank,
    config: SchedulesConfig,
    x: torch.Tensor,
    y: torch.Tensor,
) -> ScheduleRun | None:
    """Prove one step of ``name``, warm up, time ``config.steps`` steps (the events of the
    last one kept), then meter its activations and count its transfers in one untimed step."""
    chunks = validate_plan(name, rank.world_size, config.microbatches, config.blocks, config.batch)
    copied = copy.deepcopy(model)
    mine = {
        i: chunk_of(copied, chunks, i).to(rank.device)
        for i in rank_chunks(name, rank.rank, rank.world_size)
    }
    pipe = build_pipeline(mine, chunks, name, config.microbatches, rank.device, config.lr)
    reference = copy.deepcopy(model) if rank.rank == 0 else None
    say(rank, f"{name}: proof step")
    proof = prove_step(pipe, reference, x, y, config.microbatches, config.lr)
    for step in range(config.warmup):
        say(rank, f"{name}: warm-up step {step + 1} of {config.warmup}")
        dist.barrier()
        train_step(pipe, x, y)
    times: list[float] = []
    actions, span = [], (0, 0)
    for step in range(config.steps):
        say(rank, f"{name}: timed step {step + 1} of {config.steps}")
        dist.barrier()
        start = time.monotonic_ns()
        with record_actions(rank.rank, pipe.stages) as recorded:
            train_step(pipe, x, y)
        end = time.monotonic_ns()
        dist.barrier()
        times.append((end - start) / 1e9)
        actions, span = recorded, (start, end)
    say(rank, f"{name}: a last step, untimed, meters activations and transfers")
    metered = metered_step(pipe, rank, x, y)
    everything = [None] * rank.world_size if rank.rank == 0 else None
    dist.gather_object(([a.as_dict() for a in actions], span, metered), everything, dst=0)
    if everything is None or proof is None:
        return None
    c = proof.comparison
    return ScheduleRun(
        name=name,
        ranks=rank.world_size,
        microbatches=config.microbatches,
        proof=StepProof(output_diff=c.output, grad_diff=c.grads, weight_diff=c.weights),
        times_s=times,
        actions=[a for e in everything for a in e[0]],
        start_ns=min(e[1][0] for e in everything),
        end_ns=max(e[1][1] for e in everything),
        peak_activation_bytes=[e[2]["peak"] for e in everything],
        memory_actions=[a for e in everything for a in e[2]["memory"]],
        memory_start_ns=min(e[2]["start"] for e in everything),
        message_bytes=x.chunk(config.microbatches)[0].nbytes,
        transfers=[RankTransfers.from_dict(e[2]["transfers"]) for e in everything],
        wire_reason=metered["reason"],
    )


def main(config: SchedulesConfig, rank: Rank) -> SchedulesResult | None:
    """Every schedule of ``config`` on this rank; rank 0 returns the result, the others None."""
    torch.set_num_threads(1)
    model = build_stack(config.width, config.blocks)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(config.batch, config.width, generator=g).to(rank.device)
    y = torch.randn(config.batch, config.width, generator=g).to(rank.device)
    runs = {name: run(name, model, rank, config, x, y) for name in config.schedules}
    if rank.rank != 0:
        return None
    return SchedulesResult(config, rank.backend, runs)


if __name__ == "__main__":
    serve(SchedulesConfig, main)
