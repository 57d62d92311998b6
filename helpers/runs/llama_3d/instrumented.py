"""One layout trained by the taught loop (``helpers.composed.training.train_3d``) with the
lesson's instruments attached from outside, and its record against the one-process run.

:class:`Instruments` are the loop's hooks: they resume from a checkpoint and save one
after each step (``helpers.composed.checkpoint``, with the weights' fingerprint,
``digest``); around every step they meter the activations kept (``measure.StageMeter``)
and, after the first step (the warm-up), read the clock, count the calls each mesh
dimension issues and their bytes (``helpers.comm.meter.CommMeter``) and read the bytes
this rank's sockets carried (``helpers.comm.wire.WireMeter``, outside the clock: each
read lists the process's sockets); an optimizer pre-hook reads what the rank holds
between the backward and the update (``measure.held``); and on the first attempt of a
run that asks for it, one rank kills itself as a step starts. With a mixture of experts,
each step's routing (every MoE forward's rows per expert, and its load) is kept: the
predictions of the MoE layout's memory and all-to-all bytes start from it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from helpers.comm.meter import CommMeter
from helpers.comm.wire import WireMeter
from helpers.composed import checkpoint
from helpers.composed.experts import moe_layers, rank_routing
from helpers.composed.layout import DIMS as MESH_DIMS
from helpers.composed.ledger import predicted_memory, predicted_sent
from helpers.composed.training import CPU, Hooks, Trained, train_3d
from helpers.runs.llama_3d.config import TrainerConfig
from helpers.runs.llama_3d.digest import gathered_fingerprint, parameter_names
from helpers.runs.llama_3d.measure import StageMeter, held
from helpers.runs.llama_3d.reference import compare_weights, shared_reference
from helpers.runs.llama_3d.results import LayoutRun, RankRecord, Traffic
from helpers.torchrun.status import say

NCCL_WIRE = ("not read: NCCL's collectives go over NVLink, PCIe or InfiniBand, not this "
             "process's TCP sockets")


def attempt() -> int:
    """torchrun's restart count of this launch (0: the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Instruments(Hooks):
    """What lesson 13 measures of one layout's run, and its checkpoints.

    ``save_at``: the steps after which to save a checkpoint in ``config.checkpoint_dir``
    (default: every step, when it is set). ``resume_from``: a folder of checkpoints to
    start from (the one after ``resume_step``; default the newest), instead of
    ``config.checkpoint_dir`` under ``config.resume``. ``progress`` (e.g. "run 3 of 9")
    starts the lines rank 0 prints as the run goes.
    """

    def __init__(self, config: TrainerConfig, device: torch.device, *,
                 save_at: tuple[int, ...] = (), resume_from: str = "",
                 resume_step: int | None = None, progress: str = "") -> None:
        self.config, self.device, self.save_at = config, device, save_at
        self.progress = f"{progress}, " if progress else ""
        self.resume_from, self.resume_step = resume_from, resume_step
        self.order = parameter_names(config.model, config.moe)
        self.first, self.loaded_ok, self.step_s = 0, None, []
        self.kept = self.before = 0
        self.routing: list[list[list]] = []  # per step, per MoE layer: each forward's routing

    def start(self, state: Trained) -> int:
        """Resume from a checkpoint if there is one, then attach the meters."""
        self.state, config = state, self.config
        folder = checkpoint.latest(self.resume_from
                                   or (config.checkpoint_dir if config.resume else ""))
        if self.resume_from and self.resume_step is not None:
            folder = checkpoint.step_folder(self.resume_from, self.resume_step)
        if folder is not None:
            manifest = checkpoint.load(folder, state.module, state.optimizer, config,
                                       group=state.group)
            self.first, state.losses[:] = manifest.step + 1, manifest.losses
            self.loaded_ok = self.fingerprint() == manifest.weights_sha256
            again = f" (attempt {attempt()})" if attempt() else ""
            say(dist.get_rank(), f"{self.progress}resumed after {manifest.step + 1} of {config.steps} steps{again}")
        layout = config.layout  # "dp": fully_shard's ranks, dp x cp when cp > 1
        dims = {d: state.mesh[d].get_group() for d in ("pp", "cp", "tp")
                if getattr(layout, d) > 1}
        if layout.shards > 1 and layout.fsdp_group == "dp":
            dims["dp"] = state.shards.get_group()
        self.comms = CommMeter(dims, timed=True, synchronize=self.device.type == "cuda")
        self.comms.wire = contextlib.nullcontext()  # its reads would fall inside the clock
        self.wire = WireMeter()
        self.meter = StageMeter()
        self.memory = held(state.module, state.optimizer)  # as it stays if no step is left
        state.optimizer.register_step_pre_hook(self._held)
        return self.first

    def _held(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        """After the backward, before the update: the gradients are there."""
        self.memory = held(self.state.module, optimizer)

    def fingerprint(self) -> str:
        """The weights' fingerprint, whatever the layout (collective over the mesh)."""
        return gathered_fingerprint(self.state.module, self.order, self.state.group)

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """The kill switch, then the step timed, its bytes counted (after the first step,
        the warm-up) and the activations it keeps metered."""
        config = self.config
        if step == config.kill_step and dist.get_rank() == config.kill_rank and not attempt():
            os.kill(os.getpid(), signal.SIGKILL)  # what a crashed node looks like to the others
        say(dist.get_rank(), f"{self.progress}step {step + 1} of {config.steps}: {config.name}")
        timed = step > self.first  # the first step warms up (and allocates); not timed
        self.meter.reset_peak()
        self.before = max(self.meter.live.values(), default=0)  # kept from an earlier step
        dist.barrier(group=self.state.group)
        _sync(self.device)
        with self.wire if timed else contextlib.nullcontext():  # read outside the clock
            begin = time.perf_counter()
            # the optimizer's step is counted too: replicated weights' gradients are summed
            with (self.comms if timed else contextlib.nullcontext()), self.meter:
                yield
            self.kept = max(self.meter.peak.values(), default=0) - self.before  # its own peak
            _sync(self.device)
            if timed:
                self.step_s.append(time.perf_counter() - begin)
        layers = moe_layers(self.state.module)
        self.routing.append([layer.seen[:] for layer in layers])
        for layer in layers:
            layer.seen.clear()

    def per_step(self, tally: dict) -> dict[str, float]:
        """A tally of the timed steps, per step."""
        return {k: v / max(len(self.step_s), 1) for k, v in tally.items()}

    def traffic(self) -> Traffic:
        """What this rank sent per timed step: the calls, by formula, and on its sockets."""
        group, wire = self.comms.per_group, self.wire
        if self.device.type == "cuda":
            sent, note = None, NCCL_WIRE
        elif not wire.available:
            sent, note = None, f"not read: {wire.reason}"
        else:
            sent, note = wire.sent / max(len(self.step_s), 1), ""
        layout = self.config.layout
        return Traffic(self.per_step(group.calls), self.per_step(group.ring),
                       self.per_step(group.gloo),
                       self.per_step(self.comms.per_collective.calls), sent, note,
                       max(layout.shards, layout.tp))

    def end_step(self, step: int, state: Trained) -> None:
        """A checkpoint after the step, where the run asks for one."""
        config = self.config
        if config.checkpoint_dir and (step in self.save_at if self.save_at else True):
            checkpoint.save(config.checkpoint_dir, step, state.module, state.optimizer,
                            config, state.losses, state.group, self.fingerprint())

    def record(self) -> LayoutRun:
        """Collective over the mesh: every rank's record, against the one-process run."""
        config, state = self.config, self.state
        say(dist.get_rank(), f"{self.progress}comparing to one process")
        coords = {d: state.mesh.get_local_rank(d) for d in MESH_DIMS}
        ref = shared_reference(config, self.device, state.group)
        first = coords["dp"] == coords["cp"] == coords["tp"] == 0
        expert = coords["cp"] == coords["tp"] == 0  # an expert: the first of its holders
        diff, compared = compare_weights(
            state.module, ref.weights, state.group,
            lambda name: expert if ".mlp.experts." in name else first)
        sha = self.fingerprint()
        memory = self.memory
        memory.optimizer_state = held(state.module, state.optimizer).optimizer_state
        memory.activations = self.kept  # AdamW's state after a step; the last step's peak
        stage, routing = coords["pp"], self.rank_routing(coords)
        mine = RankRecord(dist.get_rank(), coords, memory,
                          predicted_memory(config, stage, routing), self.before,
                          self.traffic(), predicted_sent(config, stage, "ring", routing),
                          predicted_sent(config, stage, "gloo", routing),
                          self.per_step(self.comms.per_group.seconds), self.step_s)
        ranks: list = [None] * dist.get_world_size(state.group)
        dist.all_gather_object(ranks, mine, group=state.group)
        layout = config.layout
        return LayoutRun(layout.pp, layout.dp, layout.tp, config.dtype, config.lr, state.losses,
                         ref.losses, diff, ref.grad_scale, compared, len(ref.weights), sha,
                         ranks, self.first - 1 if self.first else None, attempt(),
                         self.loaded_ok, layout.cp, config.experts,
                         config.top_k if config.experts else 0)

    def rank_routing(self, coords: dict[str, int]):
        """Collective over the mesh (the MoE model's only): every rank's routing, gathered,
        as this rank's predictions need it (``experts.rank_routing``); None when dense."""
        config = self.config
        if config.moe is None:
            return None
        every: list = [None] * dist.get_world_size(self.state.group)
        dist.all_gather_object(every, (dist.get_rank(), coords, self.routing),
                               group=self.state.group)
        timed = list(range(1, len(self.routing)))  # the first step warms up, as timed above
        forwards = config.microbatches if config.layout.pp > 1 else 1
        return rank_routing({r: h for r, _, h in every}, {r: c for r, c, _ in every},
                            dist.get_rank(), timed, forwards)


def train_layout(config: TrainerConfig, ranks: list[int] | None = None, *,
                 device: torch.device = CPU, save_at: tuple[int, ...] = (),
                 resume_from: str = "", resume_step: int | None = None,
                 progress: str = "") -> LayoutRun | None:
    """Collective over the whole launch; the run on ``ranks`` (default: all), recorded
    on those ranks, None on the others (``Instruments`` says what the options do)."""
    instruments = Instruments(config, device, save_at=save_at, resume_from=resume_from,
                              resume_step=resume_step, progress=progress)
    state = train_3d(config, ranks, device=device, hooks=instruments)
    return None if state is None else instruments.record()
