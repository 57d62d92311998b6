"""Lesson 06's launch: a ``DataParallelConfig`` in, as flags (``--help`` describes each).

``torchrun --nproc-per-node=2 -m helpers.runs.data_parallel.worker --model-vocab ...
--batch ... --seq ...``; the answer is a ``DataParallelResult`` (``results``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from helpers.core.flags import option, require_ints
from helpers.models.llama import LMConfig
from helpers.profiles import Profile
from helpers.runs.contract import RunConfig

DEVICES = ("auto", "cpu", "cuda")
RANKS = 2  # the lesson's data-parallel ranks: one process each


@dataclass(frozen=True)
class DataParallelConfig(RunConfig):
    """Lesson 06's launch: the collectives, then DDP, ZeRO-1/2/3 and FSDP2 proven.

    One Adam step of the small Llama under each, from the same weights, against one
    process on the whole batch."""

    WORKER: ClassVar[str] = "helpers.runs.data_parallel.worker"

    model: LMConfig = option(help="the small Llama every rank trains (lesson 05's shape)")
    batch: int = option(help="sequences per training step, over all ranks")
    seq: int = option(help="tokens per sequence")
    accumulation: int = option(2, "micro-batches per rank in the no_sync proof")
    bucket_cap_mb: float = option(2.0, "DDP's bucket size (MiB: DDP multiplies it by 2^20)")
    collective_sizes: tuple[int, ...] = option(
        (2**12, 2**16, 2**20, 2**22), "bytes of the full tensor each collective is timed at")
    repeats: int = option(5, "timed rounds per collective and size (the median is kept)")
    collective_repeats: int = option(10, "calls per timed round of a collective, back to back")
    warmup: int = option(2, "untimed calls per collective and size before the timed rounds")
    lr: float = option(1e-3, "Adam's learning rate in every run")
    device: Literal["auto", "cpu", "cuda"] = option(
        "auto", "cpu (gloo), cuda (NCCL, one GPU per rank), or auto")
    steps: int = option(5, "timed DDP steps after the first, alternating with as many of a DDP "
                        "whose hook skips the all-reduces (the timeline is read off the last)")

    @classmethod
    def for_profile(cls, profile: Profile, **changes: object) -> DataParallelConfig:
        """The lesson's launch for a profile: its small Llama and batch, then ``changes``."""
        lm, dp = profile.lm, profile.data_parallel
        return cls(**{"model": lm.model, "batch": dp.batch, "seq": lm.seq,
                      "accumulation": dp.accumulation, "bucket_cap_mb": dp.bucket_cap_mb,
                      "collective_sizes": dp.collective_sizes, "repeats": profile.repeats,
                      "warmup": profile.warmup, **changes})

    def ranks(self) -> int:
        """The lesson's 2 ranks."""
        return RANKS

    def validate(self, world_size: int) -> DataParallelConfig:
        """Raise ValueError naming the first bad choice and what would be valid."""
        super().validate(world_size)
        require_ints(self, {"batch": 1, "seq": 1, "accumulation": 1, "repeats": 1,
                            "collective_repeats": 1, "warmup": 0, "steps": 1}, as_flags=False)
        if not self.collective_sizes or min(self.collective_sizes) < 1:
            raise ValueError(f"collective_sizes={self.collective_sizes!r}; valid: one or more "
                             "sizes in bytes, each >= 1")
        if self.batch % world_size:
            valid = [n for n in range(1, self.batch + 1) if self.batch % n == 0]
            raise ValueError(f"a batch of {self.batch} sequences does not split over "
                             f"{world_size} ranks; valid world sizes: {valid}")
        per_rank = self.batch // world_size
        if per_rank % self.accumulation:
            raise ValueError(f"accumulation={self.accumulation} micro-steps of a rank's "
                             f"{per_rank} sequences; valid: a divisor of {per_rank}")
        if self.device not in DEVICES:
            raise ValueError(f"device={self.device!r}; valid choices: {', '.join(DEVICES)}")
        return self
