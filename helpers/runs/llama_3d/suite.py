"""``torchrun --nproc-per-node=8 -m helpers.runs.llama_3d.suite ...``: every layout in one launch.

Starting eight Python processes on two cores takes longer than training the small model,
so the lesson starts them once and runs the layouts one after another, each on the
first ``pp x dp x cp x tp`` ranks of the launch (its own ``DeviceMesh``), the other ranks
waiting: the dense layouts, then the MoE model's (``ep x tp x pp``). Then the checkpoints:
the 3-D run saved one after step ``save_step``; the ``dp x tp`` layout resumes from it and
saves after the next step; the 3-D layout resumes from that one, back again. Each of
those runs must also equal the one-process run.
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import torch.distributed as dist

from helpers.runs.contract import serve
from helpers.runs.llama_3d.config import THREE_D, TWO_D, SuiteConfig
from helpers.runs.llama_3d.instrumented import train_layout
from helpers.runs.llama_3d.results import SuiteResult
from helpers.torchrun.ranks import Rank


def main(config: SuiteConfig, rank: Rank) -> SuiteResult | None:
    """Collective over the 8 ranks; the result on rank 0 (None elsewhere)."""
    three, two, s = config.folder(THREE_D), config.folder(TWO_D), config.save_step
    if rank.rank == 0:  # an earlier run's checkpoints
        shutil.rmtree(config.root, ignore_errors=True)
    dist.barrier()
    configs = config.configs()  # the dense layouts, then the MoE one
    device, total = rank.device, len(configs) + 2
    runs = [train_layout(replace(each, checkpoint_dir=three)
                         if each.layout == THREE_D and not each.experts else each,
                         list(range(each.layout.world_size)), device=device, save_at=(s,),
                         progress=f"run {k} of {total}")
            for k, each in enumerate(configs, 1)]
    two_d = train_layout(config.trainer(TWO_D, checkpoint_dir=two), list(range(4)),
                         device=device, save_at=(s + 1,), resume_from=three, resume_step=s,
                         progress=f"run {total - 1} of {total}")
    back = train_layout(config.trainer(THREE_D), device=device, resume_from=two,
                        resume_step=s + 1, progress=f"run {total} of {total}")
    if rank.rank != 0:
        return None
    return SuiteResult(config, runs, two_d, back)


if __name__ == "__main__":
    serve(SuiteConfig, main)
