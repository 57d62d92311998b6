"""Lesson 08's launches: the tensor-parallel FFN under ``torchrun`` for several world sizes.

Every run goes through ``helpers.torchrun.launcher.launch`` (one process per rank,
one thread each on a CPU), the native baseline included, so all are measured alike.
``launch_sweep`` does the lesson's in one launch of max(p) ranks: native on rank 0,
then each world size p on the group of ranks 0 .. p-1; ``launch_native`` and
``launch_tp`` launch one of them alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from helpers.core.devices import dtype_name, plan_devices
from helpers.profiles import get_profile
from helpers.core.timing import Timing, measure
from helpers.runs.tp_ffn.config import DemoConfig, RunOptions, build_model, sweep_world_sizes
from helpers.runs.tp_ffn.mesh_worker import MeshOptions, MeshRun
from helpers.runs.tp_ffn.results import NativeRun, SweepRun, TPRun
from helpers.tensor_parallel.ffn import tp_simulate
from helpers.tensor_parallel.shards import load_shard, write_shards
from helpers.torchrun.launcher import launch
from helpers.torchrun.multinode import launch_nodes

WORLD_SIZES = (1, 2, 4)
NODE_WORKERS = {"ffn_worker": TPRun, "mesh_worker": MeshRun}


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


def launch_native(config: DemoConfig, *, timeout: float = 600) -> NativeRun:
    """The unsplit FFN in one launched process (also checks the one-process simulation)."""
    args = replace(config, mode="native").args()
    return NativeRun.from_dict(launch("helpers.tp_demo", args, nproc=1, timeout=timeout))


def launch_tp(
    config: DemoConfig,
    world_size: int,
    options: RunOptions | None = None,
    *,
    timeout: float = 600,
    port: int | None = None,
) -> TPRun:
    """``world_size`` ranks, each ``g(shard(f(x)))`` on its shard; rank 0's result.

    One launch proves the output, times it and measures rank 0's memory; ``options`` add
    the training step, ``parallelize_module`` and a wider size to the same launch.
    """
    args = (
        replace(config, world_size=world_size, mode="tp").args() + (options or RunOptions()).args()
    )
    worker = "helpers.runs.tp_ffn.worker"
    return TPRun.from_dict(launch(worker, args, nproc=world_size, timeout=timeout, port=port))


def launch_sweep(
    config: DemoConfig,
    world_sizes: Sequence[int] = WORLD_SIZES,
    options: RunOptions | None = None,
    *,
    timeout: float = 600,
) -> SweepRun:
    """One launch of max(world_sizes) ranks: native, then every world size; rank 0's result.

    Rank 0 runs the native FFN and its ``tp_simulate`` check (``tp_demo``'s native mode,
    on the largest world size's shards) while the others wait; then for each p the ranks
    0 .. p-1, a process group of their own, do what ``launch_tp(config, p, options)``
    does, every collective in that group, while the rest wait. ``options`` apply to every
    world size, except ``dtensor``: only the whole world runs ``parallelize_module``. The
    shards must be written first (``write_all_shards``); p reads ``config.folder(p)``.
    """
    sizes = sweep_world_sizes(config, world_sizes)
    world = max(sizes)
    args = replace(config, world_size=world, mode="tp").args() + (options or RunOptions()).args()
    args += ["--sweep", ",".join(map(str, sizes))]
    worker = "helpers.runs.tp_ffn.worker"
    return SweepRun.from_dict(launch(worker, args, nproc=world, timeout=timeout))


def launch_mesh(
    config: DemoConfig, world_size: int, options: MeshOptions, *, timeout: float = 600
) -> MeshRun:
    """One training step on a (dp x tp) mesh, checked against the full model and batch."""
    args = replace(config, world_size=world_size, mode="tp").args() + options.args()
    worker = "helpers.runs.tp_ffn.mesh_worker"
    return MeshRun.from_dict(launch(worker, args, nproc=world_size, timeout=timeout))


def launch_on_nodes(
    worker: str,
    config: DemoConfig,
    *,
    nnodes: int,
    nproc_per_node: int,
    options: RunOptions | MeshOptions | None = None,
    rendezvous: str = "static",
    node_ranks: Sequence[int] | None = None,
    join_timeout: int = 30,
    timeout: float = 600,
) -> TPRun | MeshRun:
    """A worker (``ffn_worker``, ``mesh_worker``) launched as ``nnodes`` torchrun agents here."""
    if worker not in NODE_WORKERS:
        raise ValueError(f"worker {worker!r}; valid choices: {', '.join(NODE_WORKERS)}")
    world = nnodes * nproc_per_node
    args = [*replace(config, world_size=world, mode="tp").args()]
    args += options.args() if options is not None else []
    return NODE_WORKERS[worker].from_dict(
        launch_nodes(
            f"helpers.tensor_parallel.{worker}",
            args,
            nnodes=nnodes,
            nproc_per_node=nproc_per_node,
            rendezvous=rendezvous,
            node_ranks=node_ranks,
            join_timeout=join_timeout,
            timeout=timeout,
        )
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


@dataclass(frozen=True)
class Sweep:
    """One run's numbers: native, tensor parallel per world size, ``tp_simulate`` timings."""

    native: NativeRun
    runs: dict[int, TPRun]
    simulated: dict[int, Timing]

    @property
    def ok(self) -> bool:
        return self.native.simulate.ok and all(r.agrees(self.native) for r in self.runs.values())

    def series(self) -> dict[str, tuple[list[float], list[float]]]:
        """Milliseconds (means, stds) per world size: native, tp_simulate, tensor parallel."""
        ms = lambda ts: ([t.mean * 1e3 for t in ts], [t.std * 1e3 for t in ts])  # noqa: E731
        ps = list(self.runs)
        return {
            "native (1 process)": ms([self.native.timing] * len(ps)),
            "tp_simulate (1 process)": ms([self.simulated[p] for p in ps]),
            "tensor parallel (p processes)": ms([self.runs[p].step for p in ps]),
        }

    def numbers(self) -> list[dict]:
        """One row of plain numbers per world size (``make bench`` writes them)."""
        native = self.native.timing
        return [{"world_size": p, "backend": r.backend, "native_s": native.mean,
                 "native_std_s": native.std, "tp_simulate_s": self.simulated[p].mean,
                 "tp_simulate_std_s": self.simulated[p].std, "tp_s": r.step.mean,
                 "tp_std_s": r.step.std, "compute_s": r.compute.mean,
                 "allreduce_s": r.allreduce.mean,
                 "allreduce_bytes_per_rank": r.allreduce_bytes_per_rank,
                 "output_max_diff": r.output.max_diff, "output_tolerance": r.output.tolerance,
                 "agrees": r.agrees(self.native)} for p, r in self.runs.items()]  # fmt: skip

    def table(self, cores: int, device: str) -> str:
        """Times per world size, rank 0's compute and all-reduce apart."""
        lines = [
            f"{'p':>2} {'native':>16} {'tp_simulate':>16} {'tensor parallel':>17} "
            f"{'compute':>9} {'all-reduce':>11}"
        ]
        cell = lambda t, w: f"{t.mean * 1e3:>{w}.2f} ± {t.std * 1e3:4.2f} ms"  # noqa: E731
        for p, r in self.runs.items():
            over = (
                "  (oversubscribed: more ranks than cores)" if device == "cpu" and p > cores else ""
            )
            lines.append(
                f"{p:>2} {cell(self.native.timing, 9)} {cell(self.simulated[p], 8)} "
                f"{cell(r.step, 9)} {r.compute.mean * 1e3:>6.2f} ms "
                f"{r.allreduce.mean * 1e3:>8.2f} ms{over}"
            )
        return "\n".join(lines)

    def wide_table(self, cores: int, device: str) -> str:
        """The wider FFN's forward per world size, and its speed-up over p = 1 (ideal: p)."""
        one = self.runs[min(self.runs)].wide.step
        lines = [f"{'p':>2} {'forward':>17} {'compute':>9} {'all-reduce':>11} {'speed-up':>9} "
                 f"{'ideal':>6}"]  # fmt: skip
        for p, r in self.runs.items():
            w, gain = r.wide, one.mean / r.wide.step.mean
            notes = (
                ["oversubscribed: more ranks than cores"] if device == "cpu" and p > cores else []
            )
            if gain > p:
                notes.append("above p: each rank's products are 1/p as large (caches may serve "
                             "them better); not measured here")  # fmt: skip
            lines.append(
                f"{p:>2} {w.step.mean * 1e3:>9.2f} ± {w.step.std * 1e3:4.2f} ms "
                f"{w.compute.mean * 1e3:>6.2f} ms {w.allreduce.mean * 1e3:>8.2f} ms "
                f"{gain:>8.2f}x {p:>5}x" + (f"  ({'; '.join(notes)})" if notes else "")
            )
        return "\n".join(lines)


def tp_sweep(
    config: DemoConfig, world_sizes: Sequence[int] = WORLD_SIZES, options: RunOptions | None = None
) -> Sweep:
    """Shards, one launch (native and tp for each world size), tp_simulate timings."""
    write_all_shards(config, world_sizes)
    run = launch_sweep(config, world_sizes, options)
    return Sweep(run.native, run.runs, {p: time_simulate(config, p) for p in world_sizes})
