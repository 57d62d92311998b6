"""Lesson 06's launch: the data-parallel worker under ``torchrun``, checked before it starts."""

from __future__ import annotations

from helpers.core.devices import check_gpu_ranks
from helpers.runs.data_parallel.config import WORKER, DataParallelConfig
from helpers.runs.data_parallel.results import DataParallelResult
from helpers.torchrun.launcher import launch


def launch_data_parallel(config: DataParallelConfig, *, nproc: int = 2,
                         timeout: float = 300.0) -> DataParallelResult:
    """Run the worker on ``nproc`` ranks (one core each) and return its typed result.

    Every choice is checked here first, so a bad one fails before any process starts.
    """
    config.validate(nproc)
    check_gpu_ranks(config.device, nproc)
    return DataParallelResult.from_dict(launch(WORKER, config.args(), nproc=nproc,
                                               timeout=timeout))
