"""The context-parallel launch: a ``CPAttentionConfig`` in, as flags (``--help``).

``torchrun --standalone --nproc-per-node=2 -m helpers.runs.context_parallel.worker
--variant ring --cp 2 --seq 64 --hidden 64 --heads 4 --kv-heads 2 --batch 2 --seed 0
--causal``: the world size is ``cp``; rank 0 prints one JSON line (a ``CPAttentionResult``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from helpers.context_parallel.split import positions
from helpers.context_parallel.traffic import VARIANTS, AttentionShape, validate_variant
from helpers.core.flags import option, require_ints
from helpers.runs.contract import RunConfig


@dataclass(frozen=True)
class CPAttentionConfig(RunConfig):
    """One attention layer, its sequence split over cp ranks, proven against one process."""

    WORKER: ClassVar[str] = "helpers.runs.context_parallel.worker"

    variant: str = option("ring", f"how the ranks share keys and values: {', '.join(VARIANTS)}")
    cp: int | None = option(None, "context-parallel ranks; the world size must equal it "
                            "(none: the world size)")
    seq: int = option(64, "tokens per sequence (the whole sequence, before the split)")
    hidden: int = option(64, "model width: heads x head dim")
    heads: int = option(4, "query heads")
    kv_heads: int = option(2, "key/value heads (grouped-query attention)")
    batch: int = option(2, "sequences")
    seed: int = option(0, "seed of the queries, keys, values and output gradient")
    causal: bool = option(False, "a causal mask (each token sees the tokens before it)")
    repeats: int = option(5, "timed forward+backward passes per rank after the proof")
    warmup: int = option(2, "untimed passes before the timed ones")
    device: Literal["auto", "cpu", "cuda"] = option(
        "auto", "cpu (gloo), cuda (NCCL, one GPU per rank), or auto")
    native: bool = option(False, "also run PyTorch's own context_parallel() on the same "
                          "layer and compare it with the hand version (or record why it fails)")

    def ranks(self) -> int:
        return self.cp if self.cp is not None else super().ranks()

    @property
    def split(self) -> str:
        """The token split the variant runs on: zig-zag for "zigzag", else contiguous."""
        return "zigzag" if self.variant == "zigzag" else "contiguous"

    def shape(self) -> AttentionShape:
        """The layer's sizes, float64 elements."""
        return AttentionShape(self.batch, self.seq, self.heads, self.kv_heads,
                              self.hidden // self.heads, element_bytes=8)

    def validate(self, world_size: int) -> CPAttentionConfig:
        """Raise ValueError naming the first bad value and what would be valid."""
        super().validate(world_size)
        validate_variant(self.variant)
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device {self.device!r}; valid choices: auto, cpu, cuda")
        require_ints(self, {"seq": 1, "hidden": 1, "heads": 1, "kv_heads": 1, "batch": 1,
                            "seed": 0, "repeats": 0, "warmup": 0})
        if self.cp is not None and self.cp != world_size:
            raise ValueError(f"--cp {self.cp} but the world size is {world_size}; valid: "
                             f"--cp {world_size}, or torchrun --nproc-per-node={self.cp}")
        if self.hidden % self.heads:
            raise ValueError(f"--hidden {self.hidden} is not divisible by --heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"--heads {self.heads} is not a multiple of --kv-heads "
                             f"{self.kv_heads}")
        positions(0, world_size, self.seq, self.split)  # refuses a seq the split cannot cut
        if self.variant == "ulysses" and (self.heads % world_size or self.kv_heads % world_size):
            raise ValueError(f"--variant ulysses needs --heads {self.heads} and --kv-heads "
                             f"{self.kv_heads} divisible by cp={world_size}; valid cp: "
                             f"{[c for c in range(1, self.kv_heads + 1) if self.kv_heads % c == 0 and self.heads % c == 0]}")
        return self
