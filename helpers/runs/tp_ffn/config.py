"""The source script's options in one place: ``DemoConfig`` and its command-line parser.

Every tensor-parallel entry point (``helpers.tp_demo``, the torchrun workers, the
lesson's launches) reads its sizes, seed, device and backend from a ``DemoConfig``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, astuple, dataclass, fields, replace
from pathlib import Path

import torch

from helpers.core.devices import BACKEND_CHOICES, resolve_dtype
from helpers.core.paths import RESULTS_DIR
from helpers.profiles import FFNSizes, Profile
from helpers.tensor_parallel.ffn import ACTIVATIONS, FeedForward, make_input, validate_split

MODES = ("auto", "native", "tp")


@dataclass(frozen=True)
class DemoConfig:
    """The command line's options; the defaults are the source's."""

    hidden_size: int = 512
    ffn_size: int = 1024
    seq_len: int = 512
    batch_size: int = 8
    world_size: int = 4
    device: str = "cuda"
    dtype: str = "float16"
    shard_dir: str | None = None
    iters: int = 32
    warmup: int = 4
    seed: int = 1
    mode: str = "auto"
    backend: str = "auto"

    @classmethod
    def from_profile(cls, profile: Profile, **overrides) -> DemoConfig:
        """The profile's FFN sizes (``hidden_size``, ``ffn_size``, ...), then ``overrides``."""
        return cls(**{**asdict(profile.ffn), **overrides})

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> DemoConfig:
        """The ``parser()`` options found in ``ns``; a worker's own extra flags are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names})

    def validate(self) -> DemoConfig:
        """Raise ValueError naming the first bad option and what would be valid."""
        for name in ("hidden_size", "seq_len", "batch_size"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"--{name} {value}; valid: an integer >= 1")
        validate_split(self.ffn_size, self.world_size)
        resolve_dtype(self.dtype)
        if self.mode not in MODES:
            raise ValueError(f"--mode {self.mode!r}; valid choices: {', '.join(MODES)}")
        if self.backend not in BACKEND_CHOICES:
            raise ValueError(
                f"--backend {self.backend!r}; valid choices: {', '.join(BACKEND_CHOICES)}"
            )
        if self.warmup < 0 or self.iters <= self.warmup:
            raise ValueError(
                f"--iters {self.iters} --warmup {self.warmup}; valid: 0 <= warmup < iters "
                "(the first `warmup` iterations are not timed)"
            )
        return self

    def folder(self, world_size: int | None = None) -> Path:
        """Where the shard files for ``world_size`` ranks are written and read."""
        if self.shard_dir is not None:
            return Path(self.shard_dir)
        p = self.world_size if world_size is None else world_size
        return RESULTS_DIR / "tp_shards" / f"hidden{self.hidden_size}_ffn{self.ffn_size}_world{p}"

    def input_batch(self, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """The input (batch, seq, hidden), the same in every mode and on every rank."""
        return make_input(
            self.batch_size,
            self.seq_len,
            self.hidden_size,
            dtype=dtype,
            device=device,
            seed=self.seed,
        )

    def args(self) -> list[str]:
        """These options as command-line arguments (for ``helpers.torchrun.launcher``)."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value != f.default:
                out += [f"--{f.name}", str(value)]
        return out


