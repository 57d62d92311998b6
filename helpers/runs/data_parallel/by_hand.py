"""Data parallelism by hand on thread ranks, proven as the launch proves it, and broken.

Every rank is a thread of this process, the threads joined by one gloo group over an
in-memory store (:func:`helpers.torchrun.in_notebook.run_ranks`); it takes its rows of the
lesson's batch (``rows_of``), as the launch's ranks do, from the same weights. The proofs are the
launch's (``step_proofs`` and its tolerances) against one process on the whole batch.

- :func:`hand_ddp_verdict`: backward, then each gradient all-reduced and divided by N,
  then Adam. ``divide=False`` leaves the division out: the ranks sum their gradients.
- :func:`zero1_verdict`: the hand ZeRO-1 of the lesson. ``gather=False`` skips its
  all-gather of the updated slices: rank r updates only slice r of each weight.

The collectives here run after the backward, never inside it, so threads can stand in
for processes (the launch's DDP and ZeRO-2/3 communicate inside the backward). Both
functions compute on one torch thread, as each of the launch's ranks does: on a machine's
few shared cores, more threads per rank only make the ranks wait for each other.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from unittest import mock

import torch
import torch.distributed as dist

from helpers.core.checks import Proof, Verdict, max_abs_diff
from helpers.data_parallel import zero as zero_module
from helpers.data_parallel.fsdp import fsdp_units
from helpers.data_parallel.rank_step import adam, named_copy, rows_of
from helpers.data_parallel.zero import HandZero
from helpers.memory.measure import default_loss
from helpers.models.llama import build_lm
from helpers.runs.data_parallel.config import DataParallelConfig
from helpers.runs.data_parallel.results import PROOF_TOLERANCE, step_proofs, weights_tolerance
from helpers.runs.data_parallel.worker import global_batch, max_diff, reference_step
from helpers.torchrun.in_notebook import run_ranks


@contextlib.contextmanager
def _on_one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _ranks(world_size: int, work) -> list:
    results = run_ranks(world_size, work, timeout=60)
    for outcome in results:
        if isinstance(outcome, BaseException):
            raise outcome
    return results


def _setup(config: DataParallelConfig, world_size: int):
    config.validate(world_size)
    model = build_lm(config.model, seed=0).train()
    ids, labels = global_batch(config, torch.device("cpu"))
    return model, ids, labels, reference_step(model, ids, labels, config.lr)


@_on_one_thread()
def hand_ddp_verdict(config: DataParallelConfig, *, world_size: int = 2,
                     divide: bool = True) -> Verdict:
    """DDP written by hand (all-reduce, then divide by N), proven against one process."""
    model, ids, labels, ref = _setup(config, world_size)

    def work(rank: int, group: object) -> tuple:
        local = copy.deepcopy(model)
        optimizer = adam(local.parameters(), config.lr)
        output = local(rows_of(ids, rank, world_size))
        default_loss(output, rows_of(labels, rank, world_size)).backward()
        for p in local.parameters():
            dist.all_reduce(p.grad, group=group)  # the sum over the ranks
            if divide:
                p.grad /= world_size  # the mean: what one process computes
        grads = named_copy((n, p.grad) for n, p in local.named_parameters())
        optimizer.step()
        return output.detach(), grads, named_copy(local.named_parameters())

    runs = _ranks(world_size, work)
    proofs = step_proofs(
        config.lr,
        output=max(max_abs_diff(out, rows_of(ref.output, r, world_size))
                   for r, (out, _, _) in enumerate(runs)),
        grads=max(max_diff(grads, ref.grads) for _, grads, _ in runs),
        weights=max(max_diff(weights, ref.weights) for _, _, weights in runs))
    claim = "DDP by hand = one process's step" if divide else "DDP without ÷ N = one process's step"
    return Verdict(claim, proofs)


@_on_one_thread()
def zero1_verdict(config: DataParallelConfig, *, world_size: int = 2,
                  gather: bool = True) -> Verdict:
    """The hand ZeRO-1, its gradient slices and every rank's weights against one process."""
    model, ids, labels, ref = _setup(config, world_size)

    def work(rank: int, group: object) -> tuple:
        local = copy.deepcopy(model)
        zero = HandZero(local, fsdp_units(local), 1, lr=config.lr, group=group)
        zero.step(rows_of(ids, rank, world_size), rows_of(labels, rank, world_size),
                  default_loss)
        zero.remove()
        mine = [(n, g.view(-1).chunk(world_size)[rank]) for n, g in ref.grads]
        return max_diff(zero.grad_slices(), mine), max_diff(
            named_copy(local.named_parameters()), ref.weights)  # this rank's own copy

    def skipped(*args: object, **kwargs: object) -> None:
        return None

    with mock.patch.object(zero_module, "all_gather", zero_module.all_gather if gather
                           else skipped):
        runs = _ranks(world_size, work)
    claim = "ZeRO-1 by hand = one process, every rank" if gather else \
        "ZeRO-1 without all-gather = one process"
    return Verdict(claim, [
        Proof("grads", max(g for g, _ in runs), PROOF_TOLERANCE),
        Proof("weights", max(w for _, w in runs), weights_tolerance(config.lr))])
