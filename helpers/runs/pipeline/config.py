"""What one launch of lesson 03's pipeline runs: a ``PipelineConfig``, the worker's flags.

One process per stage: the cut names give the stage count, which is also the number of
ranks to launch (``ranks()``); every choice is checked before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from helpers.core.flags import option
from helpers.pipeline.schedule import validate_microbatches
from helpers.pipeline.stage_cuts import balanced_cut_names
from helpers.profiles import Profile
from helpers.runs.contract import RunConfig

SCHEDULE_CHOICES = ("gpipe", "1f1b")
Runs = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class PipelineConfig(RunConfig):
    """One launch of lesson 03's stage processes: the runs to prove, and those to time.

    A proven run is timed on the pipeline its proof built, after the proof and the memory
    step, so ``warmup`` counts untimed steps beyond those. ``baselines``: also time one
    process running the whole model on the same batch, in the stage processes themselves
    (like for like with the pipeline), on rank 0 while the other ranks wait: with one
    thread, as each stage has, and with one thread per stage.
    """

    WORKER: ClassVar[str] = "helpers.runs.pipeline.worker"

    batch: int = option(help="images per training step (split into the micro-batches)")
    image_size: int = option(help="pixels per side of the proofs' images")
    runs: Runs = option(help="schedule:micro-batches pairs to prove and time, e.g. "
                        "gpipe:4,1f1b:4 (schedules: gpipe, 1f1b)")
    split: tuple[str, ...] = option(help="ResNet50 block names to cut before, comma-separated: "
                                    "one stage (one process) more each")
    steps: int = option(3, "timed training steps per timed run")
    warmup: int = option(1, "untimed steps before each timed run and each baseline")
    num_classes: int = option(1000, "ResNet50's output classes")
    threads: int = option(1, "torch threads per stage process")
    seed: int = option(0, "seed of the weights and of the batch")
    lr: float = option(0.01, "SGD learning rate")
    check: bool = option(True, "prove each run against one process before timing it")
    timed: Runs | None = option(None, "the runs to time, as --runs (none: all of them)")
    baselines: bool = option(False, "also time one process running the whole model "
                             "(rank 0, 1 thread and one thread per stage)")
    time_image_size: int | None = option(None, "pixels per side of the timed runs' images "
                                         "(none: --image-size)")
    break_it: bool = option(False, "also prove one GPipe step that sums its micro-batch "
                            "gradients instead of averaging them: a proof that must fail")

    @classmethod
    def for_profile(cls, profile: Profile, **changes: Any) -> PipelineConfig:
        """Lesson 03's launch: GPipe and 1F1B proven at the profile's M (proofs at its proof
        size) and a broken GPipe step disproven, GPipe timed at its image size beside the
        one-process baselines; two stages cut where their FLOPs balance, unless ``split``
        is given."""
        p, m = profile.pipeline, profile.pipeline.microbatches
        values: dict[str, Any] = dict(
            batch=p.batch, image_size=p.proof_image_size, time_image_size=p.image_size,
            runs=(("gpipe", m), ("1f1b", m)), timed=(("gpipe", m),), baselines=True,
            steps=profile.repeats, warmup=1, break_it=True)
        values.update(changes)
        if "split" not in values:
            values["split"] = tuple(balanced_cut_names(2, p.image_size))
        return cls(**values)

    @property
    def timing_size(self) -> int:
        return self.time_image_size or self.image_size

    @property
    def stages(self) -> int:
        return len(self.split) + 1

    @property
    def timed_runs(self) -> Runs:
        return self.runs if self.timed is None else self.timed

    def ranks(self) -> int:
        """One process per stage."""
        return self.stages

    def validate(self, world_size: int) -> PipelineConfig:
        """Raise ValueError naming the first bad choice and what would be valid."""
        super().validate(world_size)
        unknown = sorted({name for name, _ in self.runs} - set(SCHEDULE_CHOICES))
        if unknown:
            raise ValueError(f"unknown schedule(s) {unknown}; valid: {list(SCHEDULE_CHOICES)}")
        for _, m in self.runs:
            validate_microbatches(self.batch, m)
        untimed = sorted(set(self.timed_runs) - set(self.runs))
        if untimed:
            raise ValueError(f"timed run(s) {untimed} are not among the runs {list(self.runs)}; "
                             "valid: a subset of the runs")
        if self.stages != world_size:
            raise ValueError(
                f"--split gives {self.stages} stages but {world_size} processes were started or "
                "asked for; valid: one process per stage (--nproc-per-node = number of cut "
                "names + 1)")
        return self
