"""One rank of lesson 09: ``torchrun --nproc-per-node=P -m helpers.runs.tp_llama.worker``.

Every rank builds the same small Llama (grouped-query attention, RoPE) from ``--seed``,
takes one SGD step on the whole model in one process (the reference, every rank computes
it), then its tensor-parallel share of the same step (``TPLlama``: f and g, the
vocab-parallel loss), without or with sequence parallelism, and compares: logits, loss,
every gradient and every updated weight, the largest difference over all ranks. It also
counts the collectives it issues and reads the bytes its sockets sent, measures what it
keeps for backward, and, if asked, proves ``parallelize_module`` equal to the hand split
(measuring what that keeps too) and times its steps. Rank 0 prints its
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
from helpers.runs.tp_ffn.wire import checked, every_rank, predict
from helpers.runs.tp_llama.config import LlamaTPConfig
from helpers.runs.tp_llama.results import (
    RELATIVE_TOLERANCE,
    LlamaTPResult,
    ModeRun,
    Sharpness,
    StepTimes,
    merge_head,
    parts_of,
    planned_calls,
    proofs,
    weight_tolerances,
)
from helpers.runs.tp_llama.step import (
    LocalSavedMeter,
    StepState,
    build_llama,
    magnitudes,
    make_batch,
    reference_step,
    sgd,
    step_diffs,
    updates,
    weight_diffs,
)
from helpers.tensor_parallel.llama import TPLlama
from helpers.torchrun.ranks import Rank
from helpers.torchrun.status import say


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


def _kept(model: torch.nn.Module, step, meter_type=SavedTensorMeter
          ) -> tuple[StepState, dict[str, int]]:
    """``step``'s result, and the bytes kept for backward per part (embed, each block,
    norm, head) at the loss."""
    meter, seen = meter_type(model, parts_of(model)), {}
    with meter:
        state = step(on_loss=lambda: seen.update(meter.live))
    return state, {name: seen.get(name, 0) for name in parts_of(model)}


def _max_each(values: dict[str, float], rank: Rank) -> dict[str, float]:
    """Each value's maximum over the ranks (one all-reduce)."""
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=rank.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=rank.group)
    return dict(zip(values, t.tolist(), strict=True))


def _proven(model, rank: Rank, mine: StepState, other: StepState, scale: dict[str, float],
            tolerances: dict[str, float], *, local: bool = False) -> list:
    """The proofs of this step against ``other``, the largest differences over all ranks."""
    tp, r = rank.world_size, rank.rank
    diffs = _max_each(step_diffs(model, r, tp, mine, other, local=local), rank)
    weights = _max_each(weight_diffs(model, r, tp, mine, other, local=local), rank)
    return proofs(diffs, scale, weights, tolerances)


def _native(rank: Rank, config: LlamaTPConfig, model, ids, targets, sp: bool):
    """PyTorch's split of the same step: (its state, placements, what it kept per part)."""
    from torch.distributed.device_mesh import init_device_mesh

    from helpers.runs.tp_llama.step import native_step, placements
    from helpers.tensor_parallel.plans import parallelize_llama

    mesh = init_device_mesh(rank.device.type, (rank.world_size,), mesh_dim_names=("tp",))
    parallel = parallelize_llama(copy.deepcopy(model), mesh, sequence_parallel=sp)
    theirs, kept = _kept(parallel, lambda on_loss: native_step(
        parallel, ids, targets, config.lr, on_loss=on_loss), LocalSavedMeter)
    return theirs, placements(parallel), merge_head(kept)


