"""What one launch of lesson 04 runs: a ``SchedulesConfig``, the worker's flags.

Every schedule runs in the same launch of ``processes`` ranks; ``validate_plan`` checks
that each one can cut the MLP stack into its chunks, before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from helpers.core.flags import option
from helpers.pipeline.runtime import CHUNKS_PER_RANK, SCHEDULE_NAMES
from helpers.profiles import Profile
from helpers.runs.contract import RunConfig


def validate_plan(schedule: str, ranks: int, microbatches: int, blocks: int, batch: int) -> int:
    """Chunks in all (ranks x chunks per rank), after checking every choice; else ValueError."""
    if schedule not in SCHEDULE_NAMES:
        raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULE_NAMES)}")
    if not isinstance(microbatches, int) or microbatches < 1 or batch % microbatches:
        raise ValueError(f"{microbatches!r} micro-batches for a batch of {batch}; valid: a "
                         f"divisor of {batch}")
    chunks = ranks * CHUNKS_PER_RANK[schedule]
    if CHUNKS_PER_RANK[schedule] > 1 and microbatches % ranks:
        raise ValueError(f"{schedule} needs the micro-batches to be a multiple of the ranks; "
                         f"got M={microbatches} for {ranks} ranks (valid: "
                         f"{', '.join(str(ranks * i) for i in range(1, 5))}, ...)")
    if chunks > blocks or blocks % chunks:
        raise ValueError(f"{schedule} on {ranks} ranks cuts the model into {chunks} chunks, but "
                         f"{blocks} blocks do not split into {chunks} equal chunks; valid: a "
                         f"multiple of {chunks} blocks")
    return chunks


@dataclass(frozen=True)
class SchedulesConfig(RunConfig):
    """One launch: which schedules, on how many ranks, at which sizes."""

    WORKER: ClassVar[str] = "helpers.runs.schedules.worker"

    microbatches: int = option(help="micro-batches per training step (M)")
    batch: int = option(help="samples per training step")
    width: int = option(256, "features per sample (the MLP blocks' width)")
    blocks: int = option(8, "MLP blocks in the stack, cut into equal chunks")
    warmup: int = option(2, "untimed warm-up steps per schedule, after its proof step")
    steps: int = option(3, "timed training steps per schedule, after its warm-up")
    processes: int = option(2, "ranks to launch, one process each (K)")
    schedules: tuple[str, ...] = option(SCHEDULE_NAMES, "schedules to run, comma-separated; "
                                        f"valid: {', '.join(SCHEDULE_NAMES)}")
    lr: float = option(0.01, "SGD learning rate")

    @classmethod
    def for_profile(cls, profile: Profile, **changes: Any) -> SchedulesConfig:
        """Lesson 04's launch: the profile's sizes; ``profile.warmup`` untimed steps, then
        ``profile.repeats`` timed steps of each schedule."""
        s = profile.schedules
        values: dict[str, Any] = dict(microbatches=s.microbatches, batch=s.batch,
                                      width=s.width, blocks=s.blocks, warmup=profile.warmup,
                                      steps=profile.repeats)
        return cls(**{**values, **changes})

    def ranks(self) -> int:
        return self.processes

    def validate(self, world_size: int) -> SchedulesConfig:
        """Raise ValueError naming the first bad choice and what would be valid."""
        super().validate(world_size)
        if world_size != self.processes:
            raise ValueError(f"processes={self.processes} but {world_size} ranks were started "
                             f"or asked for; valid: {self.processes} (or set --processes)")
        if self.warmup < 0 or self.steps < 1:
            raise ValueError(f"warmup={self.warmup}, steps={self.steps}; valid: warmup >= 0 "
                             "and steps >= 1")
        for name in self.schedules:
            validate_plan(name, world_size, self.microbatches, self.blocks, self.batch)
        return self
