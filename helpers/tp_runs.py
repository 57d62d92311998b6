"""Lesson 06: the tensor-parallel FFN launched with ``torchrun`` for several world sizes.

Every run goes through ``helpers.launch.launch`` (one process per rank, one thread each on
a CPU), including the native baseline (one process), so all are measured alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from helpers.distributed import choose_backend
from helpers.launch import launch
from helpers.profiles import get_profile
from helpers.timing import Timing, measure
from helpers.tp_demo import DemoConfig, build_model
from helpers.tp_ffn import checksums_match, resolve_dtype, tp_simulate
from helpers.tp_shards import write_shards

WORLD_SIZES = (1, 2, 4)


def plan_device(world_sizes: Sequence[int]) -> tuple[str, str, str]:
    """(device, dtype, reason) for the whole sweep: GPUs only with one GPU per rank.

    NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so a machine with fewer
    GPUs than the largest world size runs every world size on the CPU with gloo, which
    keeps the comparison between world sizes fair. CPUs have no fast float16 matrix
    products, so the CPU runs use float32.
    """
    backend, reason = choose_backend(max(world_sizes))
    if backend == "nccl":
        return "cuda", "float16", reason
    return "cpu", "float32", reason


def lesson_config(
    world_sizes: Sequence[int] = WORLD_SIZES, profile_name: str | None = None
) -> DemoConfig:
    """The profile's FFN sizes on the device the sweep can use."""
    device, dtype, _ = plan_device(world_sizes)
    return DemoConfig.from_profile(get_profile(profile_name), device=device, dtype=dtype)


def write_all_shards(config: DemoConfig, world_sizes: Sequence[int]) -> dict[int, str]:
    """Shard files for every world size (same model, same seed); folder per world size."""
    model = build_model(config)
    return {p: str(write_shards(model, p, config.folder(p))) for p in world_sizes}


def run_native(config: DemoConfig, *, timeout: float = 600) -> dict:
    """The unsplit FFN in one launched process (also checks the one-process simulation)."""
    return launch(
        "helpers.tp_demo", replace(config, mode="native").args(), nproc=1, timeout=timeout
    )


def run_tp(
    config: DemoConfig, world_size: int, *, timeout: float = 600, port: int | None = None
) -> dict:
    """``world_size`` ranks, each with its shard; all-reduce(SUM); rank 0's result."""
    args = replace(config, world_size=world_size, mode="tp").args()
    return launch("helpers.tp_demo", args, nproc=world_size, timeout=timeout, port=port)


def run_dtensor(config: DemoConfig, world_size: int, *, timeout: float = 600) -> dict:
    """The same FFN through ``parallelize_module`` (Colwise fc1, Rowwise fc2)."""
    args = replace(config, world_size=world_size, mode="tp").args()
    return launch("helpers.tp_dtensor", args, nproc=world_size, timeout=timeout)


def run_2d(config: DemoConfig, world_size: int, dp: int, *, timeout: float = 600) -> dict:
    """One training step on a (dp x tp) mesh, checked against the full model and batch."""
    args = replace(config, world_size=world_size, mode="tp").args() + ["--dp", str(dp)]
    return launch("helpers.tp_2d", args, nproc=world_size, timeout=timeout)


def time_simulate(config: DemoConfig, world_size: int) -> Timing:
    """tp_simulate (the ranks as a loop in this process, one thread), timed like the runs."""
    dtype = resolve_dtype(config.dtype)
    shards = [
        config.load_shard(world_size, r).to(config.device, dtype).eval() for r in range(world_size)
    ]
    x = config.input_batch(dtype, config.device)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.inference_mode():
            return measure(
                lambda: tp_simulate(shards, x),
                repeats=config.iters - config.warmup,
                warmup=config.warmup,
                label=f"tp_simulate p={world_size}",
            )
    finally:
        torch.set_num_threads(threads)


def summarise(native: dict, runs: dict[int, dict], simulated: dict[int, Timing]) -> list[dict]:
    """One row per world size: times, all-reduce share, checksum agreement, backend."""
    rows = []
    for p, r in runs.items():
        compute = Timing("compute", r["compute_times_s"])
        allreduce = Timing("all-reduce", r["allreduce_times_s"])
        rows.append(
            {
                "world_size": p,
                "backend": r["backend"],
                "native_s": native["mean_s"],
                "native_std_s": native["std_s"],
                "tp_simulate_s": simulated[p].mean,
                "tp_simulate_std_s": simulated[p].std,
                "tp_s": r["mean_s"],
                "tp_std_s": r["std_s"],
                "compute_s": compute.mean,
                "allreduce_s": allreduce.mean,
                "allreduce_bytes_per_rank": r["allreduce_bytes_per_rank"],
                "checksum_diff": abs(r["checksum"] - native["checksum"]),
                "checksum_tolerance": native["checksum_tolerance"],
                "checksum_agrees": checksums_match(native, r),
            }
        )
    return rows


def tp_sweep(config: DemoConfig, world_sizes: Sequence[int] = WORLD_SIZES) -> dict:
    """Shards, native, tp for each world size, and tp_simulate timings: one run's numbers."""
    write_all_shards(config, world_sizes)
    native = run_native(replace(config, world_size=max(world_sizes)))
    runs = {p: run_tp(config, p) for p in world_sizes}
    simulated = {p: time_simulate(config, p) for p in world_sizes}
    return {
        "native": native,
        "runs": runs,
        "simulated": simulated,
        "rows": summarise(native, runs, simulated),
    }


def tp_section() -> dict:
    """The ``tp`` section of bench.json: the source's sizes (full profile)."""
    config = lesson_config(WORLD_SIZES, "full")
    sweep = tp_sweep(config, WORLD_SIZES)
    return {
        "sizes": {
            k: getattr(config, k) for k in ("hidden_size", "ffn_size", "seq_len", "batch_size")
        },
        "device": config.device,
        "dtype": config.dtype,
        "iters": config.iters,
        "warmup": config.warmup,
        "threads_per_rank": 1,
        "per_world_size": sweep["rows"],
    }