@dataclass(frozen=True)
class RunOptions:
    """What ``ffn_worker`` does beyond the source's forward, each in the same launch."""

    train_step: bool = False  # one SGD step through f and g, proven
    activation: str = "none"  # between fc1 and fc2 in that step
    lr: float = 0.1
    dtensor: bool = False  # parallelize_module on the same ranks, proven against the hand split
    wide: FFNSizes | None = None  # also time (and prove) the forward at these sizes

    def args(self) -> list[str]:
        out = ["--train_step"] if self.train_step else []
        out += ["--activation", self.activation, "--lr", str(self.lr)]
        out += ["--dtensor"] if self.dtensor else []
        if self.wide is not None:
            out += ["--wide", ",".join(str(v) for v in astuple(self.wide))]
        return out

    @classmethod
    def add_arguments(cls, ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """The options' flags, added to a worker's parser."""
        d = cls()
        ap.add_argument("--train_step", action="store_true", help="also prove one SGD step")
        ap.add_argument("--activation", default=d.activation, help="in the step: none or gelu")
        ap.add_argument("--lr", type=float, default=d.lr, help="SGD learning rate of the step")
        ap.add_argument("--dtensor", action="store_true", help="also prove parallelize_module")
        ap.add_argument("--wide", default=None, help="also time the forward at "
                        "hidden,ffn,seq,batch,world,iters,warmup")  # fmt: skip
        return ap

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> RunOptions:
        wide = None if ns.wide is None else FFNSizes(*(int(v) for v in ns.wide.split(",")))
        if ns.activation not in ACTIVATIONS:
            raise ValueError(f"--activation {ns.activation!r}; valid: {', '.join(ACTIVATIONS)}")
        return cls(ns.train_step, ns.activation, ns.lr, ns.dtensor, wide)


def sweep_world_sizes(config: DemoConfig, world_sizes: Sequence[int]) -> tuple[int, ...]:
    """The world sizes of one sweep launch (``ffn_worker --sweep``), checked.

    Distinct integers >= 1, each dividing ``ffn_size``; each world size reads its shards
    from its own folder, ``config.folder(p)``, so ``shard_dir`` (one folder) is refused.
    """
    sizes = tuple(world_sizes)
    if (
        not sizes
        or len(set(sizes)) < len(sizes)
        or not all(isinstance(p, int) and p >= 1 for p in sizes)
    ):
        raise ValueError(f"world sizes {list(sizes)}; valid: distinct integers >= 1, e.g. 1,2,4")
    if config.shard_dir is not None:
        raise ValueError(
            f"--shard_dir {config.shard_dir} is one folder, but a sweep reads each world "
            "size's shards from its own (results/tp_shards/..._world{p}); valid: no --shard_dir"
        )
    for p in sizes:
        replace(config, world_size=p).validate()
    return sizes


def build_model(config: DemoConfig, activation: str = "none") -> FeedForward:
    """The source's model: ``torch.manual_seed(seed)``, then the FFN in float32 on the CPU."""
    torch.manual_seed(config.seed)
    return FeedForward(config.hidden_size, config.ffn_size, activation)


def parser(prog: str = "python -m helpers.tp_demo") -> argparse.ArgumentParser:
    """The source's flags and defaults, plus the options this version adds."""
    d = DemoConfig()
    ap = argparse.ArgumentParser(prog=prog, description="The tensor-parallel FFN demo.")
    ap.add_argument("--hidden_size", default=d.hidden_size, type=int, help="model width")
    ap.add_argument("--ffn_size", default=d.ffn_size, type=int, help="FFN inner width")
    ap.add_argument("--seq_len", default=d.seq_len, type=int, help="tokens per sequence")
    ap.add_argument("--batch_size", default=d.batch_size, type=int, help="sequences per batch")
    ap.add_argument(
        "--world_size", default=d.world_size, type=int, help="ranks the shards are cut for"
    )
    ap.add_argument("--device", default=d.device, type=str, help="cpu, cuda or cuda:N")
    ap.add_argument("--dtype", default=d.dtype, help="float16 (the source's), float32 or bfloat16")
    ap.add_argument(
        "--shard_dir",
        default=None,
        help="folder of the shard files (default: results/tp_shards/hidden{H}_ffn{F}_world{P})",
    )
    ap.add_argument("--iters", default=d.iters, type=int, help="iterations, warm-up included")
    ap.add_argument("--warmup", default=d.warmup, type=int, help="first iterations, not timed")
    ap.add_argument("--seed", default=d.seed, type=int, help="seed of the model and the input")
    ap.add_argument(
        "--mode", default=d.mode, help="auto (tp under torchrun with WORLD_SIZE > 1), native, tp"
    )
    ap.add_argument("--backend", default=d.backend, help="auto, gloo or nccl (tp mode)")
    ap.add_argument("--json", default=None, help="also write the result as JSON to this file")
    return ap
