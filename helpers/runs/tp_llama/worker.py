"""One rank of lesson 09: ``torchrun --nproc-per-node=P -m helpers.runs.tp_llama.worker``.

Every rank builds the same small Llama (grouped-query attention, RoPE) from ``--seed``,
takes one SGD step on the whole model in one process (the reference, every rank computes
it), then its tensor-parallel share of the same step (``TPLlama``: f and g, the
vocab-parallel loss), without or with sequence parallelism, and compares: logits, loss,
every gradient and every updated weight, the largest difference over all ranks. It also
counts the bytes it sends, measures what it keeps for backward, and, if asked, proves
``parallelize_module`` equal to the hand split and times its steps. Rank 0 prints its
result as one JSON line (and ``serve`` hands it to the launcher).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from helpers.comm.meter import CommMeter
from helpers.memory.saved import SavedTensorMeter
from helpers.runs.contract import serve
from helpers.runs.tp_llama.config import LlamaTPConfig
from helpers.runs.tp_llama.results import LlamaTPResult, ModeRun, StepTimes, merge_head, parts_of
from helpers.runs.tp_llama.step import (
    StepState,
    build_llama,
    magnitudes,
    make_batch,
    reference_step,
    sgd,
    step_diffs,
)
from helpers.tensor_parallel.llama import TPLlama
from helpers.torchrun.ranks import Rank, max_over_ranks


def rank_step(shard: TPLlama, ids: torch.Tensor, targets: torch.Tensor, group, lr: float,
              *, sequence_parallel: bool, on_loss: Callable[[], None] | None = None
              ) -> StepState:
    """This rank's step: its logits' slice, the vocab-parallel loss, its shards' gradients
    (the norms' summed over ranks under sequence parallelism), one SGD step.
    ``on_loss`` runs between the loss and backward (when the most is kept for backward)."""
    logits = shard.logits(ids, group, sequence_parallel=sequence_parallel)
    loss = shard.loss(logits, targets, group)
    if on_loss:
        on_loss()
    loss.backward()
    shard.finish_backward(group, sequence_parallel=sequence_parallel)
    grads = sgd(shard, lr)
    weights = {n: p.detach().clone() for n, p in shard.named_parameters()}
    return StepState(logits.detach(), loss.item(), grads, weights)


def _kept(model: torch.nn.Module, step) -> tuple[StepState, dict[str, int]]:
    """``step``'s result, and the bytes kept for backward per part (embed, each block,
    norm, head) at the loss."""
    meter, seen = SavedTensorMeter(model, parts_of(model)), {}
    with meter:
        state = step(on_loss=lambda: seen.update(meter.live))
    return state, {name: seen.get(name, 0) for name in parts_of(model)}


def _max_diffs(diffs: dict[str, float], rank: Rank) -> dict[str, float]:
    return {k: max_over_ranks(v, rank) for k, v in diffs.items()}


def mode_run(rank: Rank, config: LlamaTPConfig, model, ids, targets, reference: StepState,
             sp: bool) -> ModeRun:
    """The hand split's step without or with sequence parallelism: its proof, its bytes,
    its activations, and (``--native``) PyTorch's split against it."""
    group, tp, r = dist.group.WORLD, rank.world_size, rank.rank
    shard = TPLlama(model, r, tp).to(rank.device)
    counter = CommMeter()
    with counter:
        state, kept = _kept(shard, lambda on_loss: rank_step(
            shard, ids, targets, group, config.lr, sequence_parallel=sp, on_loss=on_loss))
    native = placed = None
    if config.native:
        from torch.distributed.device_mesh import init_device_mesh

        from helpers.runs.tp_llama.step import native_step, placements
        from helpers.tensor_parallel.plans import parallelize_llama

        mesh = init_device_mesh(rank.device.type, (tp,), mesh_dim_names=("tp",))
        parallel = parallelize_llama(copy.deepcopy(model), mesh, sequence_parallel=sp)
        placed = placements(parallel)
        theirs = native_step(parallel, ids, targets, config.lr)
        native = _max_diffs(step_diffs(model, r, tp, state, theirs, local=True), rank)
    return ModeRun.measured(
        config, tp, sp, diffs=_max_diffs(step_diffs(model, r, tp, state, reference), rank),
        scale=magnitudes(reference), native=native, placements=placed,
        sent=dict(counter.per_collective.ring), calls=dict(counter.per_collective.calls),
        kept=kept,
        held=sum(p.numel() for p in shard.parameters()))


def _timed(config: LlamaTPConfig, step, cuda: bool) -> StepTimes:
    """``warmup`` untimed steps, then ``time_steps`` steps: each step's seconds and the
    seconds it spent inside collectives (waiting for the other ranks included)."""
    steps, comm = [], []
    for k in range(config.warmup + config.time_steps):
        clock = CommMeter(timed=True, synchronize=cuda)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with clock:
            step()
        if cuda:
            torch.cuda.synchronize()
        if k >= config.warmup:
            steps.append(time.perf_counter() - start)
            comm.append(clock.total_seconds)
    return StepTimes(steps, comm)


def timing_section(rank: Rank, config: LlamaTPConfig, model, ids, targets
                   ) -> dict[str, StepTimes]:
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


def main(config: LlamaTPConfig, rank: Rank) -> LlamaTPResult:
    """The proofs of every mode, and the timings if asked; rank 0 also prints them."""
    model = build_llama(config.model, config.seed).to(rank.device)
    ids, targets = (t.to(rank.device) for t in make_batch(config.model.vocab, config.batch,
                                                          config.seq, config.seed))
    one = copy.deepcopy(model)
    reference, one_kept = _kept(one, lambda on_loss: reference_step(
        one, ids, targets, config.lr, on_loss=on_loss))
    modes = [mode_run(rank, config, model, ids, targets, reference, sp) for sp in config.modes]
    timing = timing_section(rank, config, model, ids, targets) if config.time_steps else None
    result = LlamaTPResult(config, rank.world_size, rank.backend, rank.reason,
                           sum(p.numel() for p in model.parameters()), merge_head(one_kept),
                           modes, timing, torch.get_num_threads())
    if rank.rank == 0:  # for a terminal: the result and its verdicts, one line
        print(json.dumps({**result.to_dict(), "verdicts": result.verdicts()}), flush=True)
    return result


if __name__ == "__main__":
    serve(LlamaTPConfig, main)
