"""The source script's options in one place: ``DemoConfig`` and its command-line parser.

Every tensor-parallel entry point (``helpers.tp_demo``, the torchrun workers, the
lesson's launches) reads its sizes, seed, device and backend from a ``DemoConfig``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from helpers.core.devices import BACKEND_CHOICES, resolve_dtype
from helpers.core.paths import RESULTS_DIR
from helpers.core.profiles import Profile
from helpers.tensor_parallel.ffn import FeedForward, make_input, validate_split

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
        sizes = {
            "hidden_size": profile.hidden_size,
            "ffn_size": profile.ffn_size,
            "seq_len": profile.seq_len,
            "batch_size": profile.ffn_batch,
            "world_size": profile.world_size,
            "iters": profile.ffn_iters,
            "warmup": profile.ffn_warmup,
        }
        return cls(**{**sizes, **overrides})

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
        """These options as command-line arguments (for ``helpers.distributed.launcher``)."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value != f.default:
                out += [f"--{f.name}", str(value)]
        return out


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
