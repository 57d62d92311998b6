"""One rank of the tensor-parallel FFN, as launched by ``torchrun``.

    torchrun --nproc-per-node=P -m helpers.runs.tp_ffn.worker --hidden-size 512 ...
        [--train-step [--activation gelu]] [--dtensor] [--wide H,F,S,B,P,I,W] [--sweep 1,2,P]

Each rank loads only its shard files and computes ``g(shard(f(x)))`` with the f and g
of ``helpers.tensor_parallel.mappings``. It times the forward (compute and all-reduce apart),
proves its full output equal to the native FFN element by element, reads from its
sockets the bytes one forward's all-reduce sent (beside gloo's prediction), and measures
its memory ledger; then, as asked (``TPFFNConfig``), proves one SGD step through f and g,
proves ``parallelize_module`` against its hand-made shard, and times a wider FFN. What
each step does is in ``helpers.tensor_parallel.rank_work`` and ``dtensor``.

With ``--sweep 1,2,P`` one launch of P ranks does it for every world size: rank 0 first
runs the native FFN (``tp_demo``'s native mode), then for each p the ranks 0 .. p-1, a
process group of their own, do all of the above for p ranks while the others wait; only
the whole world runs ``parallelize_module``. Each start-up of torchrun and its ranks costs
seconds before any work, and a group inside a larger world is how real jobs give tensor
parallelism its own ranks (a ``DeviceMesh`` dimension is one).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from helpers.comm.wire import WireMeter
from helpers.core.checks import Proof
from helpers.core.devices import dtype_name, resolve_dtype
from helpers.runs.contract import serve
from helpers.runs.tp_ffn.config import TPFFNConfig
from helpers.runs.tp_ffn.native import info_line, run_native
from helpers.runs.tp_ffn.results import SweepRun, TPRun, TrainStep, WideRun
from helpers.runs.tp_ffn.wire import WireCheck, checked, every_rank, predict
from helpers.tensor_parallel.dtensor import prove_parallelize_module
from helpers.tensor_parallel.mappings import f, g, ring_allreduce_bytes
from helpers.tensor_parallel.proofs import checksum
from helpers.tensor_parallel.rank_work import (
    native_diff,
    rank_memory,
    timed_forward,
    train_step_check,
    wide_timing,
)
from helpers.tensor_parallel.shards import load_shard
from helpers.torchrun.ranks import Rank, first_ranks
from helpers.torchrun.status import say


def backend_line(rank: Rank, dtype: str) -> str:
    """``[INFO] backend: ...``: why this backend, how many ranks, on what."""
    return (f"[INFO] backend: {rank.reason}; {rank.world_size} ranks, each on {rank.device}, "
            f"dtype {dtype}")


def forward_wire(shard: nn.Module, x: torch.Tensor, rank: Rank) -> tuple[WireCheck, ...]:
    """Every rank's bytes on its sockets for one forward: g's all-reduce of the partial
    output (f is the identity forward), read in a window of its own, untimed."""
    with torch.no_grad():
        partial = shard(f(x, rank.group))
        size = partial.numel() * partial.element_size()
        payload, headers = predict([("all_reduce", size)], rank.world_size, rank.rank,
                                   partial.element_size())
        dist.barrier(group=rank.group)  # no rank is still busy with earlier collectives
        meter = WireMeter()
        with meter:
            g(partial, rank.group)
    return every_rank(checked(meter, rank.backend, rank.rank, payload, headers), rank.group)


def tp_rank_run(config: TPFFNConfig, rank: Rank, *, dtensor: bool = False,
                verbose: bool = True, progress: Callable[[str], None] | None = None) -> TPRun:
    """This rank's share of the work for ``rank.world_size`` ranks, every collective in
    ``rank.group``; the shards come from ``config.folder(p)``. ``dtensor``: also prove
    ``parallelize_module`` (whose mesh is the whole world); ``progress`` is told each stage
    as it starts. Returns this rank's result."""
    progress = progress or (lambda stage: None)
    p, dtype = rank.world_size, resolve_dtype(config.dtype)
    progress("forward, timed and proven")
    shard = load_shard(config.folder(p), p, rank.rank).to(rank.device, dtype).eval()
    x = config.input_batch(dtype, rank.device)
    out, compute, reduce, total = timed_forward(shard, x, config.iters, config.warmup, rank.group)
    diff, tol = native_diff(config, rank, out)
    total_sum, abs_sum = checksum(out)
    if verbose and rank.rank == 0:
        print(info_line("tp", out, total_sum, total), flush=True)
        print(
            f"[INFO] check: max |tp - native| = {diff:.3g} over all {p} rank(s) and elements, "
            f"tolerance {tol:.3g}: {'OK' if diff <= tol else 'FAILED'}",
            flush=True,
        )
    step = wide = None
    if config.train_step:
        progress("one training step, proven")
        step = TrainStep(config.activation, config.lr,
                         *train_step_check(config, rank, config.activation, config.lr))
    if config.wide_sizes is not None:
        progress("the wide FFN, timed")
        wide = WideRun(config.wide_sizes, *wide_timing(config.wide_sizes, rank, dtype, config.seed))
    progress("memory, bytes on the wire")
    memory, wire = rank_memory(config, rank, shard), forward_wire(shard, x, rank)
    if dtensor:
        progress("parallelize_module, proven")
    return TPRun(
        p, rank.backend, str(rank.device), dtype_name(dtype), tuple(out.shape),
        total_sum, abs_sum, Proof("output", diff, tol), compute, reduce, total,
        ring_allreduce_bytes(out.numel() * out.element_size(), p), memory, wire, step,
        prove_parallelize_module(config, rank, shard, x) if dtensor else None, wide,
    )  # fmt: skip


