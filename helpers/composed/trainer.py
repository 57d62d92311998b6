"""``torchrun --nproc-per-node=P -m helpers.composed.trainer --dp D --tp T --pp S ...``.

Trains the small Llama on the Markov task (``data``) for ``--steps`` AdamW steps on a
``(pp, dp, tp)`` mesh (``layout``), every step on the same global batch whatever the
layout, and prints on rank 0 one JSON line with the loss of every step; ``--reference``
also trains the one-process model with the same flags (on rank 0) and adds its losses.
``--checkpoint-dir DIR`` saves a checkpoint after every step (``checkpoint``);
``--resume`` starts after the newest one there, whatever layout wrote it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.composed import checkpoint
from helpers.composed.data import MarkovTask
from helpers.composed.layout import Layout, build_stage
from helpers.core.flags import flags_of, parse
from helpers.distributed.ranks import exit_worker, process_group, worker_main, write_result
from helpers.placement.tiny_lm import LMConfig, build_lm

WORKER = "helpers.composed.trainer"


@dataclass(frozen=True)
class TrainerConfig:
    """The layout, the model, the batch and the run."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 2
    steps: int = 3
    seed: int = 0
    vocab: int = 64
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    layers: int = 4
    seq: int = 16
    batch: int = 8  # sequences per step, over all data-parallel ranks
    lr: float = 1e-2
    reference: bool = False
    checkpoint_dir: str = ""  # a checkpoint after every step, here (none when empty)
    resume: bool = False  # start after the newest checkpoint in checkpoint_dir, if any

    @property
    def layout(self) -> Layout:
        return Layout(self.pp, self.dp, self.tp)

    @property
    def lm(self) -> LMConfig:
        return LMConfig(vocab=self.vocab, hidden=self.hidden, blocks=self.layers, ffn=self.ffn,
                        heads=self.heads, kv_heads=self.kv_heads, rope=True)

    def validate(self, world_size: int | None = None) -> TrainerConfig:
        """Refuse a bad layout, model or batch before any launch (see ``Layout.validate``)."""
        if self.steps < 1:
            raise ValueError(f"--steps {self.steps}; valid: an integer >= 1")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume without --checkpoint-dir; valid: --checkpoint-dir DIR "
                             "--resume (DIR holding checkpoints of the same model)")
        self.layout.validate(self.lm, batch=self.batch, microbatches=self.microbatches,
                             world_size=world_size)
        return self

    def args(self) -> list[str]:
        """The command line, every flag given."""
        return flags_of(self)

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> TrainerConfig:
        """The inverse of :meth:`args`."""
        return parse(cls, f"torchrun --nproc-per-node=P -m {WORKER}", argv)


def reference_losses(config: TrainerConfig) -> list[float]:
    """The one-process model's loss at every step, on the whole global batch."""
    model = build_lm(config.lm, seed=config.seed).train()
    task, opt = MarkovTask(config.vocab, config.seed), torch.optim.AdamW(model.parameters(),
                                                                        lr=config.lr)
    losses = []
    for step in range(config.steps):
        ids, targets = task.batch(config.batch, config.seq, step)
        loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _value(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def composed_losses(config: TrainerConfig) -> list[float]:
    """This rank's part of the 3-D run; the loss of every step (the same on every rank)."""
    from torch.distributed.device_mesh import init_device_mesh

    layout, m = config.layout, config.microbatches
    mesh = init_device_mesh("cpu", (layout.pp, layout.dp, layout.tp),
                            mesh_dim_names=("pp", "dp", "tp"))
    stage, shard = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    module = build_stage(build_lm(config.lm, seed=config.seed).train(), layout, mesh, stage)
    opt = torch.optim.AdamW(module.parameters(), lr=config.lr)
    last = stage == layout.pp - 1

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # each micro-batch's mean; the schedule divides the summed gradients by m (scale_grads)
        return F.cross_entropy(out.flatten(0, 1), target.flatten())

    if layout.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        schedule = Schedule1F1B(PipelineStage(module, stage, layout.pp, torch.device("cpu"),
                                              group=mesh["pp"].get_group()), m, loss_fn=loss_fn)
    if layout.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel
    context = loss_parallel if layout.tp > 1 else contextlib.nullcontext
    task, rows, losses = MarkovTask(config.vocab, config.seed), config.batch // layout.dp, []
    start = 0
    if config.resume and (folder := checkpoint.latest(config.checkpoint_dir)) is not None:
        manifest = checkpoint.load(folder, module, opt, config)
        start, losses = manifest["step"] + 1, list(manifest["losses"])
    for step in range(start, config.steps):
        ids, targets = (t[shard * rows:(shard + 1) * rows]
                        for t in task.batch(config.batch, config.seq, step))
        opt.zero_grad()
        with context():
            if layout.pp == 1:
                loss = F.cross_entropy(module(ids).flatten(0, 1), targets.flatten())
                loss.backward()
            else:
                parts: list[torch.Tensor] = []
                schedule.step(*([ids] if stage == 0 else []),
                              **({"target": targets, "losses": parts} if last else {}))
                loss = torch.stack([_value(p) for p in parts]).mean() if last else torch.zeros(())
        opt.step()
        total = _value(loss).detach().reshape(1).clone() * last
        dist.all_reduce(total)  # the last stage's dp x tp ranks each hold their shard's mean
        losses.append(total.item() / (layout.dp * layout.tp))
        if config.checkpoint_dir:
            checkpoint.save(config.checkpoint_dir, step, module, opt, config, losses)
    return losses


def main(argv: list[str] | None = None) -> None:
    config = TrainerConfig.from_args(argv)
    with process_group(WORKER, device="cpu") as rank:
        config.validate(rank.world_size)
        data = {"config": asdict(config), "layout": str(config.layout),
                "losses": composed_losses(config)}
        if config.reference and rank.rank == 0:
            data["reference_losses"] = reference_losses(config)
        if rank.rank == 0:
            print(json.dumps(data), flush=True)
        write_result(rank, data)


if __name__ == "__main__":
    exit_worker(worker_main(WORKER, main))
