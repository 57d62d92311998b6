"""Lesson 03's contract with its torchrun worker: a ``PipelineConfig`` in, a ``PipelineResult``
out.

The config is ``helpers.runs.pipeline.worker``'s command line, typed (``args()`` and
``from_args()``). The result holds, per proven run, a ``StageProof`` whose verdict is
decided here once, against ``PROOF_TOLERANCE``, and every timed run as a ``Timing``; its
reports are what the lesson prints. Every choice is checked before any process starts.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields

from helpers.core.sizes import format_bytes
from helpers.core.timing import Timing
from helpers.pipeline.schedule import PROOF_TOLERANCE, validate_microbatches
from helpers.torchrun.launcher import launch

WORKER = "helpers.runs.pipeline.worker"
SCHEDULE_CHOICES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class PipelineConfig:
    """One launch: the batch, the cut, the (schedule, micro-batches) runs to prove, and which
    of them to time.

    ``time_image_size``: the image size of the timed runs and the baselines (None: the
    proofs' ``image_size``); timing where the effect shows need not make every proof as slow.
    ``timed``: the runs to time (None: all of them). A proven run is timed on the pipeline its
    proof built, after the proof and the memory step, so ``warmup`` counts untimed steps beyond
    those. ``baselines``: also time one process running the whole model on the same batch,
    in the stage processes themselves (like for like with the pipeline), on rank 0 while the
    other ranks wait: with one thread, as each stage has, and with one thread per stage.
    """

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
    timed: tuple[tuple[str, int], ...] | None = None
    baselines: bool = False
    time_image_size: int | None = None

    @property
    def timing_size(self) -> int:
        return self.time_image_size or self.image_size

    @property
    def stages(self) -> int:
        return len(self.split) + 1

    @property
    def timed_runs(self) -> tuple[tuple[str, int], ...]:
        return self.runs if self.timed is None else self.timed

    def validate(self) -> PipelineConfig:
        """Raise ValueError naming the first bad choice and what would be valid."""
        unknown = sorted({name for name, _ in self.runs} - set(SCHEDULE_CHOICES))
        if unknown:
            raise ValueError(f"unknown schedule(s) {unknown}; valid: {list(SCHEDULE_CHOICES)}")
        for _, m in self.runs:
            validate_microbatches(self.batch, m)
        untimed = sorted(set(self.timed_runs) - set(self.runs))
        if untimed:
            raise ValueError(f"timed run(s) {untimed} are not among the runs {list(self.runs)}; "
                             "valid: a subset of the runs")
        return self

    def args(self) -> list[str]:
        """The worker's command line (the stages are torchrun's ``--nproc-per-node``)."""
        out = ["--batch", str(self.batch), "--image-size", str(self.image_size),
               "--runs", _pairs(self.runs),
               "--split", ",".join(self.split), "--steps", str(self.steps),
               "--warmup", str(self.warmup), "--num-classes", str(self.num_classes),
               "--threads", str(self.threads), "--seed", str(self.seed), "--lr", str(self.lr)]
        if self.timed is not None:
            out += ["--timed", _pairs(self.timed)]
        if self.time_image_size is not None:
            out += ["--time-image-size", str(self.time_image_size)]
        return out + (["--check"] if self.check else []) + (
            ["--baselines"] if self.baselines else [])

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
        p.add_argument("--timed", help="the runs to time, as --runs (default: all)")
        p.add_argument("--time-image-size", type=int, help="image size of the timed runs "
                       "(default: --image-size)")
        p.add_argument("--baselines", action="store_true",
                       help="also time one process running the whole model")
        ns = p.parse_args(argv)
        parsed = {}
        for flag in ("runs", "timed"):
            text = getattr(ns, flag)
            try:
                parsed[flag] = None if text is None else tuple(
                    (s, int(m)) for s, m in (r.split(":") for r in text.split(",")))
            except ValueError:
                p.error(f"--{flag} {text!r}: valid form is schedule:count[,schedule:count...]")
        config = cls(ns.batch, ns.image_size, parsed["runs"], tuple(ns.split.split(",")),
                     ns.steps, ns.warmup, ns.num_classes, ns.threads, ns.seed, ns.lr, ns.check,
                     parsed["timed"], ns.baselines, ns.time_image_size)
        try:
            return config.validate()
        except ValueError as error:
            p.error(str(error))


def _pairs(runs: tuple[tuple[str, int], ...]) -> str:
    return ",".join(f"{s}:{m}" for s, m in runs)


def validate_stage_count(stages: int, processes: int) -> None:
    """One process per stage: raise ValueError naming both counts and the rule."""
    if stages != processes:
        raise ValueError(
            f"--split gives {stages} stages but {processes} processes were started or asked for; "
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
    baselines: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, config: PipelineConfig, data: dict) -> PipelineResult:
        return cls(config, data["backend"], [StageProof(**c) for c in data.get("checks", [])],
                   {(r["schedule"], r["microbatches"]): r["times_s"] for r in data["runs"]},
                   data.get("baselines", {}))

    @property
    def single(self) -> Timing | None:
        """One process, whole model, one thread (rank 0, the others waiting)."""
        times = self.baselines.get("single")
        return Timing("one process, 1 thread (rank 0 alone)", times) if times else None

    @property
    def single_threads(self) -> Timing | None:
        """One process, whole model, one thread per stage (rank 0, the others waiting)."""
        times = self.baselines.get("single_threads")
        k = self.config.stages
        return Timing(f"one process, {k} threads (rank 0 alone)", times) if times else None

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
    """One process per stage; another ``nproc`` is refused here, before any process starts
    (the worker refuses it too when started by hand)."""
    config.validate()
    if nproc is not None:
        validate_stage_count(config.stages, nproc)
    data = launch(WORKER, config.args(), nproc=nproc or config.stages, timeout=timeout)
    return PipelineResult.from_dict(config, data)
