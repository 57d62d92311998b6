"""The expert-parallel launch: an ``EPLayerConfig`` in, as flags (``--help``).

``torchrun --standalone --nproc-per-node=2 -m helpers.runs.expert_parallel.worker --ep 2
--experts 4 --top-k 2 --hidden 64 --ffn 128 --tokens 64 --seed 0``: the world size is
``ep``; rank 0 prints one JSON line (an ``EPLayerResult``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from helpers.core.flags import flag, option
from helpers.expert_parallel.moe import MoEShape
from helpers.runs.contract import RunConfig

DEVICES = ("auto", "cpu", "cuda")


def block_elements(sent: int, ep: int) -> int:
    """float64 elements per block of an even all-to-all in which each of ``ep`` ranks sends
    about ``sent`` bytes to the others (at least one)."""
    return max(1, sent // (max(ep - 1, 1) * 8))


def _text(sizes: object) -> str:
    """Sizes as their flag's text (``4096,65536``); anything else as Python writes it."""
    if isinstance(sizes, tuple):
        return ",".join(map(str, sizes)) or "''"
    return repr(sizes)


@dataclass(frozen=True)
class EPLayerConfig(RunConfig):
    """One MoE layer, its experts split over ep ranks, proven against one process."""

    WORKER: ClassVar[str] = "helpers.runs.expert_parallel.worker"

    ep: int | None = option(None, "expert-parallel ranks; the world size must equal it "
                            "(none: the world size)")
    experts: int = option(4, "experts in the layer; ep must divide it")
    top_k: int = option(2, "experts each token goes to")
    hidden: int = option(64, "model width (features per token)")
    ffn: int = option(128, "each expert's inner size (SwiGLU)")
    tokens: int = option(64, "tokens per rank; the global batch is ep x tokens")
    seed: int = option(0, "seed of the layer's weights, its input and output gradient")
    capacity_factor: float | None = option(
        None, "an expert takes at most ceil(factor x ep x tokens x top-k / experts) of "
        "the global batch's (token, expert) assignments, the rest dropped (none: no limit)")
    shared: bool = option(False, "add a shared expert that every token goes through")
    aux_weight: float = option(0.01, "weight of the load-balancing loss in the loss")
    repeats: int = option(3, "timed forward+backward passes per rank after the proof")
    warmup: int = option(1, "untimed passes before the timed ones, and untimed calls before "
                         "each timed all-to-all (the fit's sizes, the dispatch, the combine)")
    a2a_sizes: tuple[int, ...] = option(
        (2**12, 2**16, 2**18, 2**20), "bytes each rank sends to the other ranks in one "
        "all-to-all of the alpha-beta fit (even splits, float64 blocks), comma-separated; at "
        "least two different sizes")
    a2a_repeats: int = option(20, "timed calls per size of the fit, and of the layer's "
                              "dispatch and combine all-to-alls (a barrier before each)")
    device: Literal["auto", "cpu", "cuda"] = option(
        "auto", "cpu (gloo), cuda (NCCL, one GPU per rank), or auto")

    def ranks(self) -> int:
        return self.ep if self.ep is not None else super().ranks()

    def shape(self) -> MoEShape:
        """The layer's sizes."""
        return MoEShape(self.hidden, self.ffn, self.experts, self.top_k, self.shared,
                        self.capacity_factor)

    def validate(self, world_size: int) -> EPLayerConfig:
        """Raise ValueError naming the first bad value and what would be valid."""
        super().validate(world_size)
        if self.device not in DEVICES:
            raise ValueError(f"--device {self.device!r}; valid choices: {', '.join(DEVICES)}")
        for name, least in (("experts", 1), ("hidden", 1), ("ffn", 1), ("tokens", 1),
                            ("repeats", 1), ("warmup", 0), ("seed", 0), ("a2a_repeats", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{flag(name)} {value!r}; valid: an integer >= {least}")
        if self.ep is not None and (isinstance(self.ep, bool) or not isinstance(self.ep, int)
                                    or self.ep < 1):
            raise ValueError(f"--ep {self.ep!r}; valid: an integer >= 1 (the world size), "
                             "or none")
        if self.ep is not None and self.ep != world_size:
            raise ValueError(f"--ep {self.ep} but the world size is {world_size}; valid: "
                             f"--ep {world_size}, or torchrun --nproc-per-node={self.ep}")
        if self.experts % world_size:
            valid = [n for n in range(1, self.experts + 1) if self.experts % n == 0]
            raise ValueError(f"--experts {self.experts} is not divisible by ep={world_size}; "
                             f"valid ep: {valid} (or --experts a multiple of {world_size})")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) \
                or not 1 <= self.top_k <= self.experts:
            raise ValueError(f"--top-k {self.top_k!r}; valid: an integer from 1 to "
                             f"--experts {self.experts}")
        sizes = self.a2a_sizes
        if not isinstance(sizes, tuple) or any(isinstance(b, bool) or not isinstance(b, int)
                                               or b < 1 for b in sizes) \
                or len(set(sizes)) < 2:
            raise ValueError(f"--a2a-sizes {_text(sizes)}; valid: two or more different "
                             "sizes in bytes, each an integer >= 1, e.g. 4096,65536,1048576")
        if world_size > 1 and len({block_elements(b, world_size) for b in sizes}) < 2:
            raise ValueError(f"--a2a-sizes {_text(sizes)} all send {8 * (world_size - 1)} B "
                             f"per rank on {world_size} ranks (whole float64 elements, one "
                             "per block at least); valid: two or more sizes that differ by "
                             f"at least {8 * (world_size - 1)} B, e.g. 4096,65536,1048576")
        factor = self.capacity_factor
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                   or not factor > 0 or not math.isfinite(factor)):
            raise ValueError(f"--capacity-factor {factor!r}; valid: a number > 0, or none "
                             "for no limit (nothing dropped)")
        weight = self.aux_weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                or not weight >= 0 or not math.isfinite(weight):
            raise ValueError(f"--aux-weight {weight!r}; valid: a number >= 0")
        return self
