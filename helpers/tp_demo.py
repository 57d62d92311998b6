"""The source's command line: a native FFN, its shard files, and the tensor-parallel run.

Native mode (one process) times the whole FFN, writes the shard files, then sums the
ranks' partial outputs in one process (``tp_simulate``)::

    python -m helpers.tp_demo --hidden_size 512 --ffn_size 4096 --seq_len 512 \\
        --batch_size 8 --world_size 4 --device cuda

Tensor-parallel mode (under ``torchrun``, ``WORLD_SIZE > 1``): each rank loads its shard,
computes its partial output, and ``all_reduce(SUM)`` gives every rank the full output::

    torchrun --nproc_per_node=4 -m helpers.tp_demo --hidden_size 512 --ffn_size 4096 \\
        --seq_len 512 --batch_size 8 --world_size 4

The backend is NCCL with one GPU per rank, else gloo on the CPU. Both modes print the
source's ``[INFO]`` lines and can hand a JSON result back (``--json PATH``, or rank 0
through ``helpers.distributed.write_result`` when started by ``helpers.launch.launch``).

What differs from the source, on purpose: the input comes from its own generator seeded
with ``--seed``, so both modes see the same input; times come from a clock that
synchronises the GPU (and no ``torch.cuda.synchronize`` on the CPU); sums are added in
float64; shard files go to ``--shard_dir`` (default under results/), with a manifest
that is checked before loading.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import torch.distributed as dist

from helpers.distributed import (
    BACKEND_CHOICES,
    RESULT_ENV,
    choose_backend,
    process_group,
    write_result,
)
from helpers.files import atomic_write_json
from helpers.paths import results_path, shown
from helpers.profiles import Profile
from helpers.timing import measure, synchronized_clock
from helpers.tp_ffn import (
    FeedForward,
    FeedForwardShard,
    check_split,
    checksum,
    checksum_tolerance,
    dtype_name,
    make_input,
    resolve_device,
    resolve_dtype,
    tp_simulate,
)
from helpers.tp_shards import ShardError, write_shards

MODES = ("auto", "native", "tp")


@dataclass(frozen=True)
class DemoConfig:
    """The command line's options; the defaults are the source's."""

    hidden_size: int = 512
    ffn_size: int = 1024
    seq_len: int = 512
    batch_size: int = 8
    world_size: int = 4
    device: str = "cuda"
    dtype: str = "float16"
    shard_dir: str | None = None
    iters: int = 32
    warmup: int = 4
    seed: int = 1
    mode: str = "auto"
    backend: str = "auto"

    @classmethod
    def from_profile(cls, profile: Profile, **overrides) -> DemoConfig:
        """The profile's FFN sizes (``hidden_size``, ``ffn_size``, ...), then ``overrides``."""
        sizes = {
            "hidden_size": profile.hidden_size,
            "ffn_size": profile.ffn_size,
            "seq_len": profile.seq_len,
            "batch_size": profile.ffn_batch,
            "world_size": profile.world_size,
            "iters": profile.ffn_iters,
            "warmup": profile.ffn_warmup,
        }
        return cls(**{**sizes, **overrides})

    def validate(self) -> None:
        """Raise ValueError naming the first bad option and what would be valid."""
        for name in ("hidden_size", "seq_len", "batch_size"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"--{name} {value}; valid: an integer >= 1")
        check_split(self.ffn_size, self.world_size)
        resolve_dtype(self.dtype)
        if self.mode not in MODES:
            raise ValueError(f"--mode {self.mode!r}; valid choices: {', '.join(MODES)}")
        if self.backend not in BACKEND_CHOICES:
            raise ValueError(
                f"--backend {self.backend!r}; valid choices: {', '.join(BACKEND_CHOICES)}"
            )
        if self.warmup < 0 or self.iters <= self.warmup:
            raise ValueError(
                f"--iters {self.iters} --warmup {self.warmup}; valid: 0 <= warmup < iters "
                "(the first `warmup` iterations are not timed)"
            )

    def folder(self, world_size: int | None = None) -> Path:
        """Where the shard files for ``world_size`` ranks are written and read."""
        if self.shard_dir is not None:
            return Path(self.shard_dir)
        p = self.world_size if world_size is None else world_size
        return results_path(
            f"tp_shards/hidden{self.hidden_size}_ffn{self.ffn_size}_world{p}/x"
        ).parent

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> DemoConfig:
        """The ``parser()`` options found in ``ns``; a worker's own extra flags are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names})

    def rank_backend(self, world_size: int) -> tuple[str, str]:
        """(backend, reason) for ``world_size`` ranks: gloo on the CPU, else ``choose_backend``."""
        if resolve_device(self.device).type != "cpu":
            return choose_backend(world_size, self.backend)
        if self.backend == "nccl":
            raise ValueError(
                "--backend nccl needs --device cuda (one GPU per rank); valid with cpu: gloo or auto"
            )
        return "gloo", "gloo on the CPU (--device cpu; NCCL needs one GPU per rank)"

    def input_batch(self, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """The input (batch, seq, hidden), the same in every mode and on every rank."""
        return make_input(
            self.batch_size,
            self.seq_len,
            self.hidden_size,
            dtype=dtype,
            device=device,
            seed=self.seed,
        )

    def load_shard(self, world_size: int, rank: int) -> FeedForwardShard:
        """Rank ``rank``'s shard from the files for ``world_size`` ranks, checked first."""
        return FeedForwardShard.from_files(
            self.folder(world_size),
            world_size,
            rank,
            hidden_size=self.hidden_size,
            ffn_size=self.ffn_size,
        )

    def args(self) -> list[str]:
        """These options as command-line arguments (for ``helpers.launch.launch``)."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value != f.default:
                out += [f"--{f.name}", str(value)]
        return out


def _stats(times: list[float]) -> dict:
    return {
        "times_s": times,
        "mean_s": statistics.fmean(times),
        "std_s": statistics.stdev(times) if len(times) > 1 else 0.0,
        "min_s": min(times),
        "max_s": max(times),
    }


def _info(tag: str, out: torch.Tensor, total: float, times: dict | None = None) -> str:
    """The source's line: ``[INFO] tag: shape:...,sum:...[,mean:...,min:...,max:...]``."""
    line = f"[INFO] {tag}: shape:{out.shape},sum:{total:.5f}"
    if times:
        line += f",mean:{times['mean_s']:.5f},min:{times['min_s']:.5f},max:{times['max_s']:.5f}"
    return line


