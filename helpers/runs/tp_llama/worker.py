"""One rank of lesson 09: ``torchrun --nproc-per-node=P -m helpers.runs.tp_llama.worker``.

Every rank builds the same small Llama (grouped-query attention, RoPE) from ``--seed``,
takes one SGD step on the whole model in one process (the reference, every rank computes
it), then its tensor-parallel share of the same step (``llama.TPLlama``), without or with
sequence parallelism, and compares: logits, loss, every gradient and every updated weight,
the largest difference over all ranks. It also counts the bytes it sends, measures what
it keeps for backward, and, if asked, proves ``parallelize_module`` equal to the hand split
and times its steps. Rank 0 prints one JSON line (and hands it to the launcher).
"""

from __future__ import annotations

import copy
import json
import time

import torch
import torch.distributed as dist

from helpers.comm.collectives import CommCounter
from helpers.memory.saved import SavedTensorMeter
from helpers.runs.tp_llama.config import WORKER, LlamaTPConfig
from helpers.runs.tp_llama.results import LlamaTPResult, parts_of
from helpers.runs.tp_llama.step import (
    StepState,
    build_llama,
    magnitudes,
    make_batch,
    rank_step,
    reference_step,
    step_diffs,
)
from helpers.runs.tp_llama.timing import CommClock
from helpers.tensor_parallel.llama import TPLlama
from helpers.torchrun.ranks import (
    Rank,
    exit_worker,
    max_over_ranks,
    process_group,
    worker_main,
    write_result,
)


def _kept(model: torch.nn.Module, step) -> tuple[StepState, dict[str, int]]:
    """``step``'s result, and the bytes kept for backward per part (embed, each block,
    norm, head) at the loss."""
    meter, seen = SavedTensorMeter(model, parts_of(model)), {}
    with meter:
        state = step(on_loss=lambda: seen.update(meter.live))
    return state, {name: seen.get(name, 0) for name in parts_of(model)}


def _max_diffs(diffs: dict[str, float], rank: Rank) -> dict[str, float]:
    return {k: max_over_ranks(v, rank) for k, v in diffs.items()}


def mode_section(rank: Rank, config: LlamaTPConfig, model, ids, targets, reference,
                 sp: bool) -> dict:
    """The hand split's step without or with sequence parallelism: its proof, its bytes,
    its activations, and (``--native``) PyTorch's split against it."""
    group, tp, r = dist.group.WORLD, rank.world_size, rank.rank
    shard = TPLlama(model, r, tp).to(rank.device)
    counter = CommCounter(tp)
    with counter:
        state, kept = _kept(shard, lambda on_loss: rank_step(
            shard, ids, targets, group, config.lr, sequence_parallel=sp, on_loss=on_loss))
    out = {"sequence_parallel": sp, "diffs": _max_diffs(step_diffs(model, r, tp, state,
                                                                    reference), rank),
           "sent": dict(counter.sent), "calls": dict(counter.calls), "kept": kept,
           "held": sum(p.numel() for p in shard.parameters())}
    if config.native:
        from torch.distributed.device_mesh import init_device_mesh

        from helpers.tensor_parallel.plans import native_step, parallelize_llama, placements

        mesh = init_device_mesh(rank.device.type, (tp,), mesh_dim_names=("tp",))
        native = parallelize_llama(copy.deepcopy(model), mesh, sequence_parallel=sp)
        out["placements"] = placements(native)
        theirs = native_step(native, ids, targets, config.lr)
        out["native"] = _max_diffs(step_diffs(model, r, tp, state, theirs, local=True), rank)
    return out


def _timed(config: LlamaTPConfig, step, cuda: bool) -> dict[str, list[float]]:
    """``warmup`` untimed steps, then ``time_steps`` steps: each step's seconds and the
    seconds it spent inside collectives (waiting for the other ranks included)."""
    steps, comm = [], []
    for k in range(config.warmup + config.time_steps):
        clock = CommClock(synchronize=cuda)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with clock:
            step()
        if cuda:
            torch.cuda.synchronize()
        if k >= config.warmup:
            steps.append(time.perf_counter() - start)
            comm.append(clock.seconds)
    return {"step_s": steps, "comm_s": comm}


def timing_section(rank: Rank, config: LlamaTPConfig, model, ids, targets) -> dict:
    """Steps timed per sequence-parallel setting (and the one-process model on rank 0)."""
    group, out, cuda = dist.group.WORLD, {}, rank.device.type == "cuda"
    for sp in config.modes:
        shard = TPLlama(model, rank.rank, rank.world_size).to(rank.device)
        dist.barrier()
        out[str(sp)] = _timed(config, lambda s=shard, sp=sp: rank_step(
            s, ids, targets, group, config.lr, sequence_parallel=sp), cuda)
    if config.time_one_process:
        dist.barrier()
        if rank.rank == 0:  # the others wait at the barrier below, idle
            one = copy.deepcopy(model)
            out["one process"] = _timed(config, lambda: reference_step(one, ids, targets,
                                                                       config.lr), cuda)
        dist.barrier()
    return out


def main(argv: list[str] | None = None) -> None:
    config = LlamaTPConfig.from_args(argv)
    with process_group(WORKER, device=config.device) as rank:
        config.validate(rank.world_size)
        model = build_llama(config.lm, config.seed).to(rank.device)
        ids, targets = (t.to(rank.device) for t in make_batch(config.vocab, config.batch,
                                                              config.seq, config.seed))
        one = copy.deepcopy(model)
        reference, one_kept = _kept(one, lambda on_loss: reference_step(
            one, ids, targets, config.lr, on_loss=on_loss))
        data = {"config": config.__dict__, "world_size": rank.world_size,
                "backend": rank.backend, "reason": rank.reason,
                "threads": torch.get_num_threads(),
                "magnitudes": magnitudes(reference), "one_process_kept": one_kept,
                "parameters": sum(p.numel() for p in model.parameters()),
                "modes": [mode_section(rank, config, model, ids, targets, reference, sp)
                          for sp in config.modes]}
        if config.time_steps:
            data["timing"] = timing_section(rank, config, model, ids, targets)
        result = LlamaTPResult.from_dict(data)  # the verdicts, decided where they are named
        data["verdicts"] = result.verdicts()
        if rank.rank == 0:
            print(json.dumps(data), flush=True)
        write_result(rank, data)


if __name__ == "__main__":
    exit_worker(worker_main(WORKER, main))