def mode_run(rank: Rank, config: LlamaTPConfig, model, ids, targets, reference: StepState,
             sp: bool) -> ModeRun:
    """The hand split's step without or with sequence parallelism: its proof, its calls and
    bytes, its activations, and (``--native``) PyTorch's split against it."""
    group, tp, r = dist.group.WORLD, rank.world_size, rank.rank
    say(rank, f"{_mode(sp)}: one step, proven")
    shard = TPLlama(model, r, tp).to(rank.device)
    scale = magnitudes(reference)
    tolerances = weight_tolerances(reference.grads, reference.weights, config.lr,
                                   RELATIVE_TOLERANCE * scale["gradients"])
    dist.barrier()  # the window below holds this step's collectives only
    counter = CommMeter()
    with counter:
        state, kept = _kept(shard, lambda on_loss: rank_step(
            shard, ids, targets, group, config.lr, sequence_parallel=sp, on_loss=on_loss))
    calls = [(c, s) for c, sizes in planned_calls(config, sp).items() for s in sizes]
    wire = every_rank(checked(counter.wire, rank.backend, r, *predict(calls, tp, r)))
    native = placed = native_kept = None
    if config.native:
        say(rank, f"{_mode(sp)}: parallelize_module")
        theirs, placed, native_kept = _native(rank, config, model, ids, targets, sp)
        native = _proven(model, rank, state, theirs, scale, tolerances, local=True)
    return ModeRun.measured(
        config, tp, sp, proven=_proven(model, rank, state, reference, scale, tolerances),
        native=native, placements=placed, calls=dict(counter.per_collective.calls),
        ring=dict(counter.per_collective.ring), gloo=dict(counter.per_collective.gloo),
        wire=list(wire), kept=kept, held=sum(p.numel() for p in shard.parameters()),
        native_kept=native_kept)


def _mode(sp: bool) -> str:
    return "TP + SP" if sp else "TP"


def _timed(config: LlamaTPConfig, step, cuda: bool, progress=None) -> StepTimes:
    """``warmup`` untimed steps, then ``time_steps`` steps: each step's seconds and the
    seconds it spent inside collectives (waiting for the other ranks included). The clock
    starts inside the meter's ``with``: its entry and exit (which also read the sockets'
    counters) are not in the step's time. ``progress`` is told each step's number first."""
    steps, comm, total = [], [], config.warmup + config.time_steps
    for k in range(total):
        if progress:
            progress(f"step {k + 1} of {total}")
        clock = CommMeter(timed=True, synchronize=cuda)
        with clock:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        if k >= config.warmup:
            steps.append(seconds)
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
            s, ids, targets, group, config.lr, sequence_parallel=sp), cuda,
            lambda step, sp=sp: say(rank, f"timing {_mode(sp)}: {step}"))
    if config.time_one_process:
        dist.barrier()
        if rank.rank == 0:  # the others wait at the barrier below, idle
            one = copy.deepcopy(model)
            out["one process"] = _timed(
                config, lambda: reference_step(one, ids, targets, config.lr), cuda,
                lambda step: say(rank, f"timing one process: {step}"))
        dist.barrier()
    return out


def main(config: LlamaTPConfig, rank: Rank) -> LlamaTPResult:
    """The proofs of every mode, and the timings if asked; rank 0 also prints them."""
    model = build_llama(config.model, config.seed).to(rank.device)
    ids, targets = (t.to(rank.device) for t in make_batch(config.model.vocab, config.batch,
                                                          config.seq, config.seed))
    one = copy.deepcopy(model)
    say(rank, "the one-process reference step")
    reference, one_kept = _kept(one, lambda on_loss: reference_step(
        one, ids, targets, config.lr, on_loss=on_loss))
    modes = [mode_run(rank, config, model, ids, targets, reference, sp) for sp in config.modes]
    timing = timing_section(rank, config, model, ids, targets) if config.time_steps else None
    scale = magnitudes(reference)
    tolerances = weight_tolerances(reference.grads, reference.weights, config.lr,
                                   RELATIVE_TOLERANCE * scale["gradients"])
    result = LlamaTPResult(config, rank.world_size, rank.backend, rank.reason,
                           sum(p.numel() for p in model.parameters()), merge_head(one_kept),
                           modes, timing, torch.get_num_threads(),
                           Sharpness.of(updates(model, reference), tolerances))
    if rank.rank == 0:  # for a terminal: the result and its verdicts, one line
        print(json.dumps({**result.to_dict(), "verdicts": result.verdicts()}), flush=True)
    return result


if __name__ == "__main__":
    serve(LlamaTPConfig, main)
