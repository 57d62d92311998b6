"""One rank of the tensor-parallel FFN, as launched by ``torchrun``.

    torchrun --nproc-per-node=P -m helpers.tensor_parallel.ffn_worker [tp_demo's flags]
        [--train_step [--activation gelu]] [--dtensor] [--wide H,F,S,B,P,I,W]

Each rank loads only its shard files and computes ``g(shard(f(x)))`` with the f and g
of ``helpers.tensor_parallel.comm``. It times the forward (compute and all-reduce apart),
proves its full output equal to the native FFN element by element and measures its
memory ledger; then, as asked (``RunOptions``), proves one SGD step through f and g,
proves ``parallelize_module`` against its hand-made shard, and times a wider FFN. What
each step does is in ``helpers.tensor_parallel.rank_work`` and ``dtensor``; one launch per
world size does all of it.
"""

from __future__ import annotations

import argparse
import sys

import torch.distributed as dist

from helpers.core.checks import Proof
from helpers.core.devices import dtype_name, resolve_dtype
from helpers.distributed.ranks import process_group, worker_main, write_result
from helpers.tensor_parallel.comm import ring_allreduce_bytes
from helpers.tensor_parallel.config import DemoConfig, RunOptions, parser
from helpers.tensor_parallel.dtensor import prove_parallelize_module
from helpers.tensor_parallel.native import info_line
from helpers.tensor_parallel.proofs import checksum
from helpers.tensor_parallel.rank_work import (
    native_diff,
    rank_memory,
    timed_forward,
    train_step_check,
    wide_timing,
)
from helpers.tensor_parallel.results import TPRun
from helpers.tensor_parallel.shards import load_shard

MODULE = "helpers.tensor_parallel.ffn_worker"


def run_tp_mode(
    config: DemoConfig, options: RunOptions | None = None, *, verbose: bool = True
) -> TPRun:
    """Tensor-parallel mode, one call per rank under ``torchrun``; returns this rank's result."""
    config.validate()
    options = options or RunOptions()
    dtype = resolve_dtype(config.dtype)
    with process_group(MODULE, device=config.device, backend=config.backend) as rank:
        world = rank.world_size
        shard = load_shard(config.folder(world), world, rank.rank).to(rank.device, dtype).eval()
        x = config.input_batch(dtype, rank.device)
        if verbose and rank.rank == 0:
            print(
                f"[INFO] backend: {rank.reason}; {world} ranks, each on {rank.device}, dtype {dtype_name(dtype)}"
            )
            if config.world_size != world:
                print(
                    f"[INFO] --world_size {config.world_size} ignored: torchrun started {world} ranks"
                )
        out, compute, reduce, total = timed_forward(shard, x, config.iters, config.warmup)
        diff, tol = native_diff(config, rank, out)
        total_sum, abs_sum = checksum(out)
        if verbose and rank.rank == 0:
            print(info_line("tp", out, total_sum, total), flush=True)
            print(
                f"[INFO] check: max |tp - native| = {diff:.3g} over all ranks and elements, "
                f"tolerance {tol:.3g}: {'OK' if diff <= tol else 'FAILED'}",
                flush=True,
            )
        result = TPRun(
            world, rank.backend, str(rank.device), dtype_name(dtype), tuple(out.shape),
            total_sum, abs_sum, Proof("output", diff, tol), compute, reduce, total,
            ring_allreduce_bytes(out.numel() * out.element_size(), world),
            rank_memory(config, rank, shard),
            train_step_check(config, rank, options.activation, options.lr)
            if options.train_step else None,
            prove_parallelize_module(config, rank, shard, x) if options.dtensor else None,
            wide_timing(options.wide, rank, dtype, config.seed) if options.wide else None,
        )  # fmt: skip
        write_result(rank, result.as_dict())
        dist.barrier()
        return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(parents=[parser(f"torchrun ... -m {MODULE}")], add_help=False)
    ns = RunOptions.add_arguments(ap).parse_args(argv)
    try:
        options = RunOptions.from_args(ns)
    except ValueError as error:
        ap.error(str(error))
    return worker_main(MODULE, lambda: run_tp_mode(DemoConfig.from_args(ns), options))


if __name__ == "__main__":
    sys.exit(main())
