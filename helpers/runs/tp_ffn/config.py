"""Lesson 08's launches as typed configs: the tensor-parallel FFN and the 2-D mesh step.

``SourceFFN`` holds what both workers share: the source script's sizes, seed, device,
dtype and backend (``helpers.tp_demo``'s flags; ``--hidden-size`` here for its
``--hidden_size``). ``TPFFNConfig`` is ``helpers.runs.tp_ffn.worker``'s launch: the shard
files, the timing, and what else the same launch proves; ``MeshConfig`` is
``helpers.runs.tp_ffn.mesh_worker``'s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import torch

from helpers.core.devices import BACKEND_CHOICES, dtype_name, plan_devices, resolve_dtype
from helpers.core.flags import option
from helpers.core.paths import RESULTS_DIR
from helpers.profiles import FFNSizes, Profile
from helpers.runs.contract import Record, RunConfig
from helpers.tensor_parallel.ffn import ACTIVATIONS, FeedForward, make_input, validate_split

WORLD_SIZES = (1, 2, 4)  # lesson 08's world sizes, all in one launch
S = TypeVar("S", bound="SourceFFN")


@dataclass(frozen=True)
class SourceFFN:
    """The source's FFN, its input and where it runs; the defaults are the source's."""

    hidden_size: int = option(512, "model width: features per token")
    ffn_size: int = option(1024, "FFN inner width: fc1's output features, split over ranks")
    seq_len: int = option(512, "tokens per sequence")
    batch_size: int = option(8, "sequences per batch")
    device: str = option("cuda", "cpu (gloo), cuda (NCCL, one GPU per rank) or auto")
    dtype: Literal["float32", "float16", "bfloat16"] = option(
        "float16", "dtype of the weights, the input and the output")
    seed: int = option(1, "seed of the model (torch.manual_seed) and of the input")
    backend: Literal["auto", "gloo", "nccl"] = option(
        "auto", "process group backend; auto: NCCL with one GPU per rank, else gloo")

    @classmethod
    def for_profile(cls: type[S], profile: Profile, ranks: int = max(WORLD_SIZES),
                    **changes: Any) -> S:
        """The profile's FFN sizes on the device and dtype that ``ranks`` ranks can use.

        NCCL needs one GPU per rank: with fewer GPUs than ``ranks`` every run is on the
        CPU with gloo, which keeps the world sizes' comparison fair.
        """
        plan = plan_devices(ranks, processes=True)
        names = {f.name for f in fields(cls)}
        sizes = {k: v for k, v in asdict(profile.ffn).items() if k in names}
        return cls(**{**sizes, "device": plan.device_type, "dtype": dtype_name(plan.dtype),
                      **changes})

    def check_source(self) -> None:
        """A ValueError naming the first bad size, dtype or backend, and the valid ones."""
        for name in ("hidden_size", "seq_len", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}; valid: an integer >= 1")
        resolve_dtype(self.dtype)
        if self.backend not in BACKEND_CHOICES:
            raise ValueError(f"backend={self.backend!r}; valid choices: "
                             f"{', '.join(BACKEND_CHOICES)}")

    def model(self, activation: str = "none") -> FeedForward:
        """The source's model: ``torch.manual_seed(seed)``, then the FFN in float32 on the CPU."""
        torch.manual_seed(self.seed)
        return FeedForward(self.hidden_size, self.ffn_size, activation)

    def input_batch(self, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """The input (batch, seq, hidden), the same in every mode and on every rank."""
        return make_input(self.batch_size, self.seq_len, self.hidden_size, dtype=dtype,
                          device=device, seed=self.seed)


@dataclass(frozen=True)
class TPFFNConfig(SourceFFN, RunConfig):
    """The tensor-parallel FFN: each rank g(shard(f(x))) on its shard files, proven and timed."""

    WORKER: ClassVar[str] = "helpers.runs.tp_ffn.worker"
    shard_dir: str | None = option(
        None, "folder of the shard files; none: results/tp_shards/hidden{H}_ffn{F}_world{P}")
    iters: int = option(32, "forward passes per run, warm-up included")
    warmup: int = option(4, "first forward passes, not timed")
    train_step: bool = option(
        False, "also prove one float32 SGD step through f and g against the whole FFN's")
    activation: Literal["none", "gelu"] = option(
        "none", "activation between fc1 and fc2 in the training step")
    lr: float = option(0.1, "SGD learning rate of the training step")
    dtensor: bool = option(False, "also prove parallelize_module (DTensor) against the "
                           "hand-made shards, on every rank of the launch")
    wide: tuple[int, ...] = option(
        (), "also time and prove the forward at a wider FFN, a profile's FFNSizes: "
        "hidden,ffn,seq,batch,world,iters,warmup (world unused: every run's own ranks); "
        "empty: not")
    sweep: tuple[int, ...] = option(
        (), "world sizes run in this one launch, e.g. 1,2,4 (the largest: every rank): "
        "rank 0 runs native first, then each p on ranks 0..p-1; empty: one run on every rank")

    def ranks(self) -> int:
        """A sweep's largest world size; a single run needs ``nproc``."""
        return max(self.sweep) if self.sweep else super().ranks()

    def folder(self, world_size: int) -> Path:
        """Where the shard files for ``world_size`` ranks are written and read."""
        if self.shard_dir is not None:
            return Path(self.shard_dir)
        return (RESULTS_DIR / "tp_shards"
                / f"hidden{self.hidden_size}_ffn{self.ffn_size}_world{world_size}")

    @property
    def wide_sizes(self) -> FFNSizes | None:
        """``wide`` as the profile's sizes, None when not asked."""
        return FFNSizes(*self.wide) if self.wide else None

    def validate(self, world_size: int) -> TPFFNConfig:
        """Checks every option for ``world_size`` ranks (a sweep: each of its world sizes)."""
        super().validate(world_size)
        self.check_source()
        if self.warmup < 0 or self.iters <= self.warmup:
            raise ValueError(f"iters={self.iters}, warmup={self.warmup}; valid: 0 <= warmup "
                             "< iters (the first `warmup` iterations are not timed)")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r}; valid: {', '.join(ACTIVATIONS)}")
        if self.wide and (len(self.wide) != len(fields(FFNSizes)) or min(self.wide) < 1):
            raise ValueError(f"wide={self.wide}; valid: empty, or 7 integers >= 1: "
                             "hidden,ffn,seq,batch,world,iters,warmup")
        for p in self._world_sizes(world_size):
            validate_split(self.ffn_size, p)
            if self.wide:
                validate_split(self.wide_sizes.ffn_size, p)
        return self

    def _world_sizes(self, world_size: int) -> tuple[int, ...]:
        """The world sizes this launch runs, checked: the sweep's, or ``world_size``."""
        sizes = self.sweep
        if not sizes:
            return (world_size,)
        if len(set(sizes)) < len(sizes) or not all(isinstance(p, int) and p >= 1 for p in sizes):
            raise ValueError(f"sweep={list(sizes)}; valid: distinct integers >= 1, e.g. 1,2,4")
        if self.shard_dir is not None:
            raise ValueError(
                f"shard_dir={self.shard_dir!r} is one folder, but a sweep reads each world "
                "size's shards from its own (results/tp_shards/..._world{p}); valid: none")
        if max(sizes) != world_size:
            raise ValueError(f"sweep={list(sizes)} on {world_size} ranks; valid: the largest "
                             f"world size is every rank of the launch, nproc={max(sizes)}")
        return sizes

    def read_result(self, data: dict) -> Record:
        """A sweep's result, or one run's."""
        from helpers.runs.tp_ffn.results import SweepRun, TPRun

        return (SweepRun if self.sweep else TPRun).from_dict(data)


@dataclass(frozen=True)
class MeshConfig(SourceFFN, RunConfig):
    """One SGD step of the FFN on a (dp x tp) DeviceMesh, proven against one device.

    Tensor parallel in each row of the mesh, data parallel across rows; the reference is
    the whole FFN trained on the whole batch."""

    WORKER: ClassVar[str] = "helpers.runs.tp_ffn.mesh_worker"
    dp: int = option(2, "data-parallel groups, the mesh's first dimension (tp = ranks / dp)")
    lr: float = option(0.1, "SGD learning rate of the step")

    def validate(self, world_size: int) -> MeshConfig:
        """dp divides the ranks and the batch; fc1's width splits over tp."""
        super().validate(world_size)
        self.check_source()
        dp = self.dp
        if not isinstance(dp, int) or dp < 1 or world_size % dp or self.batch_size % dp:
            raise ValueError(f"dp={dp} must divide the world size {world_size} and the batch "
                             f"{self.batch_size}; valid: a common divisor")
        validate_split(self.ffn_size, world_size // dp)
        return self
