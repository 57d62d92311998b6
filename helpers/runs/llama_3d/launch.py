"""The lesson's launches: every layout at once (``suite``), one layout (``trainer``), and a
run that loses a rank and is restarted by ``torchrun --max-restarts=1``."""

from __future__ import annotations

from pathlib import Path

from helpers.composed.checkpoint import check, latest
from helpers.core.devices import check_gpu_ranks
from helpers.runs.llama_3d.config import WORKER as TRAINER
from helpers.runs.llama_3d.config import TrainerConfig
from helpers.runs.llama_3d.results import LayoutRun
from helpers.runs.llama_3d.suite import WORKER as SUITE
from helpers.runs.llama_3d.suite import SuiteConfig, SuiteResult
from helpers.torchrun.launcher import launch


def launch_suite(config: SuiteConfig, timeout: float = 300.0) -> SuiteResult:
    """Every layout and the checkpoint round trip, in one launch of 8 ranks."""
    config.validate()
    check_gpu_ranks(config.device, 8)
    return SuiteResult.from_dict(launch(SUITE, config.args(), nproc=8, timeout=timeout))


def launch_trainer(config: TrainerConfig, *, restarts: int = 0,
                   timeout: float = 300.0) -> LayoutRun:
    """One layout's run (``restarts``: how often torchrun may restart every rank). A
    checkpoint it would resume from is checked first: another model's is refused here."""
    config.validate()
    if config.resume and (folder := latest(config.checkpoint_dir)) is not None:
        check(folder, config)
    check_gpu_ranks(config.device, config.layout.world_size)
    return LayoutRun.from_dict(launch(TRAINER, config.args(), nproc=config.layout.world_size,
                                      timeout=timeout, restarts=restarts))


def survivors() -> list[int]:
    """The processes of the latest launch still running: those in its process group (the
    launcher starts each launch in a group of its own). Linux's /proc; empty elsewhere."""
    from helpers.torchrun import launcher

    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if launcher.last_group is not None and int(fields[2]) == launcher.last_group:
            found.append(int(entry.name))  # fields: state, ppid, pgrp, ...
    return found
