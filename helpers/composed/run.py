"""One layout of the 3-D run on a set of ranks, measured, and the one-process run it must equal.

``train_layout`` is what every rank of the layout runs: it builds the ``(pp, dp, tp)``
mesh over its ranks (the first ``pp x dp x tp`` ranks of the launch, so that one launch
can run several layouts one after another), its stage (``layout.build_stage``), and
trains with AdamW, 1F1B over ``pp`` under ``loss_parallel`` over ``tp``. Around every
step it reads the clock, counts what each mesh dimension sends (``comms.MeshComms``) and
meters the activations kept (``measure.StageMeter``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.comm.mesh_meter import MeshComms
from helpers.composed import checkpoint
from helpers.composed.data import MarkovTask
from helpers.composed.digest import gathered_fingerprint, whole
from helpers.composed.layout import build_stage
from helpers.composed.ledger import predicted_memory, predicted_sent
from helpers.models.llama import build_lm
from helpers.runs.llama_3d.config import DTYPES, TrainerConfig
from helpers.runs.llama_3d.measure import StageMeter, held
from helpers.runs.llama_3d.results import DIMS, LayoutRun, RankRecord

CPU = torch.device("cpu")


def _key(config: TrainerConfig, device: torch.device, scale: float, parts: int) -> tuple:
    return (config.lm, config.steps, config.seed, config.batch, config.seq, config.lr,
            config.dtype, str(device), scale, parts)


@functools.lru_cache(maxsize=4)
def _reference(key: tuple) -> Reference:
    lm, steps, seed, batch, seq, lr, dtype, device, scale, parts = key
    model = build_lm(lm, seed=seed).train().to(device=device, dtype=DTYPES[dtype])
    task, opt = MarkovTask(lm.vocab, seed), torch.optim.AdamW(model.parameters(), lr=lr)
    losses, grad_scale = [], 0.0
    for step in range(steps):
        ids, targets = (t.to(device) for t in task.batch(batch, seq, step))
        opt.zero_grad()
        loss = 0.0
        for i, t in zip(ids.chunk(parts), targets.chunk(parts), strict=True):
            part = F.cross_entropy(model(i).flatten(0, 1), t.flatten()) / parts
            (part * scale).backward()
            loss += part.item()
        grad_scale = max([grad_scale, *(p.grad.abs().max().item() for p in model.parameters())])
        opt.step()
        losses.append(loss)
    return Reference(losses, {k: v.detach().clone() for k, v in model.named_parameters()},
                     grad_scale)


def reference_run(config: TrainerConfig, device: torch.device = CPU, scale: float = 1.0,
                  parts: int = 1) -> Reference:
    """The one-process model with the same flags (on ``device``): its loss at every step
    (on the whole global batch), its final weights by parameter name, its largest
    gradient element. ``scale`` multiplies every gradient (1: the true one; 0.5 shows what
    a halved gradient does); ``parts`` accumulates each batch in that many slices (the
    same sums in another order)."""
    return _reference(_key(config, device, scale, parts))


def _mesh(layout, ranks: list[int], device_type: str = "cpu"):
    from torch.distributed.device_mesh import DeviceMesh

    grid = torch.tensor(ranks).reshape(layout.pp, layout.dp, layout.tp)
    return DeviceMesh(device_type, grid, mesh_dim_names=("pp", "dp", "tp"))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Reference:
    losses: list[float]
    weights: dict[str, torch.Tensor]
    grad_scale: float


def _compare_weights(module, reference: dict[str, torch.Tensor], group, first: bool
                     ) -> tuple[float, int]:
    """(largest |w - w_ref|, parameters compared): collective over ``group``."""
    worst, count = 0.0, 0
    for name, p in module.named_parameters():
        full = whole(p.detach())  # every rank of the stage gathers the whole tensor
        worst = max(worst, (full - reference[name]).abs().max().item())
        count += 1
    out = torch.tensor([worst, float(count) * first], dtype=torch.float64,
                       device=next(iter(reference.values())).device)
    dist.all_reduce(out[:1], op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(out[1:], group=group)
    return out[0].item(), int(out[1].item())


def train_layout(config: TrainerConfig, ranks: list[int] | None = None, *,
                 device: torch.device = CPU, save_at: tuple[int, ...] = (), resume_from: str = "",
                 resume_step: int | None = None) -> LayoutRun | None:
    """Collective over the whole launch (meshes are built by every rank); the run on ranks
    ``ranks`` (default: all), returned on those ranks, None on the others.

    ``save_at``: the steps after which to save a checkpoint in ``config.checkpoint_dir``
    (default: every step, when it is set). ``resume_from``: a folder of checkpoints to
    start from (the one after ``resume_step``; default the newest), instead of
    ``config.checkpoint_dir`` under ``config.resume``."""
    layout, m = config.layout, config.microbatches
    ranks = list(range(layout.world_size)) if ranks is None else ranks
    mesh = _mesh(layout, ranks, device.type)
    group = dist.new_group(ranks)
    me = dist.get_rank()
    if me not in ranks:
        return None
    coords = {d: mesh.get_local_rank(d) for d in ("pp", "dp", "tp")}
    stage, shard = coords["pp"], coords["dp"]
    model = build_lm(config.lm, seed=config.seed).train().to(device=device,
                                                             dtype=config.torch_dtype)
    module = build_stage(model, layout, mesh, stage)
    opt = torch.optim.AdamW(module.parameters(), lr=config.lr)
    last = stage == layout.pp - 1

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # each micro-batch's mean; the schedule divides the summed gradients by m (scale_grads)
        return F.cross_entropy(out.flatten(0, 1), target.flatten())

    if layout.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        schedule = Schedule1F1B(PipelineStage(module, stage, layout.pp, device,
                                              group=mesh["pp"].get_group()), m, loss_fn=loss_fn)
    if layout.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel
    context = loss_parallel if layout.tp > 1 else contextlib.nullcontext
    task, rows, losses, start = MarkovTask(config.vocab, config.seed), config.batch // layout.dp, [], 0
    folder = checkpoint.latest(resume_from or (config.checkpoint_dir if config.resume else ""))
    if resume_from and resume_step is not None:
        folder = checkpoint.step_folder(resume_from, resume_step)
    order = [n for n, _ in model.named_parameters()]
    loaded_ok = None
    if folder is not None:
        manifest = checkpoint.load(folder, module, opt, config, group=group)
        start, losses = manifest.step + 1, list(manifest.losses)
        loaded_ok = gathered_fingerprint(module, order, group) == manifest.weights_sha256
    dims = {d: mesh[d].get_group() for d in DIMS if getattr(layout, d) > 1}
    comms, meter, step_s = MeshComms(dims, device.type == "cuda"), StageMeter(), []
    memory, kept, before = held(module, opt), 0, 0  # as they stay if no step is left to run
    for step in range(start, config.steps):
        if step == config.kill_step and me == config.kill_rank and \
                os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            os.kill(os.getpid(), signal.SIGKILL)  # what a crashed node looks like to the others
        ids, targets = (t[shard * rows:(shard + 1) * rows].to(device).clone()  # its own rows
                        for t in task.batch(config.batch, config.seq, step))
        timed = step > start  # the first step warms up (and allocates); not timed
        comms_now = comms if timed else contextlib.nullcontext()
        opt.zero_grad()
        meter.reset_peak()
        before = max(meter.live.values(), default=0)  # still kept from an earlier step
        dist.barrier(group=group)
        _sync(device)
        begin = time.perf_counter()
        with comms_now:  # the optimizer's step too: replicated weights' gradients are summed
            with meter, context():
                if layout.pp == 1:
                    loss = F.cross_entropy(module(ids).flatten(0, 1), targets.flatten())
                    loss.backward()
                else:
                    parts: list[torch.Tensor] = []
                    schedule.step(*([ids] if stage == 0 else []),
                                  **({"target": targets, "losses": parts} if last else {}))
                    loss = (torch.stack([whole(p) for p in parts]).mean() if last
                            else torch.zeros((), device=device))
            memory = held(module, opt)
            opt.step()
        kept = max(meter.peak.values(), default=0) - before  # this step's own peak
        _sync(device)
        if timed:
            step_s.append(time.perf_counter() - begin)
        total = whole(loss).detach().reshape(1).to(torch.float64) * last
        dist.all_reduce(total, group=group)  # the last stage's dp x tp ranks: their shards' means
        losses.append(total.item() / (layout.dp * layout.tp))
        if config.checkpoint_dir and (step in save_at if save_at else True):
            checkpoint.save(config.checkpoint_dir, step, module, opt, config, losses, group,
                            gathered_fingerprint(module, order, group))
    ref = reference_run(config, device)
    diff, compared = _compare_weights(module, ref.weights, group,
                                      coords["dp"] == coords["tp"] == 0)
    sha = gathered_fingerprint(module, order, group)
    memory.optimizer_state = held(module, opt).optimizer_state  # AdamW's state, after a step
    memory.activations = kept
    timed = max(len(step_s), 1)
    record = RankRecord(me, coords, memory, predicted_memory(config, stage), before,
                        {d: comms.sent[d] / timed for d in comms.sent},
                        predicted_sent(config, stage),
                        {d: comms.seconds[d] / timed for d in comms.seconds}, step_s)
    gathered: list = [None] * len(ranks)
    dist.all_gather_object(gathered, record, group=group)
    return LayoutRun(layout.pp, layout.dp, layout.tp, config.dtype, config.lr, losses,
                     ref.losses, diff, ref.grad_scale, compared, len(ref.weights), sha,
                     gathered, start - 1 if start else None,
                     int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), loaded_ok)
