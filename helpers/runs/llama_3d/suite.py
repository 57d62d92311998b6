"""``torchrun --nproc-per-node=8 -m helpers.runs.llama_3d.suite ...``: every layout in one launch.

Starting eight Python processes on two cores takes longer than training the small model,
so the lesson starts them once and runs the layouts one after another, each on the
first ``pp x dp x tp`` ranks of the launch (its own ``DeviceMesh``), the other ranks
waiting. Then the checkpoints: the 3-D run saved one after step ``save_step``; the
``dp x tp`` layout resumes from it and saves after the next step; the 3-D layout resumes
from that one, back again. Each of those runs must also equal the one-process run.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import torch.distributed as dist

from helpers.composed.layout import Layout
from helpers.composed.run import train_layout
from helpers.core.flags import flags_of, parse
from helpers.core.paths import results_path
from helpers.runs.llama_3d.config import ModelRun, TrainerConfig
from helpers.runs.llama_3d.results import LayoutRun
from helpers.torchrun.ranks import exit_worker, process_group, worker_main, write_result

WORKER = "helpers.runs.llama_3d.suite"
LAYOUTS = (Layout(), Layout(dp=2), Layout(tp=2), Layout(pp=2), Layout(dp=2, tp=2),
           Layout(pp=2, tp=2), Layout(pp=2, dp=2, tp=2))
THREE_D, TWO_D = Layout(pp=2, dp=2, tp=2), Layout(dp=2, tp=2)


@dataclass(frozen=True)
class SuiteConfig(ModelRun):
    """The model, batch and run every layout shares (float64 by default: the proof's), and
    where the checkpoints go."""

    steps: int = 4
    dtype: str = "float64"
    checkpoint_dir: str = ""  # default: results/checkpoints/suite
    save_step: int = 1  # the 3-D run's checkpoint; the 2-D run saves after the next step

    @classmethod
    def for_profile(cls, profile, **change: object) -> SuiteConfig:
        """The sizes of ``profile.composed`` (``helpers.profiles``)."""
        names = {f.name for f in fields(ModelRun)}
        return cls(**{**{k: v for k, v in vars(profile.composed).items() if k in names},
                      **change})

    def trainer(self, layout: Layout, **change: object) -> TrainerConfig:
        """The config of one layout's run."""
        return replace(TrainerConfig(pp=layout.pp, dp=layout.dp, tp=layout.tp,
                                     **self.shared()), **change)

    def validate(self, world_size: int | None = None) -> SuiteConfig:
        """Every layout's refusals (``TrainerConfig.validate``), and 8 ranks."""
        if world_size is not None and world_size != THREE_D.world_size:
            raise ValueError(f"{world_size} ranks; valid: {THREE_D.world_size} (the 3-D layout's)")
        if not 0 <= self.save_step < self.steps - 2:
            raise ValueError(f"save_step={self.save_step}; valid: 0 .. {self.steps - 3} (two "
                             "more steps must follow it)")
        for layout in LAYOUTS:
            self.trainer(layout).validate()
        return self

    @property
    def root(self) -> Path:
        """Where the checkpoints go (an absolute path: the ranks may start elsewhere)."""
        return Path(self.checkpoint_dir or results_path("checkpoints/suite")).resolve()

    def folder(self, layout: Layout) -> str:
        return str(self.root / f"pp{layout.pp}_dp{layout.dp}_tp{layout.tp}")

    def args(self) -> list[str]:
        return flags_of(self)

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> SuiteConfig:
        return parse(cls, f"torchrun --nproc-per-node=8 -m {WORKER}", argv)


@dataclass
class SuiteResult:
    """Every layout's run, and the three runs of the checkpoint round trip."""

    config: SuiteConfig
    runs: list[LayoutRun]  # the 3-D one saved a checkpoint after ``save_step``
    two_d: LayoutRun  # dp x tp, resumed from the 3-D checkpoint, saving after the next step
    back: LayoutRun  # 3-D again, resumed from the 2-D checkpoint

    @property
    def ok(self) -> bool:
        return all(r.ok for r in [*self.runs, self.two_d, self.back])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SuiteResult:
        runs = {k: LayoutRun.from_dict(data[k]) for k in ("two_d", "back")}
        return cls(SuiteConfig(**data["config"]), [LayoutRun.from_dict(r) for r in data["runs"]],
                   **runs)


def run_suite(config: SuiteConfig, device: torch.device) -> SuiteResult | None:
    """Collective over the 8 ranks; the result on rank 0 (None elsewhere)."""
    three, two, s = config.folder(THREE_D), config.folder(TWO_D), config.save_step
    if dist.get_rank() == 0:  # an earlier run's checkpoints
        shutil.rmtree(config.root, ignore_errors=True)
    dist.barrier()
    runs = [train_layout(config.trainer(layout, checkpoint_dir=three if layout == THREE_D else ""),
                         list(range(layout.world_size)), device=device, save_at=(s,))
            for layout in LAYOUTS]
    two_d = train_layout(config.trainer(TWO_D, checkpoint_dir=two), list(range(4)),
                         device=device, save_at=(s + 1,), resume_from=three, resume_step=s)
    back = train_layout(config.trainer(THREE_D), device=device, resume_from=two,
                        resume_step=s + 1)
    if runs[0] is None:
        return None
    return SuiteResult(config, runs, two_d, back)


def main(argv: list[str] | None = None) -> None:
    config = SuiteConfig.from_args(argv)
    with process_group(WORKER, device=config.device) as rank:
        config.validate(rank.world_size)
        result = run_suite(config, rank.device)
        write_result(rank, result.to_dict() if result is not None else {})


if __name__ == "__main__":
    exit_worker(worker_main(WORKER, main))
