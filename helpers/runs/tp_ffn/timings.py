"""Lesson 08's timings side by side: native, ``tp_simulate`` and tensor parallel per world size.

``tp_simulate`` (the ranks as a loop in one process) is timed here, in this process, with
one thread like each launched rank; the rest comes from a sweep's ``SweepRun``.
``tp_sweep`` does all of it at once (``make bench``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from helpers.core.timing import Timing, measure
from helpers.runs.contract import launch
from helpers.runs.tp_ffn.config import WORLD_SIZES, TPFFNConfig
from helpers.runs.tp_ffn.results import NativeRun, TPRun
from helpers.runs.tp_ffn.shard_files import write_all_shards
from helpers.tensor_parallel.ffn import tp_simulate
from helpers.tensor_parallel.shards import load_shard


def time_simulate(config: TPFFNConfig, world_size: int) -> Timing:
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
                 "ring_bytes_per_rank": r.ring_bytes,
                 "wire_bytes_per_rank": [w.sent for w in r.wire],
                 "gloo_bytes_per_rank": r.wire[0].payload if r.wire else None,
                 "output_max_diff": r.output.max_diff, "output_tolerance": r.output.tolerance,
                 "agrees": r.agrees(self.native)} for p, r in self.runs.items()]  # fmt: skip

    def table(self, cores: int, device: str) -> str:
        """Times per world size, rank 0's compute and all-reduce apart; ``*`` marks more
        ranks than cores."""
        lines = [f"{'p':>2} {'native':>17} {'tp_simulate':>17} {'tensor parallel':>17} "
                 f"{'compute':>8} {'all-reduce':>11}"]
        cell = lambda t: f"{t.mean * 1e3:>7.2f} ± {t.std * 1e3:4.2f} ms"  # noqa: E731
        for p, r in self.runs.items():
            lines.append(
                f"{p:>2} {cell(self.native.timing)} {cell(self.simulated[p])} {cell(r.step)} "
                f"{r.compute.mean * 1e3:>5.2f} ms {r.allreduce.mean * 1e3:>8.2f} ms"
                + _over(p, cores, device))
        return "\n".join(lines + _footnote(self.runs, cores, device))

    def verdicts(self) -> list[str]:
        """Per world size: tensor parallel's time over native's, and which was faster (a
        difference within the two standard deviations is called noise)."""
        native, lines = self.native.timing, []
        for p, r in self.runs.items():
            ratio = r.step.mean / native.mean
            noise = abs(r.step.mean - native.mean) <= r.step.std + native.std
            lines.append(f"p={p}: {ratio:.2f}x native's time: "
                         f"{'faster' if ratio < 1 else 'slower'} than native"
                         + ("; the gap is within the two std (noise)" if noise else ""))
        return lines

    def slower(self) -> list[int]:
        """The world sizes at which tensor parallel took longer than native."""
        return [p for p, r in self.runs.items() if r.step.mean > self.native.timing.mean]

    def wide_table(self, cores: int, device: str) -> str:
        """The wider FFN's forward per world size, and its speed-up over p = 1 (ideal: p)."""
        one = self.runs[min(self.runs)].wide.step
        lines = [f"{'p':>2} {'forward':>18} {'compute':>9} {'all-reduce':>11} {'speed-up':>9} "
                 f"{'ideal':>6}"]  # fmt: skip
        above = []
        for p, r in self.runs.items():
            w, gain = r.wide, one.mean / r.wide.step.mean
            if gain > p:
                above.append(p)
            lines.append(
                f"{p:>2} {w.step.mean * 1e3:>8.2f} ± {w.step.std * 1e3:5.2f} ms "
                f"{w.compute.mean * 1e3:>6.2f} ms {w.allreduce.mean * 1e3:>8.2f} ms "
                f"{gain:>8.2f}x {p:>5}x" + _over(p, cores, device) + (" +" if gain > p else ""))
        if above:
            lines.append("+ above p: each rank's products are 1/p as large (caches may serve "
                         "them better); not measured here")
        return "\n".join(lines + _footnote(self.runs, cores, device))


def _over(p: int, cores: int, device: str) -> str:
    return " *" if device == "cpu" and p > cores else ""


def _footnote(runs: dict, cores: int, device: str) -> list[str]:
    if not any(_over(p, cores, device) for p in runs):
        return []
    return [f"* oversubscribed: more ranks than this machine's {cores} CPU core(s)"]


def tp_sweep(config: TPFFNConfig, world_sizes: Sequence[int] = WORLD_SIZES) -> Sweep:
    """Shards, one launch (native and tp for each world size), tp_simulate timings."""
    write_all_shards(config, world_sizes)
    run = launch(replace(config, sweep=tuple(world_sizes)))
    return Sweep(run.native, run.runs, {p: time_simulate(config, p) for p in world_sizes})
