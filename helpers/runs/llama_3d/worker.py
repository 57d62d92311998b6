"""``torchrun --nproc-per-node=P -m helpers.runs.llama_3d.worker --dp D --tp T --pp S --cp C``
(``--experts E --top-k K``: the MoE model, its experts split over the dp ranks).

Trains the small Llama (or its mixture of experts) on the Markov task for ``--steps`` AdamW steps on a
``(pp, dp, cp, tp)`` mesh with the lesson's loop (``helpers.composed.training.train_3d``), measured
(``instrumented``), every step on the same global batch whatever the layout, and prints
on rank 0 one JSON line with the loss of every step; ``--reference`` adds the one-process
model's losses with the same flags. ``--checkpoint-dir DIR`` saves a checkpoint after
every step; ``--resume`` starts after the newest one there, whatever layout wrote it.
With ``--kill-rank R --kill-step K`` rank R kills itself (SIGKILL) as step K starts, on
the first attempt only: under ``torchrun --max-restarts=1`` every rank is restarted, and
``--resume`` carries on from the last checkpoint.
"""

from __future__ import annotations

import json

from helpers.runs.contract import serve
from helpers.runs.llama_3d.config import TrainerConfig
from helpers.runs.llama_3d.instrumented import attempt, train_layout
from helpers.runs.llama_3d.results import LayoutRun
from helpers.torchrun.ranks import Rank


def main(config: TrainerConfig, rank: Rank) -> LayoutRun:
    """Every rank trains its part of the layout; rank 0 prints the losses."""
    run = train_layout(config, device=rank.device)
    if rank.rank == 0:
        line = {"layout": config.name, "losses": run.losses, "attempt": attempt()}
        if config.reference:
            line["reference_losses"] = run.reference
        print(json.dumps(line), flush=True)
    return run


if __name__ == "__main__":
    serve(TrainerConfig, main)
