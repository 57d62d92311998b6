"""``torchrun --nproc-per-node=P -m helpers.runs.llama_3d.worker --dp D --tp T --pp S ...``.

Trains the small Llama on the Markov task (``data``) for ``--steps`` AdamW steps on a
``(pp, dp, tp)`` mesh (``layout``), every step on the same global batch whatever the
layout (``run.train_layout``), and prints on rank 0 one JSON line with the loss of every
step; ``--reference`` adds the one-process model's losses with the same flags.
``--checkpoint-dir DIR`` saves a checkpoint after every step (``checkpoint``);
``--resume`` starts after the newest one there, whatever layout wrote it. With
``--kill-rank R --kill-step K`` rank R kills itself (SIGKILL) as step K starts, on the
first attempt only: under ``torchrun --max-restarts=1`` every rank is restarted, and
``--resume`` carries on from the last checkpoint.
"""

from __future__ import annotations

import json
import os

from helpers.composed.run import train_layout
from helpers.runs.llama_3d.config import WORKER, TrainerConfig
from helpers.torchrun.ranks import exit_worker, process_group, worker_main, write_result

__all__ = ["WORKER", "TrainerConfig", "main"]


def main(argv: list[str] | None = None) -> None:
    config = TrainerConfig.from_args(argv)
    with process_group(WORKER, device=config.device) as rank:
        config.validate(rank.world_size)
        run = train_layout(config, device=rank.device)
        if rank.rank == 0:
            line = {"layout": str(config.layout), "losses": run.losses,
                    "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
            if config.reference:
                line["reference_losses"] = run.reference
            print(json.dumps(line), flush=True)
        write_result(rank, run.to_dict() if run is not None else {})


if __name__ == "__main__":
    exit_worker(worker_main(WORKER, main))
