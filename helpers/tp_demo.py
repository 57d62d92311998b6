"""The source's command line, ``torch_tp_demo.py``, unchanged for its users.

Native mode (one process) times the whole FFN, writes the shard files, then sums the
ranks' partial outputs in one process (``tp_simulate``)::

    python -m helpers.tp_demo --hidden_size 512 --ffn_size 4096 --seq_len 512 \\
        --batch_size 8 --world_size 4 --device cuda

Tensor-parallel mode (under ``torchrun``, ``WORLD_SIZE > 1``): each rank loads its shard
and computes ``g(shard(f(x)))``; g's all-reduce gives every rank the full output::

    torchrun --nproc-per-node=4 -m helpers.tp_demo --hidden_size 512 --ffn_size 4096 \\
        --seq_len 512 --batch_size 8 --world_size 4

The work is done by ``helpers.runs.tp_ffn`` (``native``, and ``worker``'s rank code);
this module only reads the flags and picks the mode. What differs from the source, on
purpose: one seeded input for both modes, a clock that synchronises the GPU, sums in
float64, outputs compared element by element, shard files under results/ with a
checked manifest, and an exit without the interpreter's teardown (``run_worker``).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch.distributed as dist

from helpers.core.devices import resolve_device
from helpers.core.errors import TutorialError
from helpers.core.files import atomic_write_json
from helpers.runs.contract import Record, run_worker
from helpers.runs.tp_ffn.config import TPFFNConfig
from helpers.runs.tp_ffn.native import run_native
from helpers.runs.tp_ffn.results import TPRun
from helpers.runs.tp_ffn.worker import backend_line, tp_rank_run
from helpers.torchrun.ranks import RESULT_ENV, process_group, write_result

MODULE = "tp_demo"
MODES = ("auto", "native", "tp")


def parser(prog: str = "python -m helpers.tp_demo") -> argparse.ArgumentParser:
    """The source's flags and defaults, plus the options this version adds."""
    d = TPFFNConfig()
    ap = argparse.ArgumentParser(prog=prog, description="The tensor-parallel FFN demo.")
    ap.add_argument("--hidden_size", default=d.hidden_size, type=int, help="model width")
    ap.add_argument("--ffn_size", default=d.ffn_size, type=int, help="FFN inner width")
    ap.add_argument("--seq_len", default=d.seq_len, type=int, help="tokens per sequence")
    ap.add_argument("--batch_size", default=d.batch_size, type=int, help="sequences per batch")
    ap.add_argument("--world_size", default=4, type=int, help="ranks the shards are cut for")
    ap.add_argument("--device", default=d.device, type=str, help="cpu, cuda or cuda:N")
    ap.add_argument("--dtype", default=d.dtype, help="float16 (the source's), float32 or bfloat16")
    ap.add_argument(
        "--shard_dir",
        default=None,
        help="folder of the shard files (default: results/tp_shards/hidden{H}_ffn{F}_world{P})",
    )
    ap.add_argument("--iters", default=d.iters, type=int, help="iterations, warm-up included")
    ap.add_argument("--warmup", default=d.warmup, type=int, help="first iterations, not timed")
    ap.add_argument("--seed", default=d.seed, type=int, help="seed of the model and the input")
    ap.add_argument(
        "--mode", default="auto", help="auto (tp under torchrun with WORLD_SIZE > 1), native, tp"
    )
    ap.add_argument("--backend", default=d.backend, help="auto, gloo or nccl (tp mode)")
    ap.add_argument("--json", default=None, help="also write the result as JSON to this file")
    return ap


def config_of(ns: argparse.Namespace) -> TPFFNConfig:
    """The run the flags ask for (``--world_size``, ``--mode`` and ``--json`` are this
    module's: the ranks come from torchrun)."""
    names = ("hidden_size", "ffn_size", "seq_len", "batch_size", "device", "dtype",
             "shard_dir", "iters", "warmup", "seed", "backend")
    return TPFFNConfig(**{name: getattr(ns, name) for name in names})


def run_tp(config: TPFFNConfig, world_size: int) -> TPRun:
    """Tensor-parallel mode, one call per rank under ``torchrun``; this rank's result."""
    with process_group(TPFFNConfig.WORKER, device=config.device, backend=config.backend) as rank:
        config.validate(rank.world_size)
        world = rank.world_size
        if rank.rank == 0:
            print(backend_line(rank, config.dtype), flush=True)
            if world_size != world:
                print(f"[INFO] --world_size {world_size} ignored: torchrun started {world} ranks")
        result = tp_rank_run(config, rank)
        write_result(rank, result.to_dict())
        dist.barrier()
        return result


def main(argv: list[str] | None = None) -> int:
    """Parse the options, pick the mode, run it; errors end with one clear line."""
    ap = parser()
    ns = ap.parse_args(argv)
    config = config_of(ns)
    try:
        config.validate(ns.world_size)
        resolve_device(config.device)
        if ns.mode not in MODES:
            raise ValueError(f"--mode {ns.mode!r}; valid choices: {', '.join(MODES)}")
    except ValueError as error:
        ap.error(str(error))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mode = ns.mode if ns.mode != "auto" else ("tp" if world > 1 else "native")
    if mode == "native" and world > 1:
        ap.error(
            f"native mode runs in one process, but WORLD_SIZE={world}; valid: --mode tp or auto"
        )
    first = int(os.environ.get("RANK", "0")) == 0
    if first:
        print(ns, flush=True)
    try:
        result: Record = (run_native(config, ns.world_size) if mode == "native"
                          else run_tp(config, ns.world_size))
    except (TutorialError, ValueError) as error:
        print(f"{MODULE}: error: {error}", file=sys.stderr, flush=True)
        return 1
    if first:
        paths = (ns.json, os.environ.get(RESULT_ENV) if mode == "native" else None)
        for path in paths:
            if path:
                atomic_write_json(path, result.to_dict())
    return 0


def command_line() -> int:
    """``main`` on ``sys.argv``; argparse's own exits (``--help``, a bad flag) become codes,
    so that every way out is ``run_worker``'s."""
    try:
        return main()
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1


if __name__ == "__main__":
    run_worker(MODULE, command_line)
