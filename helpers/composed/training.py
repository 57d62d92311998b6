"""The composed training loop: a ``(pp, dp, cp, tp)`` mesh, this rank's stage, 1F1B over
``pp``, AdamW.

Every rank of the mesh runs :func:`train_3d` on the same global batch at every step: its
data-parallel shard takes its rows, and its context-parallel rank its tokens of each of
them (the zig-zag split); the first stage feeds them to the pipeline, the last one
computes the loss (under ``loss_parallel`` when ``tp > 1``), and the loss of the whole
batch is reduced over the mesh. With a mixture of experts, the MoE weights' gradients are
then summed over tp (``experts.reduce_moe_gradients``) before AdamW's step. A harness
attaches from outside through :class:`Hooks` (lesson 13's clock, byte counter, memory meter
and checkpoints: ``helpers.runs.llama_3d.instrumented``); the loop itself knows none of them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.composed.data import MarkovTask
from helpers.composed.experts import build_model, reduce_moe_gradients
from helpers.composed.layout import CP_VARIANT, DIMS, Layout, StageModule, build_stage
from helpers.expert_parallel.moe import MoEShape
from helpers.models.llama import LMConfig

CPU = torch.device("cpu")

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


class TrainerConfig(Protocol):
    """What the loop needs of a launch: the layout, the model, the batch, the optimizer."""

    layout: Layout
    model: LMConfig
    seed: int
    lr: float
    microbatches: int
    batch: int
    seq: int
    steps: int

    @property
    def torch_dtype(self) -> torch.dtype: ...

    @property
    def moe(self) -> MoEShape | None: ...


@dataclass
class Trained:
    """One rank's part of a layout's training, as it stands."""

    mesh: DeviceMesh
    group: dist.ProcessGroup  # every rank of the mesh
    module: StageModule
    optimizer: torch.optim.Optimizer
    losses: list[float] = field(default_factory=list)  # the whole batch's, one per step
    shards: DeviceMesh | None = None  # fully_shard's ranks: dp, or dp x cp flattened


class Hooks:
    """Where a harness attaches to :func:`train_3d`; each hook does nothing here."""

    def start(self, state: Trained) -> int:
        """Once the stage and its AdamW are built: the first step to run (a resumed run's)."""
        return 0

    def step(self, step: int) -> contextlib.AbstractContextManager:
        """Around one step's forward, backward and optimizer step."""
        return contextlib.nullcontext()

    def end_step(self, step: int, state: Trained) -> None:
        """After the step's loss is reduced."""


def whole(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor``'s whole value (a collective over its mesh); a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def mean_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy, the mean over a micro-batch's tokens (the 1F1B schedule divides the
    summed gradients by the number of micro-batches: the step's gradient is the batch's)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def mine(rows: torch.Tensor, mesh: DeviceMesh, layout: Layout) -> torch.Tensor:
    """This rank's tokens of its data-parallel ``rows`` (batch, seq): its context-parallel
    rank's chunks of every sequence (all of them when ``cp = 1``)."""
    if layout.cp == 1:
        return rows.clone()
    from helpers.context_parallel.llama import tokens_of

    return tokens_of(rows, mesh["cp"].get_group(), CP_VARIANT).contiguous()


def train_3d(config: TrainerConfig, ranks: list[int] | None = None, *,
             device: torch.device = CPU, hooks: Hooks | None = None
             ) -> Trained | None:
    """Collective over the whole launch (every rank builds the mesh); trains on ``ranks``
    (default: all), returns what they hold, None on the other ranks."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.tensor.parallel import loss_parallel

    layout, hooks = config.layout, hooks or Hooks()
    ranks = list(range(layout.world_size)) if ranks is None else ranks
    if layout.cp > 1 and len(ranks) != dist.get_world_size():
        raise ValueError(f"cp={layout.cp} on {len(ranks)} of {dist.get_world_size()} ranks; "
                         "valid: context parallelism on every rank of the launch (flattening "
                         "dp and cp creates groups every rank must join)")
    mesh = DeviceMesh(device.type, layout.grid(ranks), mesh_dim_names=DIMS)  # tp innermost
    group = dist.new_group(ranks)
    if dist.get_rank() not in ranks:
        return None
    # fully_shard's ranks: dp, or dp and cp flattened into one dimension, as torchtitan
    # does (DeviceMesh's _flatten, private in torch 2.14: the mesh it returns is kept)
    shards = mesh["dp"] if layout.cp == 1 else mesh["dp", "cp"]._flatten(layout.fsdp_dim)
    stage, shard = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    last = stage == layout.pp - 1
    model = build_model(config.model, config.moe, config.seed).train().to(
        device=device, dtype=config.torch_dtype)
    module = build_stage(model, layout, mesh, stage, shards)
    # the experts stay plain tensors beside DTensors: AdamW one tensor at a time
    plain = {"foreach": False} if config.moe is not None else {}
    state = Trained(mesh, group, module,
                    torch.optim.AdamW(module.parameters(), lr=config.lr, **plain), shards=shards)
    tp = mesh["tp"].get_group() if config.moe is not None and layout.tp > 1 else None
    if layout.pp > 1:
        schedule = Schedule1F1B(PipelineStage(module, stage, layout.pp, device,
                                              group=mesh["pp"].get_group()),
                                config.microbatches, loss_fn=mean_loss)
    parallel_loss = loss_parallel if layout.tp > 1 else contextlib.nullcontext
    task, rows = MarkovTask(config.model.vocab, config.seed), config.batch // layout.dp
    for step in range(hooks.start(state), config.steps):
        ids, targets = (mine(t[shard * rows:(shard + 1) * rows], mesh, layout).to(device)
                        for t in task.batch(config.batch, config.seq, step))  # its own rows
        state.optimizer.zero_grad()
        with hooks.step(step):
            with parallel_loss():
                if layout.pp == 1:
                    loss = mean_loss(module(ids), targets)
                    loss.backward()
                else:
                    parts: list[torch.Tensor] = []
                    schedule.step(*([ids] if stage == 0 else []),
                                  **({"target": targets, "losses": parts} if last else {}))
                    loss = (torch.stack([whole(p) for p in parts]).mean() if last
                            else torch.zeros((), device=device))
            reduce_moe_gradients(module, tp, layout.dp)  # nothing to do without experts
            state.optimizer.step()
        total = whole(loss).detach().reshape(1).to(torch.float64) * last
        dist.all_reduce(total, group=group)  # the last stage's dp x cp x tp ranks: their means
        state.losses.append(total.item() / (layout.dp * layout.cp * layout.tp))
        hooks.end_step(step, state)
    return state