def _hand_back(result: dict, json_path: str | None) -> None:
    """Write the JSON result to ``--json`` and/or the launcher's result file."""
    for path in (json_path, os.environ.get(RESULT_ENV)):
        if path:
            atomic_write_json(path, result)


def build_model(config: DemoConfig) -> FeedForward:
    """The source's model: ``torch.manual_seed(seed)``, then the FFN in float32 on the CPU."""
    torch.manual_seed(config.seed)
    return FeedForward(config.hidden_size, config.ffn_size)


def run_native(config: DemoConfig, *, verbose: bool = True) -> dict:
    """Native mode: time the FFN, write the shards, check the one-process simulation."""
    config.validate()
    device, dtype = resolve_device(config.device), resolve_dtype(config.dtype)
    p, folder = config.world_size, config.folder()
    model = build_model(config)  # float32 on the CPU: the shard bytes do not depend on --device
    write_shards(model, p, folder)
    x = config.input_batch(dtype, device)
    model = model.to(device, dtype).eval()
    with torch.inference_mode():
        timing = measure(
            lambda: model(x), repeats=config.iters - config.warmup, warmup=config.warmup
        )
        out = model(x)
        total, abs_total = checksum(out)
        times = _stats(timing.times)
        if verbose:
            print(f"[INFO] device: {device}, dtype: {dtype_name(dtype)}, input seed {config.seed}")
            print(_info("native", out, total, times), flush=True)
        shards = [config.load_shard(p, r).to(device, dtype) for r in range(p)]
        simulated = tp_simulate(shards, x)
    sim_total, _ = checksum(simulated)
    tol = checksum_tolerance(abs_total, dtype)
    agree = abs(sim_total - total) <= tol
    if verbose:
        print(f"[INFO] shards: {p} rank(s), fc1_*.bin fc2_*.bin manifest.json in {shown(folder)}")
        print(_info("tp_simulate", simulated, sim_total))
        print(
            f"[INFO] check: |tp_simulate sum - native sum| = {abs(sim_total - total):.5f}, "
            f"{dtype_name(dtype)} tolerance {tol:.5f}: {'OK' if agree else 'FAILED'}",
            flush=True,
        )
    return {
        "mode": "native",
        "config": asdict(config),
        "world_size": p,
        "backend": None,
        "device": str(device),
        "dtype": dtype_name(dtype),
        "shape": list(out.shape),
        "checksum": total,
        "abs_sum": abs_total,
        "checksum_tolerance": tol,
        "tp_simulate_checksum": sim_total,
        "tp_simulate_agrees": agree,
        "shard_dir": shown(folder),
        "threads": torch.get_num_threads(),
        **times,
    }


