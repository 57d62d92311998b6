"""One rank of the tensor-parallel FFN, as launched by ``torchrun``.

    torchrun --nproc-per-node=P -m helpers.runs.tp_ffn.worker [tp_demo's flags]
        [--train_step [--activation gelu]] [--dtensor] [--wide H,F,S,B,P,I,W] [--sweep 1,2,P]

Each rank loads only its shard files and computes ``g(shard(f(x)))`` with the f and g
of ``helpers.tensor_parallel.mappings``. It times the forward (compute and all-reduce apart),
proves its full output equal to the native FFN element by element and measures its
memory ledger; then, as asked (``RunOptions``), proves one SGD step through f and g,
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

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace

import torch.distributed as dist

from helpers.core.checks import Proof
from helpers.core.devices import dtype_name, resolve_dtype
from helpers.runs.tp_ffn.config import DemoConfig, RunOptions, parser, sweep_world_sizes
from helpers.runs.tp_ffn.native import info_line, run_native_mode
from helpers.runs.tp_ffn.results import NativeRun, SweepRun, TPRun
from helpers.tensor_parallel.dtensor import prove_parallelize_module
from helpers.tensor_parallel.mappings import ring_allreduce_bytes
from helpers.tensor_parallel.proofs import checksum
from helpers.tensor_parallel.rank_work import (
    native_diff,
    rank_memory,
    timed_forward,
    train_step_check,
    wide_timing,
)
from helpers.tensor_parallel.shards import load_shard
from helpers.torchrun.ranks import (
    Rank,
    exit_worker,
    first_ranks,
    process_group,
    worker_main,
    write_result,
)

MODULE = "helpers.runs.tp_ffn.worker"


def tp_rank_run(
    config: DemoConfig, rank: Rank, options: RunOptions, *, verbose: bool = True
) -> TPRun:
    """This rank's share of the work for ``rank.world_size`` ranks, every collective in
    ``rank.group``; the shards come from ``config.folder(p)``. Returns this rank's result."""
    p, dtype = rank.world_size, resolve_dtype(config.dtype)
    if options.dtensor and rank.group is not None:
        raise ValueError("--dtensor builds its DeviceMesh over the whole world; valid: "
                         "parallelize_module on the whole world only")  # fmt: skip
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
    return TPRun(
        p, rank.backend, str(rank.device), dtype_name(dtype), tuple(out.shape),
        total_sum, abs_sum, Proof("output", diff, tol), compute, reduce, total,
        ring_allreduce_bytes(out.numel() * out.element_size(), p),
        rank_memory(config, rank, shard),
        train_step_check(config, rank, options.activation, options.lr)
        if options.train_step else None,
        prove_parallelize_module(config, rank, shard, x) if options.dtensor else None,
        wide_timing(options.wide, rank, dtype, config.seed) if options.wide else None,
    )  # fmt: skip


def _backend_line(rank: Rank, dtype: str) -> None:
    print(
        f"[INFO] backend: {rank.reason}; {rank.world_size} ranks, each on {rank.device}, "
        f"dtype {dtype}",
        flush=True,
    )


def run_tp_mode(
    config: DemoConfig, options: RunOptions | None = None, *, verbose: bool = True
) -> TPRun:
    """Tensor-parallel mode, one call per rank under ``torchrun``; returns this rank's result."""
    config.validate()
    options = options or RunOptions()
    with process_group(MODULE, device=config.device, backend=config.backend) as rank:
        world = rank.world_size
        if verbose and rank.rank == 0:
            _backend_line(rank, dtype_name(resolve_dtype(config.dtype)))
            if config.world_size != world:
                print(
                    f"[INFO] --world_size {config.world_size} ignored: torchrun started {world} ranks"
                )
        result = tp_rank_run(config, rank, options, verbose=verbose)
        write_result(rank, result.as_dict())
        dist.barrier()
        return result


def run_sweep(
    config: DemoConfig,
    world_sizes: Sequence[int],
    options: RunOptions | None = None,
    *,
    verbose: bool = True,
) -> SweepRun | None:
    """Native on rank 0, then every world size p on the group of ranks 0 .. p-1, in one launch.

    ``options`` apply to every world size, except ``dtensor``: the whole world only. Rank 0
    writes and returns the ``SweepRun``; the other ranks return None.
    """
    sizes = sweep_world_sizes(config, world_sizes)
    options = options or RunOptions()
    with process_group(MODULE, device=config.device, backend=config.backend) as rank:
        world = rank.world_size
        if max(sizes) != world:
            raise ValueError(
                f"--sweep {','.join(map(str, sizes))}: the largest world size must be the "
                f"{world} ranks torchrun started; valid: --nproc-per-node {max(sizes)}"
            )
        places = first_ranks(rank, sizes)  # collective: every rank creates every group
        # torch.optim's first optimizer and parallelize_module import torch._dynamo (seconds
        # of CPU): every rank does it now, together, not each group in turn while others wait
        import torch._dynamo  # noqa: F401

        dist.barrier()  # every rank ready before any clock runs
        start = time.monotonic()  # the work itself, after the start-up
        native = None
        if rank.rank == 0:
            if verbose:
                _backend_line(rank, dtype_name(resolve_dtype(config.dtype)))
            whole = replace(config, world_size=world, mode="native")
            native = NativeRun.from_dict(run_native_mode(whole, verbose=verbose, write=False))
        dist.barrier()  # the other ranks wait while rank 0 runs native
        runs = {}
        for p in sizes:
            member = places[p]
            if member is not None:
                mine = replace(options, dtensor=options.dtensor and p == world)
                runs[p] = tp_rank_run(replace(config, world_size=p), member, mine, verbose=verbose)
            dist.barrier()  # ranks p .. world-1 wait for the group of the first p
        if rank.rank != 0:
            return None
        result = SweepRun(native, runs, time.monotonic() - start)
        write_result(rank, result.as_dict())
        return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(parents=[parser(f"torchrun ... -m {MODULE}")], add_help=False)
    RunOptions.add_arguments(ap).add_argument(
        "--sweep", default=None, help="world sizes, e.g. 1,2,4 (the largest: all the ranks): "
        "each run by the first p ranks of this launch, after native on rank 0",
    )  # fmt: skip
    ns = ap.parse_args(argv)
    try:
        options = RunOptions.from_args(ns)
        sizes = None if ns.sweep is None else [int(v) for v in ns.sweep.split(",")]
    except ValueError as error:
        ap.error(str(error))
    config = DemoConfig.from_args(ns)
    if sizes is not None:
        return worker_main(MODULE, lambda: run_sweep(config, sizes, options))
    return worker_main(MODULE, lambda: run_tp_mode(config, options))


if __name__ == "__main__":
    exit_worker(main())
