"""Lesson 06's contract with its torchrun worker: a ``DataParallelConfig`` in.

The worker (``helpers.runs.data_parallel.worker``) reads it from one ``--config`` argument (JSON)
and answers with a ``DataParallelResult`` (``helpers.runs.data_parallel.results``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, fields

from helpers.profiles import Profile
from helpers.models.llama import LMConfig, lm_config

WORKER = "helpers.runs.data_parallel.worker"


@dataclass(frozen=True)
class DataParallelConfig:
    """One launch: the model, the global batch, and what to measure."""

    vocab: int
    hidden: int
    blocks: int
    batch: int  # sequences per step, over all ranks
    seq: int
    accumulation: int = 2  # micro-steps per step in the no_sync proof
    bucket_cap_mb: float = 2.0
    collective_sizes: tuple[int, ...] = (2**12, 2**16, 2**20, 2**22)  # bytes, full tensor
    repeats: int = 5
    collective_repeats: int = 10  # calls per timed round of a collective (back to back)
    warmup: int = 2
    lr: float = 1e-3
    device: str = "auto"  # "cpu" (gloo), "cuda" (NCCL), or "auto"
    steps: int = 3  # timed DDP steps (the overlap is read off the last)

    @classmethod
    def for_profile(cls, profile: Profile, **changes: object) -> DataParallelConfig:
        """The lesson's launch for a profile: its small Llama and batch."""
        lm = profile.lm
        dp = profile.data_parallel
        return cls(vocab=lm.vocab, hidden=lm.hidden, blocks=lm.blocks, batch=dp.batch,
                   seq=lm.seq, accumulation=dp.accumulation, bucket_cap_mb=dp.bucket_cap_mb,
                   collective_sizes=dp.collective_sizes, repeats=profile.repeats,
                   warmup=profile.warmup, **changes)

    @property
    def lm(self) -> LMConfig:
        """The model: MLP 4x hidden, 64 channels per head (lesson 05's shape)."""
        return lm_config(self.vocab, self.hidden, self.blocks)

    def validate(self, world_size: int) -> DataParallelConfig:
        """Raise ValueError naming the first bad choice and what would be valid."""
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size={world_size!r}; valid: an integer >= 1")
        if self.batch % world_size:
            valid = [n for n in range(1, self.batch + 1) if self.batch % n == 0]
            raise ValueError(f"a batch of {self.batch} sequences does not split over "
                             f"{world_size} ranks; valid world sizes: {valid}")
        per_rank = self.batch // world_size
        if per_rank % self.accumulation:
            raise ValueError(f"accumulation={self.accumulation} micro-steps of a rank's "
                             f"{per_rank} sequences; valid: a divisor of {per_rank}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device={self.device!r}; valid choices: auto, cpu, cuda")
        return self

    def args(self) -> list[str]:
        """The worker's command line."""
        return ["--config", json.dumps(asdict(self))]

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> DataParallelConfig:
        """The inverse of :meth:`args`."""
        p = argparse.ArgumentParser(description=f"torchrun -m {WORKER}")
        p.add_argument("--config", required=True, help="the DataParallelConfig as JSON")
        data = json.loads(p.parse_args(argv).config)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config fields {unknown}; valid: {sorted(known)}")
        data["collective_sizes"] = tuple(data.get("collective_sizes", cls.collective_sizes))
        return cls(**data)