def run_tp(config: DemoConfig, *, verbose: bool = True) -> dict:
    """Tensor-parallel mode, one call per rank under ``torchrun``; returns this rank's result.

    Each iteration starts after a barrier. The clock (which synchronises the GPU) is read
    before the partial output, between it and the all-reduce, and after: ``times_s`` are
    whole steps, ``compute_times_s`` and ``allreduce_times_s`` their two parts, all
    measured on rank 0 and handed to the launcher by rank 0.
    """
    if "WORLD_SIZE" not in os.environ:
        raise ValueError(
            "tensor-parallel mode runs under torchrun, e.g. "
            "`torchrun --nproc_per_node=4 -m helpers.tp_demo --device cpu`; "
            "without it, use --mode native"
        )
    config.validate()
    dtype = resolve_dtype(config.dtype)
    world = int(os.environ["WORLD_SIZE"])
    backend, reason = config.rank_backend(world)
    with process_group(backend) as rank:
        folder = config.folder(world)
        shard = config.load_shard(world, rank.rank).to(rank.device, dtype)
        shard.eval()
        x = config.input_batch(dtype, rank.device)
        if verbose and rank.rank == 0:
            print(
                f"[INFO] backend: {reason}; {world} ranks, each on {rank.device}, dtype {dtype_name(dtype)}"
            )
            if config.world_size != world:
                print(
                    f"[INFO] --world_size {config.world_size} ignored: torchrun started {world} ranks"
                )
        compute, reduce, total_times = [], [], []
        with torch.no_grad():
            for i in range(config.iters):
                dist.barrier()
                t0 = synchronized_clock()
                out = shard(x)  # this rank's partial output
                t1 = synchronized_clock()
                dist.all_reduce(out, op=dist.ReduceOp.SUM)  # Megatron's g: the sum over ranks
                t2 = synchronized_clock()
                if i >= config.warmup:
                    compute.append(t1 - t0)
                    reduce.append(t2 - t1)
                    total_times.append(t2 - t0)
        total, abs_total = checksum(out)
        times = _stats(total_times)
        if verbose and rank.rank == 0:
            print(_info("tp", out, total, times), flush=True)
        ring = 2 * (world - 1) / world * out.numel() * out.element_size()
        result = {
            "mode": "tp",
            "config": asdict(config),
            "world_size": world,
            "backend": backend,
            "backend_reason": reason,
            "device": str(rank.device),
            "dtype": dtype_name(dtype),
            "shape": list(out.shape),
            "checksum": total,
            "abs_sum": abs_total,
            "checksum_tolerance": checksum_tolerance(abs_total, dtype),
            "shard_dir": shown(folder),
            "threads": torch.get_num_threads(),
            "compute_times_s": compute,
            "allreduce_times_s": reduce,
            "allreduce_bytes_per_rank": ring,
            **times,
        }
        write_result(rank, result)
        dist.barrier()
        return result


def parser() -> argparse.ArgumentParser:
    """The source's flags and defaults, plus the options this version adds."""
    d = DemoConfig()
    ap = argparse.ArgumentParser(
        prog="python -m helpers.tp_demo", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--hidden_size", default=d.hidden_size, type=int, help="model width")
    ap.add_argument("--ffn_size", default=d.ffn_size, type=int, help="FFN inner width")
    ap.add_argument("--seq_len", default=d.seq_len, type=int, help="tokens per sequence")
    ap.add_argument("--batch_size", default=d.batch_size, type=int, help="sequences per batch")
    ap.add_argument(
        "--world_size", default=d.world_size, type=int, help="ranks the shards are cut for"
    )
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
        "--mode", default=d.mode, help="auto (tp under torchrun with WORLD_SIZE > 1), native, tp"
    )
    ap.add_argument("--backend", default=d.backend, help="auto, gloo or nccl (tp mode)")
    ap.add_argument("--json", default=None, help="also write the result as JSON to this file")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Parse the options, pick the mode, run it; errors end with one clear line."""
    ap = parser()
    ns = ap.parse_args(argv)
    json_path = ns.json
    config = DemoConfig.from_args(ns)
    try:
        config.validate()
        resolve_device(config.device)
    except ValueError as error:
        ap.error(str(error))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mode = config.mode if config.mode != "auto" else ("tp" if world > 1 else "native")
    if mode == "native" and world > 1:
        ap.error(
            f"native mode runs in one process, but WORLD_SIZE={world}; valid: --mode tp or auto"
        )
    first = int(os.environ.get("RANK", "0")) == 0
    if first:
        print(ns, flush=True)
    try:
        if mode == "native":
            result = run_native(replace(config, mode="native"))
        else:
            result = run_tp(replace(config, mode="tp"))
    except (ShardError, ValueError) as error:
        print(f"tp_demo: error: {error}", file=sys.stderr, flush=True)
        return 1
    if first:
        if mode == "native":
            _hand_back(result, json_path)
        elif json_path:
            atomic_write_json(json_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
