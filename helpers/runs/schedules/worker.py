"""One rank of the pipeline-schedules lesson: ``torchrun -m helpers.runs.schedules.worker``.

Every rank builds the same MLP stack, keeps its chunks, and for each schedule first proves
one training step against the one-process step with gradients accumulated over the same
micro-batches, then times ``--steps`` steps, recording every stage action (F, B, I, W and
send and receive waits) and the live activation bytes of the last one, and last runs one
untimed step that counts the sends and receives the schedule posts and the bytes that
leave this rank's sockets (``transfers``). Rank 0 returns a ``SchedulesResult``.
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


def wire_reason(backend: str, wire: WireMeter) -> str | None:
    """Why the wire is not read on this run (None: it is)."""
    if backend != "gloo":
        return f"backend {backend}: the tensors go device to device, not through the sockets"
    return wire.reason


def counted_step(pipe, x: torch.Tensor, y: torch.Tensor, backend: str) -> tuple[RankTransfers,
                                                                               str | None]:
    """One untimed step: the sends and receives posted, and this rank's socket bytes."""
    dist.barrier()
    with WireMeter() as wire, count_transfers() as counted:
        train_step(pipe, x, y)
    reason = wire_reason(backend, wire)
    return RankTransfers(counted.sends, counted.receives, counted.sent_bytes,
                         None if reason else wire.sent), reason


def run(
    name: str,
    model: nn.Sequential,
    rank: Rank,
    config: SchedulesConfig,
    x: torch.Tensor,
    y: torch.Tensor,
) -> ScheduleRun | None:
    """Prove one step of ``name``, then time ``config.steps`` steps; events of the last one."""
    chunks = validate_plan(name, rank.world_size, config.microbatches, config.blocks, config.batch)
    copied = copy.deepcopy(model)
    mine = {
        i: chunk_of(copied, chunks, i).to(rank.device)
        for i in rank_chunks(name, rank.rank, rank.world_size)
    }
    pipe = build_pipeline(mine, chunks, name, config.microbatches, rank.device, config.lr)
    reference = copy.deepcopy(model) if rank.rank == 0 else None
    proof = prove_step(pipe, reference, x, y, config.microbatches, config.lr)
    times: list[float] = []
    actions, span, peak = [], (0, 0), 0
    for _ in range(config.steps):
        meter = SavedTensorMeter(nn.ModuleList(pipe.chunks.values()))
        dist.barrier()
        start = time.monotonic_ns()
        with meter, record_actions(rank.rank, pipe.stages, meter) as recorded:
            train_step(pipe, x, y)
        end = time.monotonic_ns()
        dist.barrier()
        times.append((end - start) / 1e9)
        actions, span, peak = recorded, (start, end), sum(meter.peak.values())
    transfers, reason = counted_step(pipe, x, y, rank.backend)
    everything = [None] * rank.world_size if rank.rank == 0 else None
    dist.gather_object(([a.as_dict() for a in actions], span, peak, transfers.to_dict()),
                       everything, dst=0)
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
        peak_activation_bytes=[e[2] for e in everything],
        message_bytes=x.chunk(config.microbatches)[0].nbytes,
        transfers=[RankTransfers.from_dict(e[3]) for e in everything],
        wire_reason=reason,
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
