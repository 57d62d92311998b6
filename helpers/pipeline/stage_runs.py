"""Lesson 03's contract with its torchrun worker: a ``PipelineConfig`` in, a ``PipelineResult``
out.

The config is ``helpers.pipeline.stage_worker``'s command line, typed (``args()`` and
``from_args()``). The result holds, per proven run, a ``StageProof`` whose verdict is
decided here once, against ``PROOF_TOLERANCE``, and every timed run as a ``Timing``; its
reports are what the lesson prints. Every choice is checked before any process starts.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from helpers.core.sizes import format_bytes
from helpers.core.timing import Timing
from helpers.distributed.launcher import launch
from helpers.pipeline.schedule import PROOF_TOLERANCE, validate_microbatches

WORKER = "helpers.pipeline.stage_worker"
SCHEDULE_CHOICES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class PipelineConfig:
    """One launch: the batch, the cut, and the (schedule, micro-batches) runs to prove and time."""

    batch: int
    image_size: int
    runs: tuple[tuple[str, int], ...]
    split: tuple[str, ...]  # layer names to cut before: one stage (one process) more
    steps: int = 3
    warmup: int = 1
    num_classes: int = 1000
    threads: int = 1
    seed: int = 0
    lr: float = 0.01
    check: bool = True

    @property
    def stages(self) -> int:
        return len(self.split) + 1

    def validate(self) -> PipelineConfig:
        """Raise ValueError naming the first bad choice and what would be valid."""
        unknown = sorted({name for name, _ in self.runs} - set(SCHEDULE_CHOICES))
        if unknown:
            raise ValueError(f"unknown schedule(s) {unknown}; valid: {list(SCHEDULE_CHOICES)}")
        for _, m in self.runs:
            validate_microbatches(self.batch, m)
        return self

    def args(self) -> list[str]:
        """The worker's command line (the stages are torchrun's ``--nproc-per-node``)."""
        out = ["--batch", str(self.batch), "--image-size", str(self.image_size),
               "--runs", ",".join(f"{s}:{m}" for s, m in self.runs),
               "--split", ",".join(self.split), "--steps", str(self.steps),
               "--warmup", str(self.warmup), "--num-classes", str(self.num_classes),
               "--threads", str(self.threads), "--seed", str(self.seed), "--lr", str(self.lr)]
        return out + (["--check"] if self.check else [])

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> PipelineConfig:
        """The inverse of :meth:`args`, as the worker parses it; bad input is one line."""
        p = argparse.ArgumentParser(description=f"torchrun --nproc-per-node=K -m {WORKER}")
        p.add_argument("--batch", type=int, required=True)
        p.add_argument("--image-size", type=int, required=True)
        p.add_argument("--runs", required=True, help="schedule:micro-batches pairs, e.g. "
                       "gpipe:1,gpipe:4,1f1b:4")
        p.add_argument("--split", required=True, help="comma-separated layer names to cut before")
        defaults = {f.name: f.default for f in fields(cls)}
        for name in ("steps", "warmup", "num_classes", "threads", "seed"):
            p.add_argument(f"--{name.replace('_', '-')}", type=int, default=defaults[name])
        p.add_argument("--lr", type=float, default=defaults["lr"])
        p.add_argument("--check", action="store_true", help="prove each run before timing it")
        ns = p.parse_args(argv)
        try:
            runs = tuple((s, int(m)) for s, m in (r.split(":") for r in ns.runs.split(",")))
        except ValueError:
            p.error(f"--runs {ns.runs!r}: valid form is schedule:count[,schedule:count...]")
        config = cls(ns.batch, ns.image_size, runs, tuple(ns.split.split(",")), ns.steps,
                     ns.warmup, ns.num_classes, ns.threads, ns.seed, ns.lr, ns.check)
        try:
            return config.validate()
        except ValueError as error:
            p.error(str(error))


def validate_stage_count(stages: int, processes: int) -> None:
    """One process per stage: raise ValueError naming both counts and the rule."""
    if stages != processes:
        raise ValueError(
            f"--split gives {stages} stages but torchrun started {processes} processes; "
            "valid: one process per stage (--nproc-per-node = number of cut names + 1)"
        )


@dataclass(frozen=True)
class StageProof:
    """One pipelined step against one process accumulating the same micro-batches."""

    schedule: str
    microbatches: int
    loss_pipelined: float
    loss_reference: float
    output_diff: float
    loss_diff: float
    grad_diff: float
    weight_diff: float
    worst_grad: str
    worst_weight: str
    peak_activation_bytes: list[int]  # per rank, kept for backward during a second step

    @property
    def ok(self) -> bool:
        return max(self.output_diff, self.loss_diff, self.grad_diff,
                   self.weight_diff) <= PROOF_TOLERANCE


@dataclass(frozen=True)
class PipelineResult:
    """Rank 0's result of one launch, typed."""

    config: PipelineConfig
    backend: str
    proofs: list[StageProof]
    times: dict[tuple[str, int], list[float]]

    @classmethod
    def from_dict(cls, config: PipelineConfig, data: dict) -> PipelineResult:
        return cls(config, data["backend"], [StageProof(**c) for c in data.get("checks", [])],
                   {(r["schedule"], r["microbatches"]): r["times_s"] for r in data["runs"]})

    @property
    def proofs_ok(self) -> bool:
        return all(p.ok for p in self.proofs)

    def timings(self) -> dict[tuple[str, int], Timing]:
        """Every timed run, keyed by (schedule, micro-batches)."""
        return {(s, m): Timing(f"pipelined, {s}, M={m}", t) for (s, m), t in self.times.items()}

    def proof_table(self) -> str:
        lines = [f"backend: {self.backend}; {self.config.stages} processes, "
                 f"{self.config.threads} thread(s) each",
                 "proofs: one pipelined step vs one process accumulating the same micro-batches "
                 f"(tolerance {PROOF_TOLERANCE:g})",
                 f"  {'schedule':<8} {'M':>2}  {'outputs':>9} {'loss':>9} {'gradients':>9} "
                 f"{'weights':>9}"]
        for p in self.proofs:
            diffs = (p.output_diff, p.loss_diff, p.grad_diff, p.weight_diff)
            cells = " ".join(f"{f'≈ {d:.0e}':>9}" for d in diffs)
            lines.append(f"  {p.schedule:<8} {p.microbatches:>2}  {cells}  "
                         f"{'OK' if p.ok else 'FAILED'}")
        return "\n".join(lines)

    def peak(self, schedule: str, microbatches: int) -> list[int]:
        """Peak activation bytes per rank of one proven run."""
        for p in self.proofs:
            if (p.schedule, p.microbatches) == (schedule, microbatches):
                return p.peak_activation_bytes
        proven = [(p.schedule, p.microbatches) for p in self.proofs]
        raise ValueError(f"no proven run {schedule}, M={microbatches}; proven: {proven}")

    def peaks_table(self) -> str:
        """Peak activation bytes per rank, GPipe runs first, by M."""
        c = self.config
        lines = [f"peak activation bytes per rank, batch {c.batch} at {c.image_size}x"
                 f"{c.image_size}:",
                 f"  {'schedule':<8} {'M':>2}" + "".join(f"{'rank ' + str(r):>12}"
                                                        for r in range(c.stages))]
        for p in sorted(self.proofs, key=lambda p: (p.schedule != "gpipe", p.microbatches)):
            lines.append(f"  {p.schedule:<8} {p.microbatches:>2}" + "".join(
                f"{format_bytes(b):>12}" for b in p.peak_activation_bytes))
        return "\n".join(lines)


def launch_pipeline(config: PipelineConfig, *, nproc: int | None = None,
                    timeout: float = 1800) -> PipelineResult:
    """One process per stage (``nproc`` only to show the worker's refusal of a mismatch)."""
    config.validate()
    data = launch(WORKER, config.args(), nproc=nproc or config.stages, timeout=timeout)
    return PipelineResult.from_dict(config, data)
