"""Lesson 09's typed result: what the worker measured, what shapes predict, every verdict.

Tolerance: ``RELATIVE_TOLERANCE`` (2^-16, 128 float32 epsilons) times the largest
|value| of each quantity in the one-process step (logits, loss, gradients, weights).
The split computes the same float32 products and adds them in another order (the
ranks' partial sums, the softmax's sums per slice), a few epsilons per operation
through a few layers; a missing or misplaced shard is off by the values' own size.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from torch import nn

from helpers.comm.collectives import ring_bytes
from helpers.core.checks import Proof
from helpers.memory.transformer import TransformerShape
from helpers.runs.contract import Record
from helpers.runs.tp_llama.config import LlamaTPConfig
from helpers.tensor_parallel.vocab import padded_vocab

RELATIVE_TOLERANCE = 2.0**-16
QUANTITIES = ("logits", "loss", "gradients", "weights")
FLOAT32 = 4


def parts_of(model: nn.Module) -> dict[str, nn.Module]:
    """The parts a ledger row is charged to: the embedding, each block, final norm, head."""
    blocks = {f"block {k}": block for k, block in enumerate(model.blocks)}
    return {"embed": model.embed, **blocks, "norm": model.norm, "head": model.head}


def predicted_sent(config: LlamaTPConfig, tp: int, sequence_parallel: bool) -> dict[str, float]:
    """Bytes one rank sends in a training step, per collective, from the shapes alone.

    The residual stream is ``batch x seq x hidden`` float32 values. Without sequence
    parallelism it is all-reduced 4 times per block (g twice forward, f twice backward),
    once after the embedding and once behind the head (f's backward). With it, each of
    those becomes a reduce-scatter plus an all-gather, and the norms' gradients are
    all-reduced once. The loss adds 3 all-reduces of one float32 per token.
    """
    tokens = config.batch * config.seq
    stream = tokens * config.model.hidden * FLOAT32
    times = 4 * config.model.blocks + 2
    loss = 3 * ring_bytes("all_reduce", tp, tokens * FLOAT32)
    if not sequence_parallel:
        return {"all_reduce": times * ring_bytes("all_reduce", tp, stream) + loss}
    norms = (2 * config.model.blocks + 1) * config.model.hidden * FLOAT32
    return {"reduce_scatter": times * ring_bytes("reduce_scatter", tp, stream),
            "all_gather": times * ring_bytes("all_gather", tp, stream),
            "all_reduce": loss + ring_bytes("all_reduce", tp, norms)}


def predicted_kept(config: LlamaTPConfig, tp: int, sequence_parallel: bool, *,
                   split: bool = True) -> dict[str, int]:
    """Bytes kept for backward at the loss, per part, from ``TransformerShape`` (the
    estimator's formula): the hand split's (vocab-parallel embedding and loss, even at
    ``tp = 1``), or with ``split=False`` the one-process model's (``F.cross_entropy``)."""
    shape, tokens = TransformerShape.of(config.model), config.batch * config.seq
    block = shape.block_activation_bytes(tokens, FLOAT32, tp, sequence_parallel)
    return {"embed": shape.embed_activation_bytes(tokens, tp, split),
            **{f"block {k}": block for k in range(config.model.blocks)},
            "norm + head": shape.head_activation_bytes(tokens, FLOAT32, tp, sequence_parallel,
                                                       split)}


def predicted_held(config: LlamaTPConfig, tp: int) -> int:
    """Weights one rank holds: 1/tp of every split matrix, the norms whole, its rows of
    the vocabulary (padded to a multiple of tp) in the embedding and the head (one matrix
    when they are tied)."""
    m = config.model
    h, kv = m.hidden, m.kv * m.hidden // m.heads
    split = 2 * h * h + 2 * h * kv + 3 * h * m.ffn
    rows = padded_vocab(m.vocab, tp) // tp
    return m.blocks * (split // tp + 2 * h) + (1 if m.tied else 2) * rows * h + h


def merge_head(kept: dict[str, int]) -> dict[str, int]:
    """Kept bytes per part with the final norm's and the head's as one row, as predicted."""
    out = {k: v for k, v in kept.items() if k not in ("norm", "head")}
    out["norm + head"] = kept["norm"] + kept["head"]
    return out


@dataclass(frozen=True)
class StepTimes(Record):
    """Seconds per timed step, and of it inside collectives (per step)."""

    step_s: list[float]
    comm_s: list[float]

    @property
    def compute_s(self) -> list[float]:
        return [s - c for s, c in zip(self.step_s, self.comm_s, strict=True)]

    @staticmethod
    def mean_std(values: list[float]) -> tuple[float, float]:
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def proofs(diffs: dict[str, float], scale: dict[str, float]) -> list[Proof]:
    """One proof per quantity: its largest difference against ``RELATIVE_TOLERANCE`` times
    the quantity's largest |value| in the one-process step (``scale``)."""
    return [Proof(q, diffs[q], RELATIVE_TOLERANCE * scale[q]) for q in QUANTITIES]


@dataclass(frozen=True)
class ModeRun(Record):
    """The hand split's step, without or with sequence parallelism (rank 0's view)."""

    sequence_parallel: bool
    proofs: list[Proof]  # against the one-process step (largest difference over ranks)
    native: list[Proof] | None  # parallelize_module against the hand split
    placements: dict[str, str] | None
    sent: dict[str, float]
    predicted_sent: dict[str, float]
    calls: dict[str, int]
    kept: dict[str, int]
    predicted_kept: dict[str, int]
    held: int
    predicted_held: int

    @classmethod
    def measured(cls, config: LlamaTPConfig, tp: int, sequence_parallel: bool, *,
                 diffs: dict[str, float], scale: dict[str, float],
                 native: dict[str, float] | None, placements: dict[str, str] | None,
                 sent: dict[str, float], calls: dict[str, int], kept: dict[str, int],
                 held: int) -> ModeRun:
        """What a rank measured, beside its proofs and what the shapes predict."""
        return cls(sequence_parallel, proofs(diffs, scale),
                   None if native is None else proofs(native, scale), placements,
                   {k: float(v) for k, v in sent.items()},
                   predicted_sent(config, tp, sequence_parallel), dict(calls),
                   merge_head(kept), predicted_kept(config, tp, sequence_parallel),
                   held, predicted_held(config, tp))

    @property
    def name(self) -> str:
        return "TP + SP" if self.sequence_parallel else "TP"

    @property
    def ok(self) -> bool:
        checks = [p.ok for p in [*self.proofs, *(self.native or [])]]
        return (all(checks) and self.sent == self.predicted_sent
                and self.kept == self.predicted_kept and self.held == self.predicted_held)


@dataclass(frozen=True)
class LlamaTPResult(Record):
    """Everything a launch measured (rank 0's view; the proofs' maxima over all ranks)."""

    config: LlamaTPConfig
    world_size: int
    backend: str
    reason: str
    parameters: int
    one_process_kept: dict[str, int]  # per part, the final norm's and the head's as one
    modes: list[ModeRun]
    timing: dict[str, StepTimes] | None  # by "False", "True" (sequence parallel), "one process"
    threads: int = 1  # compute threads per rank (torchrun's OMP_NUM_THREADS)

    @property
    def predicted_one_process_kept(self) -> dict[str, int]:
        """What the estimator predicts the one-process model keeps, per part."""
        return predicted_kept(self.config, 1, False, split=False)

    @property
    def ok(self) -> bool:
        one = self.one_process_kept == self.predicted_one_process_kept
        return one and all(m.ok for m in self.modes)

    def mode(self, sequence_parallel: bool) -> ModeRun:
        """The run without or with sequence parallelism."""
        for m in self.modes:
            if m.sequence_parallel == sequence_parallel:
                return m
        raise ValueError(f"sequence_parallel={sequence_parallel} was not run; valid: "
                         f"{[m.sequence_parallel for m in self.modes]}")

    def verdicts(self) -> dict[str, bool]:
        """Each mode's verdict, and the launch's."""
        return {**{m.name: m.ok for m in self.modes}, "all": self.ok}
