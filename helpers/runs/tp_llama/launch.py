"""Lesson 09's launches: the block worker under ``torchrun``, checked before it starts."""

from __future__ import annotations

from helpers.core.devices import check_gpu_ranks
from helpers.runs.tp_llama.config import WORKER, LlamaTPConfig
from helpers.runs.tp_llama.results import LlamaTPResult
from helpers.torchrun.launcher import launch


def launch_llama_tp(config: LlamaTPConfig, *, nproc: int, timeout: float = 300.0
                    ) -> LlamaTPResult:
    """Run the worker on ``nproc`` ranks (one core each) and return its typed result.

    Every choice is checked here first, so a bad one fails before any process starts.
    """
    config.validate(nproc)
    check_gpu_ranks(config.device, nproc)
    return LlamaTPResult.from_dict(launch(WORKER, config.args(), nproc=nproc, timeout=timeout))
