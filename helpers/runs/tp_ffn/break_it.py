"""Lesson 08's "Break it": the worker's own proof, run on a forward broken on purpose.

Two ranks in this kernel (threads over a real gloo group, ``helpers.torchrun.in_notebook``)
load their shard files and compute ``g(shard(f(x)))`` as the worker does, with one
mistake made on purpose; the worker's own check (``rank_work.native_diff``) then compares
every rank's output with the native FFN, within the same tolerance. No torchrun launch:
it takes a fraction of a second.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from helpers.core.checks import Proof, Verdict
from helpers.runs.tp_ffn.config import TPFFNConfig
from helpers.tensor_parallel.mappings import f, g
from helpers.tensor_parallel.rank_work import native_diff
from helpers.tensor_parallel.shards import load_shard
from helpers.torchrun.in_notebook import run_ranks
from helpers.torchrun.ranks import Rank

MISTAKES = {
    "none": "as the worker runs it",
    "wrong file": "rank 1 reads shard 0",
    "no all-reduce": "g skipped",
}


class _Built:
    """``config`` with its model built once, before the threads start: the model's seed is
    the global generator, which two threads seeding and drawing at once would mix."""

    def __init__(self, config: TPFFNConfig) -> None:
        self.config = config
        with torch.random.fork_rng(devices=[]):  # the caller's random state is kept
            self.built = config.model()

    def model(self, activation: str = "none") -> nn.Module:
        return copy.deepcopy(self.built)

    def __getattr__(self, name: str) -> object:
        return getattr(self.config, name)


def broken_run(config: TPFFNConfig, mistake: str, world_size: int = 2) -> Verdict:
    """The output proof of ``world_size`` ranks (threads) that make ``mistake`` (one of
    ``MISTAKES``), on the shard files in ``config.folder(world_size)``, in float32."""
    if mistake not in MISTAKES:
        raise ValueError(f"mistake={mistake!r}; valid: {', '.join(map(repr, MISTAKES))}")
    if world_size < 2:
        raise ValueError(f"world_size={world_size}; valid: 2 or more (rank 1 must exist)")
    built = _Built(config)

    def work(index: int, group: object) -> Proof:
        rank = Rank(index, world_size, index, torch.device("cpu"), "gloo",
                    "threads of this kernel", group)
        source = 0 if mistake == "wrong file" and index == 1 else index
        shard = load_shard(config.folder(world_size), world_size, source)
        x = config.input_batch(torch.float32, rank.device)
        with torch.no_grad():
            partial = shard(f(x, group))
            out = partial if mistake == "no all-reduce" else g(partial, group)
        diff, tol = native_diff(built, rank, out)  # the worst rank's, on every rank
        return Proof("output", diff, tol)

    results = run_ranks(world_size, work, timeout=60)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return Verdict(f"{world_size} ranks = native, {MISTAKES[mistake]}", results[:1])
