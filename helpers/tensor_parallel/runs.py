"""Lesson 07's launches: the tensor-parallel FFN under ``torchrun`` for several world sizes.

Every run goes through ``helpers.distributed.launcher.launch`` (one process per rank,
one thread each on a CPU), the native baseline included, so all are measured alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from helpers.core.devices import dtype_name, plan_devices
from helpers.core.profiles import get_profile
from helpers.core.timing import Timing, measure
from helpers.distributed.launcher import launch
from helpers.distributed.multinode import launch_nodes
from helpers.tensor_parallel.config import DemoConfig, build_model
from helpers.tensor_parallel.ffn import tp_simulate
from helpers.tensor_parallel.proofs import checksums_match
from helpers.tensor_parallel.shards import load_shard, write_shards

WORLD_SIZES = (1, 2, 4)


def sweep_config(
    world_sizes: Sequence[int] = WORLD_SIZES, profile_name: str | None = None
) -> DemoConfig:
    """The profile's FFN sizes on the device and dtype that the largest world size can use.

    NCCL needs one GPU per rank, so a machine with fewer GPUs than the largest world size
    runs every world size on the CPU with gloo, which keeps the comparison fair.
    """
    plan = plan_devices(max(world_sizes), processes=True)
    return DemoConfig.from_profile(
        get_profile(profile_name), device=plan.device_type, dtype=dtype_name(plan.dtype)
    )


def write_all_shards(config: DemoConfig, world_sizes: Sequence[int]) -> dict[int, str]:
    """Shard files for every world size (same model, same seed); folder per world size."""
    model = build_model(config)
    return {p: str(write_shards(model, p, config.folder(p))) for p in world_sizes}


def launch_native(config: DemoConfig, *, timeout: float = 600) -> dict:
    """The unsplit FFN in one launched process (also checks the one-process simulation)."""
    return launch(
        "helpers.tp_demo", replace(config, mode="native").args(), nproc=1, timeout=timeout
    )


def launch_tp(
    config: DemoConfig,
    world_size: int,
    *,
    train_step: bool = False,
    activation: str = "none",
    timeout: float = 600,
    port: int | None = None,
) -> dict:
    """``world_size`` ranks, each ``g(shard(f(x)))`` on its shard; rank 0's result."""
    args = replace(config, world_size=world_size, mode="tp").args()
    if train_step:
        args += ["--train_step", "--activation", activation]
    return launch(
        "helpers.tensor_parallel.ffn_worker", args, nproc=world_size, timeout=timeout, port=port
    )


def launch_dtensor(config: DemoConfig, world_size: int, *, timeout: float = 600) -> dict:
    """The same FFN through ``parallelize_module`` (Colwise fc1, Rowwise fc2)."""
    args = replace(config, world_size=world_size, mode="tp").args()
    return launch("helpers.tensor_parallel.dtensor_worker", args, nproc=world_size, timeout=timeout)


def launch_mesh(config: DemoConfig, world_size: int, dp: int, *, timeout: float = 600) -> dict:
    """One training step on a (dp x tp) mesh, checked against the full model and batch."""
    args = replace(config, world_size=world_size, mode="tp").args() + ["--dp", str(dp)]
    return launch("helpers.tensor_parallel.mesh_worker", args, nproc=world_size, timeout=timeout)


def launch_on_nodes(
    worker: str,
    config: DemoConfig,
    *,
    nnodes: int,
    nproc_per_node: int,
    extra: Sequence[str] = (),
    rendezvous: str = "static",
    node_ranks: Sequence[int] | None = None,
    join_timeout: int = 30,
    timeout: float = 600,
) -> dict:
    """A worker (``ffn_worker``, ``mesh_worker``) launched as ``nnodes`` torchrun agents here."""
    world = nnodes * nproc_per_node
    args = [*replace(config, world_size=world, mode="tp").args(), *extra]
    return launch_nodes(
        f"helpers.tensor_parallel.{worker}",
        args,
        nnodes=nnodes,
        nproc_per_node=nproc_per_node,
        rendezvous=rendezvous,
        node_ranks=node_ranks,
        join_timeout=join_timeout,
        timeout=timeout,
    )


def time_simulate(config: DemoConfig, world_size: int) -> Timing:
    """tp_simulate (the ranks as a loop in this process, one thread), timed like the runs."""
    dtype = getattr(torch, config.dtype)
    folder = config.folder(world_size)
    shards = [
        load_shard(folder, world_size, r).to(config.device, dtype).eval() for r in range(world_size)
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
    """One row per world size: times, all-reduce share, output agreement, backend."""
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
                "output_max_diff": r["output_max_diff"],
                "output_tolerance": r["output_tolerance"],
                "output_agrees": r["output_agrees"],
                "checksum_agrees": checksums_match(native, r),
            }
        )
    return rows


def tp_sweep(config: DemoConfig, world_sizes: Sequence[int] = WORLD_SIZES) -> dict:
    """Shards, native, tp for each world size, and tp_simulate timings: one run's numbers."""
    write_all_shards(config, world_sizes)
    native = launch_native(replace(config, world_size=max(world_sizes)))
    runs = {p: launch_tp(config, p) for p in world_sizes}
    simulated = {p: time_simulate(config, p) for p in world_sizes}
    return {
        "native": native,
        "runs": runs,
        "simulated": simulated,
        "rows": summarise(native, runs, simulated),
    }
