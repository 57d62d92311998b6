"""One rank of the pipeline-schedules lesson: ``torchrun -m helpers.pipeline.schedules_worker``.

Every rank builds the same MLP stack, keeps its chunks, and for each schedule first proves
one training step against the one-process step with gradients accumulated over the same
micro-batches, then times ``--steps`` steps, recording every stage action (F, B, I, W and
send and receive waits) and the live activation bytes of the last one. Rank 0 returns JSON.
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

from helpers.core.checks import StepResult, compare_steps
from helpers.distributed.ranks import Rank, process_group, worker_main, write_result
from helpers.memory.saved import SavedTensorMeter
from helpers.pipeline.events import record_actions
from helpers.pipeline.mlp_stack import (
    WORKER,
    SchedulesConfig,
    build_stack,
    chunk_of,
    rank_chunks,
    validate_plan,
)
from helpers.pipeline.schedule import accumulated_step

CLASSES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
           "interleaved_1f1b": ScheduleInterleaved1F1B, "zero_bubble": ScheduleInterleavedZeroBubble}
MODULE = WORKER


class Runner:
    """This rank's chunks of one schedule, with their optimizer and one step function."""

    def __init__(self, name: str, model: nn.Sequential, rank: Rank, config: SchedulesConfig):
        chunks = validate_plan(name, rank.world_size, config.microbatches, config.blocks, config.batch)
        self.ids = rank_chunks(name, rank.rank, rank.world_size)
        self.modules = [chunk_of(model, chunks, i).to(rank.device) for i in self.ids]
        self.stages = [PipelineStage(m, i, chunks, rank.device)
                       for m, i in zip(self.modules, self.ids, strict=True)]
        one = self.stages[0] if len(self.stages) == 1 else self.stages
        self.schedule = CLASSES[name](one, config.microbatches, loss_fn=nn.MSELoss())
        params = [p for m in self.modules for p in m.parameters()]
        self.optimizer = torch.optim.SGD(params, lr=config.lr)
        self.first = 0 in self.ids
        self.last = chunks - 1 in self.ids

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """One training step; the output on the rank holding the last chunk."""
        self.optimizer.zero_grad()
        kwargs = {"target": y, "losses": []} if self.last else {}
        out = self.schedule.step(x, **kwargs) if self.first else self.schedule.step(**kwargs)
        self.optimizer.step()
        return out


def prove(runner: Runner, reference: nn.Sequential | None, x, y,
          config: SchedulesConfig) -> dict | None:
    """The step's gradients, weights and output on rank 0 against the one-process step."""
    out = runner.step(x, y)
    mine = {i: [(n, p.grad.detach().cpu().clone(), p.detach().cpu().clone())
                for n, p in m.named_parameters()] for i, m in zip(runner.ids, runner.modules,
                                                                   strict=True)}
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object((mine, None if out is None else out.detach().cpu()), gathered, dst=0)
    if gathered is None:
        return None
    ref = accumulated_step(reference, x.cpu(), y.cpu(), config.microbatches, lr=config.lr)
    chunks = {i: rows for part, _ in gathered for i, rows in part.items()}
    rows = [r for i in sorted(chunks) for r in chunks[i]]
    output = next(o for _, o in gathered if o is not None)
    c = compare_steps(ref, StepResult(output, ref.loss, [(n, g) for n, g, _ in rows],
                                      [(n, w) for n, _, w in rows]))
    return {"output_diff": c.output, "grad_diff": c.grads, "weight_diff": c.weights}


def run(name: str, model: nn.Sequential, rank: Rank, config: SchedulesConfig, x, y) -> dict:
    """Prove one step of ``name``, then time ``config.steps`` steps; events of the last one."""
    runner = Runner(name, copy.deepcopy(model), rank, config)
    reference = copy.deepcopy(model) if rank.rank == 0 else None
    proof = prove(runner, reference, x, y, config)
    times: list[float] = []
    actions, span, peak = [], (0, 0), 0
    for _ in range(config.steps):
        meter = SavedTensorMeter(nn.ModuleList(runner.modules))
        dist.barrier()
        start = time.monotonic_ns()
        with meter, record_actions(rank.rank, runner.stages, meter) as recorded:
            runner.step(x, y)
        end = time.monotonic_ns()
        dist.barrier()
        times.append((end - start) / 1e9)
        actions, span, peak = recorded, (start, end), sum(meter.peak.values())
    everything = [None] * rank.world_size if rank.rank == 0 else None
    dist.gather_object(([a.as_dict() for a in actions], span, peak), everything, dst=0)
    if everything is None:
        return {}
    return {"proof": proof, "times_s": times, "actions": [a for e in everything for a in e[0]],
            "start_ns": min(e[1][0] for e in everything), "end_ns": max(e[1][1] for e in everything),
            "peak_activation_bytes": [e[2] for e in everything]}


def main(argv: list[str] | None = None) -> None:
    config = SchedulesConfig.from_args(argv)
    with process_group(MODULE) as rank:
        torch.set_num_threads(1)
        # every choice checked on every rank before any step
        config = replace(config, ranks=rank.world_size).validate()
        model = build_stack(config.width, config.blocks)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(config.batch, config.width, generator=g).to(rank.device)
        y = torch.randn(config.batch, config.width, generator=g).to(rank.device)
        result = {"ranks": rank.world_size, "backend": rank.backend, "microbatches":
                  config.microbatches, "batch": config.batch, "width": config.width,
                  "blocks": config.blocks, "schedules": {}}
        for name in config.schedules:
            result["schedules"][name] = run(name, model, rank, config, x, y)
        write_result(rank, result)


if __name__ == "__main__":
    sys.exit(worker_main(MODULE, main))
