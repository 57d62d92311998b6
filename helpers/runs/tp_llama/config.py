"""Lesson 09's contract with its torchrun worker: a ``LlamaTPConfig`` in, as flags.

``torchrun --nproc-per-node=P -m helpers.runs.tp_llama.worker --vocab ... --hidden
... --heads ... --kv-heads ... --ffn ... --layers ... --seq ... --batch ... --seed ...
[--sequence-parallel]``: the world size is the tensor-parallel size. The answer is a
``LlamaTPResult`` (``helpers.runs.tp_llama.results``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from helpers.core.flags import flags_of, parse
from helpers.profiles import Profile
from helpers.models.attention import divisors
from helpers.models.llama import LMConfig
from helpers.tensor_parallel.attention_shards import check_head_split
from helpers.tensor_parallel.sequence import check_sequence_split

WORKER = "helpers.runs.tp_llama.worker"
DEVICES = ("auto", "cpu", "cuda")
ALWAYS = ("vocab", "hidden", "heads", "kv_heads", "ffn", "layers", "seq", "batch", "seed")


@dataclass(frozen=True)
class LlamaTPConfig:
    """The model, the batch, and what the launch runs besides the proof."""

    vocab: int = 250
    hidden: int = 64
    heads: int = 8
    kv_heads: int = 4
    ffn: int = 192
    layers: int = 2
    seq: int = 16
    batch: int = 2
    seed: int = 0
    sequence_parallel: bool = False
    both: bool = False  # run without and with sequence parallelism (the lesson does)
    native: bool = False  # also prove parallelize_module equal to the hand split
    time_steps: int = 0  # timed training steps after the proof (0: none)
    warmup: int = 2
    time_one_process: bool = False  # rank 0 also times the one-process model (tp = 1)
    lr: float = 0.1
    device: str = "auto"  # "cpu" (gloo), "cuda" (NCCL, one GPU per rank), or "auto"
    tp: int | None = None  # if given, the world size must equal it

    @classmethod
    def for_profile(cls, profile: Profile, **changes: object) -> LlamaTPConfig:
        """The lesson's launch for a profile: its ``transformer_tp`` sizes, then ``changes``."""
        x = profile.transformer_tp
        return cls(vocab=x.vocab, hidden=x.hidden, heads=x.heads, kv_heads=x.kv_heads, ffn=x.ffn,
                   layers=x.layers, seq=x.seq, batch=x.batch, time_steps=x.time_steps,
                   warmup=profile.warmup, **changes)

    @property
    def lm(self) -> LMConfig:
        """The model: the course's small Llama with grouped-query attention and RoPE."""
        return LMConfig(vocab=self.vocab, hidden=self.hidden, blocks=self.layers, ffn=self.ffn,
                        heads=self.heads, kv_heads=self.kv_heads, rope=True)

    @property
    def modes(self) -> tuple[bool, ...]:
        """The sequence-parallel settings the launch runs, in order."""
        return (False, True) if self.both else (self.sequence_parallel,)

    def validate(self, world_size: int) -> LlamaTPConfig:
        """Raise ValueError naming the first bad value and what would be valid."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)
                                    or value < (0 if f.name in ("seed", "time_steps",
                                                                "warmup") else 1)):
                raise ValueError(f"--{f.name.replace('_', '-')} {value!r}; valid: an integer "
                                 f">= {0 if f.name in ('seed', 'time_steps', 'warmup') else 1}")
        if self.device not in DEVICES:
            raise ValueError(f"--device {self.device!r}; valid choices: {', '.join(DEVICES)}")
        if self.tp is not None and self.tp != world_size:
            raise ValueError(f"--tp {self.tp} but the world size is {world_size}; valid: "
                             f"--tp {world_size}, or torchrun --nproc-per-node={self.tp}")
        self.lm  # noqa: B018 - LMConfig checks hidden, heads and kv_heads
        if (self.hidden // self.heads) % 2:
            raise ValueError(f"head dim {self.hidden // self.heads} (hidden {self.hidden} / heads "
                             f"{self.heads}) is odd; RoPE turns channel pairs: valid heads: "
                             f"{[h for h in divisors(self.hidden) if (self.hidden // h) % 2 == 0]}")
        check_head_split(self.heads, self.kv_heads, world_size, self.ffn)
        if self.ffn % world_size:
            raise ValueError(f"--ffn {self.ffn} is not divisible by {world_size} ranks; valid "
                             f"world sizes for ffn={self.ffn}: {divisors(self.ffn)}")
        if self.sequence_parallel or self.both:
            check_sequence_split(self.seq, world_size)
        return self

    def args(self) -> list[str]:
        """The worker's command line: the model and batch always, the rest where it differs
        from the defaults."""
        return flags_of(self, always=ALWAYS)

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> LlamaTPConfig:
        """The inverse of :meth:`args`."""
        return parse(cls, f"torchrun --nproc-per-node=P -m {WORKER}", argv,
                     "One training step of the small Llama, tensor-parallel over the ranks, "
                     "proven against one process.")
