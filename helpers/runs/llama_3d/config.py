"""What lesson 13's launches run: one layout (``TrainerConfig``), or every layout at once
(``SuiteConfig``); both share the model, the batch and the run (``ModelRun``). The model
is the small Llama, or with ``--experts E`` its mixture of experts, whose experts are
split over the data-parallel ranks (ep = dp)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import torch

from helpers.composed.checkpoint import check, latest
from helpers.composed.experts import layout_name, moe_shape
from helpers.composed.layout import Layout
from helpers.core.flags import option
from helpers.core.paths import results_path
from helpers.expert_parallel.moe import MoEShape
from helpers.models.llama import LMConfig
from helpers.profiles import Profile, llama
from helpers.runs.contract import Record, RunConfig

DTYPES = {"float32": torch.float32, "float64": torch.float64}
DEVICES = ("auto", "cpu", "cuda")
THREE_D, TWO_D = Layout(pp=2, dp=2, tp=2), Layout(dp=2, tp=2)
WITH_CP = Layout(pp=2, tp=2, cp=2)  # context parallelism in the mesh: cp x tp x pp
# the suite's dense layouts (dp x tp alone is dp x tp x pp without its pipeline: the
# checkpoint round trip still runs it)
LAYOUTS = (Layout(), Layout(dp=2), Layout(tp=2), Layout(pp=2), THREE_D, WITH_CP)
WITH_EP = Layout(pp=2, dp=2, tp=2)  # the MoE model's: its experts over dp, ep x tp x pp
SMALL_LLAMA = llama(64, 64, 4, ffn=128, heads=4, kv_heads=2)  # the small profile's
M = TypeVar("M", bound="ModelRun")


@dataclass(frozen=True)
class ModelRun(Record):
    """The model, the batch and the run: what every layout of a comparison shares."""

    model: LMConfig = option(SMALL_LLAMA, "the small Llama's shape")
    seq: int = option(16, "tokens per sequence")
    batch: int = option(8, "sequences per step, over all data-parallel ranks")
    microbatches: int = option(2, "micro-batches per data-parallel rank and step (1F1B "
                               "needs at least one per pipeline stage)")
    steps: int = option(3, "AdamW steps")
    seed: int = option(0, "seed of the weights and of the Markov chain's batches")
    lr: float = option(1e-2, "AdamW's learning rate")
    dtype: Literal["float32", "float64"] = option(
        "float32", "the weights', activations' and optimizer state's dtype")
    device: Literal["auto", "cpu", "cuda"] = option(
        "auto", "cuda (NCCL, one GPU per rank), cpu (gloo), auto: cuda if there are enough")
    experts: int = option(0, "0: the dense small Llama; E: every block's MLP a mixture of E "
                          "experts (lesson 11), split over the dp ranks (ep = dp)")
    top_k: int = option(2, "experts each token goes to (with --experts), each ffn / top-k "
                        "wide: a token does the dense MLP's work")

    @classmethod
    def for_profile(cls: type[M], profile: Profile, **changes: Any) -> M:
        """The sizes of ``profile.composed`` (``helpers.profiles``)."""
        c = profile.composed
        return cls(**{**dict(model=c.model, seq=c.seq, batch=c.batch,
                             microbatches=c.microbatches, steps=c.steps), **changes})

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def moe(self) -> MoEShape | None:
        """Each block's MoE layer (None: the dense model)."""
        return moe_shape(self.model, self.experts, self.top_k)

    def shared(self) -> dict:
        """The fields of :class:`ModelRun`, by name."""
        return {f.name: getattr(self, f.name) for f in fields(ModelRun)}

    def _check_run(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype}; valid choices: {', '.join(DTYPES)}")
        if self.device not in DEVICES:
            raise ValueError(f"--device {self.device}; valid choices: {', '.join(DEVICES)}")
        if self.steps < 1:
            raise ValueError(f"--steps {self.steps}; valid: an integer >= 1")
        for name, value in (("--experts", self.experts), ("--top-k", self.top_k)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} {value!r}; valid: an integer >= 0")
        if self.experts and (not 1 <= self.top_k <= self.experts or self.model.ffn % self.top_k):
            valid = [k for k in range(1, self.experts + 1) if self.model.ffn % k == 0]
            raise ValueError(f"--top-k {self.top_k}; valid: {valid} (at most --experts "
                             f"{self.experts}, dividing ffn={self.model.ffn})")


