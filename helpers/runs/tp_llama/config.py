"""Lesson 09's launch: a ``LlamaTPConfig`` in, as flags (``--help`` describes each).

``torchrun --nproc-per-node=P -m helpers.runs.tp_llama.worker --model-vocab ...
--model-hidden ... --seq ... [--sequence-parallel]``: the world size is the
tensor-parallel size. The answer is a ``LlamaTPResult`` (``results``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from helpers.core.flags import option, require_ints
from helpers.models.attention import divisors
from helpers.models.llama import LMConfig
from helpers.profiles import Profile
from helpers.runs.contract import RunConfig
from helpers.tensor_parallel.attention_shards import check_head_split
from helpers.tensor_parallel.sequence import check_sequence_split

DEVICES = ("auto", "cpu", "cuda")
# the smoke profile's model: 250 tokens do not divide by 4, so the 4-rank split pads them
SMOKE_MODEL = LMConfig(vocab=250, hidden=64, blocks=2, ffn=192, heads=8, kv_heads=4, rope=True)


@dataclass(frozen=True)
class LlamaTPConfig(RunConfig):
    """One training step of the small Llama, tensor-parallel, proven against one process."""

    WORKER: ClassVar[str] = "helpers.runs.tp_llama.worker"

    model: LMConfig = option(SMOKE_MODEL, "the small Llama (grouped-query attention, RoPE)")
    seq: int = option(16, "tokens per sequence")
    batch: int = option(2, "sequences per training step")
    seed: int = option(0, "seed of the weights and of the tokens")
    sequence_parallel: bool = option(False, "split the norms' tokens over the ranks too "
                                     "(reduce-scatter and all-gather instead of all-reduce)")
    both: bool = option(False, "run without and then with sequence parallelism (the lesson "
                        "does); overrides --sequence-parallel")
    native: bool = option(False, "also prove parallelize_module + loss_parallel equal to the "
                          "hand split")
    time_steps: int = option(0, "timed training steps per setting after the proofs (0: none)")
    warmup: int = option(2, "untimed training steps before the timed ones")
    time_one_process: bool = option(False, "rank 0 also times the one-process model (tp = 1)")
    lr: float = option(0.1, "SGD learning rate of the step that is proven")
    device: Literal["auto", "cpu", "cuda"] = option(
        "auto", "cpu (gloo), cuda (NCCL, one GPU per rank), or auto")
    tp: int | None = option(None, "the tensor-parallel size; the world size must equal it "
                            "(none: the world size)")

    @classmethod
    def for_profile(cls, profile: Profile, **changes: object) -> LlamaTPConfig:
        """The lesson's launch for a profile: its ``transformer_tp`` sizes, then ``changes``."""
        x = profile.transformer_tp
        return cls(**{"model": x.model, "seq": x.seq, "batch": x.batch,
                      "time_steps": x.time_steps, "warmup": profile.warmup, **changes})

    @property
    def modes(self) -> tuple[bool, ...]:
        """The sequence-parallel settings the launch runs, in order."""
        return (False, True) if self.both else (self.sequence_parallel,)

    def ranks(self) -> int:
        """``tp`` when it is given."""
        return self.tp if self.tp is not None else super().ranks()

    def validate(self, world_size: int) -> LlamaTPConfig:
        """Raise ValueError naming the first bad value and what would be valid."""
        super().validate(world_size)
        require_ints(self, {"seq": 1, "batch": 1, "seed": 0, "time_steps": 0, "warmup": 0})
        if self.device not in DEVICES:
            raise ValueError(f"--device {self.device!r}; valid choices: {', '.join(DEVICES)}")
        if self.tp is not None and self.tp != world_size:
            raise ValueError(f"--tp {self.tp} but the world size is {world_size}; valid: "
                             f"--tp {world_size}, or torchrun --nproc-per-node={self.tp}")
        m = self.model  # LMConfig itself checks hidden, heads and kv_heads
        if m.rope and (m.hidden // m.heads) % 2:
            raise ValueError(f"head dim {m.hidden // m.heads} (hidden {m.hidden} / heads "
                             f"{m.heads}) is odd; RoPE turns channel pairs: valid heads: "
                             f"{[h for h in divisors(m.hidden) if (m.hidden // h) % 2 == 0]}")
        check_head_split(m.heads, m.kv, world_size, m.ffn)
        if m.ffn % world_size:
            raise ValueError(f"--model-ffn {m.ffn} is not divisible by {world_size} ranks; "
                             f"valid world sizes for ffn={m.ffn}: {divisors(m.ffn)}")
        if self.sequence_parallel or self.both:
            check_sequence_split(self.seq, world_size)
        return self