def sweep(config: TPFFNConfig, rank: Rank) -> SweepRun | None:
    """Native on rank 0, then every world size p on the group of ranks 0 .. p-1, in one launch.

    Every option applies to every world size, except ``dtensor``: the whole world only.
    Rank 0 returns the ``SweepRun``; the other ranks return None.
    """
    world = rank.world_size
    places = first_ranks(rank, config.sweep)  # collective: every rank creates every group
    # torch.optim's first optimizer and parallelize_module import torch._dynamo (seconds
    # of CPU): every rank does it now, together, not each group in turn while others wait
    say(rank, "importing torch._dynamo")
    import torch._dynamo  # noqa: F401

    dist.barrier()  # every rank ready before any clock runs
    start = time.monotonic()  # the work itself, after the start-up
    native = None
    if rank.rank == 0:
        print(backend_line(rank, config.dtype), flush=True)
        say(rank, "native FFN, the others wait")
        native = run_native(config, world, write=False)
    dist.barrier()  # the other ranks wait while rank 0 runs native
    runs = {}
    for k, p in enumerate(config.sweep, 1):
        member = places[p]
        if member is not None:
            runs[p] = tp_rank_run(
                config, member, dtensor=config.dtensor and p == world,
                progress=lambda stage, k=k, p=p: say(
                    rank, f"p={p} ({k}/{len(config.sweep)}): {stage}"))
        dist.barrier()  # ranks p .. world-1 wait for the group of the first p
    if rank.rank != 0:
        return None
    return SweepRun(native, runs, time.monotonic() - start)


def main(config: TPFFNConfig, rank: Rank) -> TPRun | SweepRun | None:
    """A sweep (``config.sweep``), or one run on every rank; rank 0's result."""
    if config.sweep:
        return sweep(config, rank)
    if rank.rank == 0:
        print(backend_line(rank, config.dtype), flush=True)
    result = tp_rank_run(config, rank, dtensor=config.dtensor)
    dist.barrier()
    return result


if __name__ == "__main__":
    serve(TPFFNConfig, main)