@dataclass(frozen=True)
class TrainerConfig(ModelRun, RunConfig):
    """One layout's training, against the one-process run
    (``torchrun --nproc-per-node=pp*dp*cp*tp -m helpers.runs.llama_3d.worker``)."""

    WORKER: ClassVar[str] = "helpers.runs.llama_3d.worker"

    dp: int = option(1, "data-parallel (fully sharded) ranks")
    tp: int = option(1, "tensor- and sequence-parallel ranks")
    pp: int = option(1, "pipeline stages (1F1B)")
    cp: int = option(1, "context-parallel ranks (the zig-zag ring attention of lesson 10; "
                     "fully_shard then runs over dp x cp)")
    reference: bool = option(False, "also print the one-process run's losses")
    checkpoint_dir: str = option("", "save a checkpoint here after every step (none when "
                                 "empty)")
    resume: bool = option(False, "start after the newest checkpoint in --checkpoint-dir, "
                          "whatever layout saved it")
    kill_rank: int = option(-1, "on the first attempt, this rank SIGKILLs itself ...")
    kill_step: int = option(-1, "... as this step starts (-1: nobody is killed)")

    @property
    def layout(self) -> Layout:
        return Layout(self.pp, self.dp, self.tp, self.cp)

    @property
    def name(self) -> str:
        """The layout's name ("ep=2 x tp=2 x pp=2" when the dp ranks hold experts)."""
        return layout_name(self.layout, self.experts)

    def ranks(self) -> int:
        """One rank per mesh position: pp x dp x cp x tp."""
        return self.layout.world_size

    def validate(self, world_size: int) -> TrainerConfig:
        """Refuse a bad layout, model or batch before any launch (see ``Layout.validate``)."""
        super().validate(world_size)
        self._check_run()
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume without --checkpoint-dir; valid: --checkpoint-dir DIR "
                             "--resume (DIR holding checkpoints of the same model)")
        if (self.kill_rank >= 0) != (self.kill_step >= 0):
            raise ValueError(f"--kill-rank {self.kill_rank} --kill-step {self.kill_step}; valid: "
                             "both set (a rank and a step) or neither")
        if self.kill_rank >= self.layout.world_size or self.kill_step >= self.steps:
            raise ValueError(f"--kill-rank {self.kill_rank} --kill-step {self.kill_step}; valid: "
                             f"a rank below {self.layout.world_size} and a step below "
                             f"{self.steps}")
        if self.kill_step >= 0 and not (self.checkpoint_dir and self.resume):
            raise ValueError("--kill-step without --checkpoint-dir DIR --resume: the restarted "
                             "ranks would start again from step 0; valid: add both")
        self.layout.validate(self.model, batch=self.batch, microbatches=self.microbatches,
                             world_size=world_size, seq=self.seq)
        if self.experts:
            self._check_experts()
        return self

    def _check_experts(self) -> None:
        """The MoE model's refusals: its experts over dp, no cp, no checkpoints."""
        ep = self.dp
        if ep < 2:
            raise ValueError(f"--experts {self.experts} with --dp {ep}: the experts are split "
                             "over the data-parallel ranks (ep = dp); valid: --dp 2 or more")
        if self.experts % ep:
            valid = [n for n in range(1, self.experts + 1) if self.experts % n == 0 and n > 1]
            raise ValueError(f"--experts {self.experts} is not divisible by ep = --dp {ep}; "
                             f"valid --dp: {valid} (or --experts a multiple of {ep})")
        if self.cp > 1:
            raise ValueError(f"--experts {self.experts} with --cp {self.cp}; valid: --cp 1 (the "
                             "MoE model is not composed with context parallelism here)")
        if self.checkpoint_dir:
            raise ValueError(f"--experts {self.experts} with --checkpoint-dir; valid: no "
                             "checkpoint (the MoE model's are not covered here), or --experts 0")

    def before_launch(self, world_size: int) -> None:
        """A checkpoint it would resume from is checked first: another model's is refused
        here, before any process starts; then the GPUs."""
        if self.resume and (folder := latest(self.checkpoint_dir)) is not None:
            check(folder, self)
        super().before_launch(world_size)


@dataclass(frozen=True)
class SuiteConfig(ModelRun, RunConfig):
    """Every layout of the lesson in one launch of 8 ranks, the MoE model's among them,
    then the checkpoint round trip (float64 by default: the proof's)."""

    WORKER: ClassVar[str] = "helpers.runs.llama_3d.suite"

    steps: int = option(4, "AdamW steps of every layout")
    dtype: Literal["float32", "float64"] = option(
        "float64", "the weights', activations' and optimizer state's dtype")
    experts: int = option(4, "experts of the MoE layout's model (the other layouts' model is "
                          "dense); 0: no MoE layout")
    checkpoint_dir: str = option("", "where the checkpoints go (empty: "
                                 "results/checkpoints/suite)")
    save_step: int = option(0, "the 3-D run's checkpoint is taken after this step; the "
                            "2-D run saves after the next one")

    def trainer(self, layout: Layout, *, moe: bool = False, **change: Any) -> TrainerConfig:
        """The config of one layout's run: the dense model's, or with ``moe`` the MoE
        model's (``experts``, ``top_k``)."""
        shared = {**self.shared(), "experts": self.experts if moe else 0}
        return replace(TrainerConfig(pp=layout.pp, dp=layout.dp, tp=layout.tp, cp=layout.cp,
                                     **shared), **change)

    def configs(self) -> list[TrainerConfig]:
        """Every layout's run of the suite, in order: the dense layouts, then the MoE one."""
        return ([self.trainer(layout) for layout in LAYOUTS]
                + ([self.trainer(WITH_EP, moe=True)] if self.experts else []))

    def ranks(self) -> int:
        """The 3-D layout's: 8."""
        return THREE_D.world_size

    def validate(self, world_size: int) -> SuiteConfig:
        """Every layout's refusals (``TrainerConfig.validate``), and 8 ranks."""
        super().validate(world_size)
        self._check_run()
        if world_size != THREE_D.world_size:
            raise ValueError(f"{world_size} ranks; valid: {THREE_D.world_size} (the 3-D "
                             "layout's)")
        if not 0 <= self.save_step < self.steps - 2:
            raise ValueError(f"save_step={self.save_step}; valid: 0 .. {self.steps - 3} (two "
                             "more steps must follow it)")
        for config in self.configs():
            config.validate(config.layout.world_size)
        return self

    @property
    def root(self) -> Path:
        """Where the checkpoints go (an absolute path: the ranks may start elsewhere)."""
        return Path(self.checkpoint_dir or results_path("checkpoints/suite")).resolve()

    def folder(self, layout: Layout) -> str:
        return str(self.root / f"pp{layout.pp}_dp{layout.dp}_cp{layout.cp}_tp{layout.tp}")
