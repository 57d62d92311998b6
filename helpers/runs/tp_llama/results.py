"""Lesson 09's typed result: what the worker measured, what shapes predict, every verdict.

Tolerances. Logits, loss and gradients: ``RELATIVE_TOLERANCE`` (2^-16, 128 float32
epsilons; chosen) times the largest |value| of the quantity in the one-process step. The
split computes the same float32 products and adds them in another order (the ranks'
partial sums, the softmax's sums per slice), a few epsilons per operation through a few
layers; a missing or misplaced shard is off by the values' own size. Weights: each
tensor against its own bound, derived from the gradients' (:func:`weight_tolerances`):
an SGD step ``w - lr g`` can differ by ``lr`` times the gradients' difference plus the
rounding of the two operations, so a tensor whose update went wrong fails however small
its update is.

Bytes: the calls a rank issued, counted per collective, and their bytes summed per
collective (the meter prices each call by the ring formula and by gloo's algorithms) must
be the plan's (:func:`planned_calls`), and what its sockets sent must lie within gloo's
prediction, payload plus headers (``helpers.runs.tp_ffn.wire.WireCheck``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import torch
from torch import nn

from helpers.comm.collectives import gloo_bytes, ring_bytes
from helpers.core.checks import Proof, Verdict
from helpers.memory.transformer import TransformerShape
from helpers.runs.contract import Record
from helpers.runs.tp_ffn.wire import WireCheck
from helpers.runs.tp_llama.config import LlamaTPConfig
from helpers.tensor_parallel.vocab import padded_vocab

RELATIVE_TOLERANCE = 2.0**-16
QUANTITIES = ("logits", "loss", "gradients", "weights")
FLOAT32 = 4
EPS = torch.finfo(torch.float32).eps  # 2^-23: a float32 rounding moves x by at most EPS |x| / 2


def parts_of(model: nn.Module) -> dict[str, nn.Module]:
    """The parts a ledger row is charged to: the embedding, each block, final norm, head."""
    blocks = {f"block {k}": block for k, block in enumerate(model.blocks)}
    return {"embed": model.embed, **blocks, "norm": model.norm, "head": model.head}


def planned_calls(config: LlamaTPConfig, sequence_parallel: bool) -> dict[str, list[int]]:
    """The collectives one rank issues in a training step, each as the bytes of its full
    tensor, by collective: the plan, from the shapes alone.

    The residual stream is ``batch x seq x hidden`` float32 values. Without sequence
    parallelism it is all-reduced 4 times per block (g twice forward, f twice backward),
    once after the embedding and once behind the head (f's backward). With it, each of
    those becomes a reduce-scatter and an all-gather of the same tensor, one in each pass
    (f's backward all-reduce a reduce-scatter, plus an all-gather forward; g's forward
    all-reduce a reduce-scatter, plus an all-gather backward), and the norms' gradients
    are all-reduced once. The loss adds 3 all-reduces of one float32 per token.
    """
    tokens = config.batch * config.seq
    stream = tokens * config.model.hidden * FLOAT32
    times = 4 * config.model.blocks + 2
    loss = [tokens * FLOAT32] * 3
    if not sequence_parallel:
        return {"all_reduce": [stream] * times + loss}
    norms = (2 * config.model.blocks + 1) * config.model.hidden * FLOAT32
    return {"all_gather": [stream] * times, "all_reduce": loss + [norms],
            "reduce_scatter": [stream] * times}


def priced(calls: dict[str, list[int]], tp: int, price) -> dict[str, float]:
    """Each collective's calls priced by ``price(collective, tp, nbytes)``, summed."""
    return {c: float(sum(price(c, tp, s) for s in sizes)) for c, sizes in calls.items()}


def predicted_sent(config: LlamaTPConfig, tp: int, sequence_parallel: bool) -> dict[str, float]:
    """Bytes one rank sends in a training step, per collective, by the ring formula (what
    NCCL's ring would send), from the plan."""
    return priced(planned_calls(config, sequence_parallel), tp, ring_bytes)


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


def weight_tolerances(grads: dict[str, torch.Tensor], weights: dict[str, torch.Tensor],
                      lr: float, grad_tolerance: float) -> dict[str, float]:
    """Each updated weight tensor's bound, derived to first order in eps: ``w' = fl(w -
    fl(lr g))`` on both sides, from the same ``w`` and gradients that differ by at most
    ``grad_tolerance`` (the gradients' proof), can differ by ``lr * grad_tolerance``, plus
    the two sides' roundings of the product and of the difference, each at most eps/2 of
    the value: ``eps * lr * |g|`` and ``eps * |w'|`` in all."""
    return {n: lr * grad_tolerance + EPS * (weights[n].abs().max().item()
                                            + lr * grads[n].abs().max().item())
            for n in weights}


def proofs(diffs: dict[str, float], scale: dict[str, float], weight_diffs: dict[str, float],
           tolerances: dict[str, float]) -> list[Proof]:
    """Logits, loss and gradients against ``RELATIVE_TOLERANCE`` times their largest |value|
    in the one-process step (``scale``); the weights tensor by tensor against their own
    bounds (``tolerances``), shown by the tensor nearest its bound."""
    out = [Proof(q, diffs[q], RELATIVE_TOLERANCE * scale[q]) for q in QUANTITIES[:3]]
    worst = max(weight_diffs, key=lambda n: weight_diffs[n] / tolerances[n])
    return [*out, Proof("weights", weight_diffs[worst], tolerances[worst])]


@dataclass(frozen=True)
class Sharpness(Record):
    """The smallest whole update of any weight tensor in the one-process step, against that
    tensor's tolerance: a bug that left it un-updated would differ by ``update``."""

    tensor: str
    update: float
    tolerance: float

    @property
    def ok(self) -> bool:
        """Whether the weights' proof would catch a skipped update of every tensor."""
        return self.update > self.tolerance

    @classmethod
    def of(cls, updates: dict[str, float], tolerances: dict[str, float]) -> Sharpness:
        name = min(updates, key=lambda n: updates[n] / tolerances[n])
        return cls(name, updates[name], tolerances[name])


@dataclass(frozen=True)
class ModeRun(Record):
    """The hand split's step, without or with sequence parallelism (rank 0's view)."""

    sequence_parallel: bool
    proofs: list[Proof]  # against the one-process step (largest difference over ranks)
    native: list[Proof] | None  # parallelize_module against the hand split
    placements: dict[str, str] | None
    calls: dict[str, int]  # issued, counted at the dispatcher
    ring: dict[str, float]  # the ring formula (NCCL's ring) on the issued calls' sizes
    gloo: dict[str, float]  # gloo's algorithms on the issued calls' sizes
    planned: dict[str, list[int]]  # the plan: each call's full tensor, in bytes
    planned_ring: dict[str, float]
    planned_gloo: dict[str, float]
    wire: list[WireCheck]  # each rank's sockets over the step
    kept: dict[str, int]
    predicted_kept: dict[str, int]
    held: int
    predicted_held: int
    native_kept: dict[str, int] | None = None  # PyTorch's split, measured like ``kept``

    @classmethod
    def measured(cls, config: LlamaTPConfig, tp: int, sequence_parallel: bool, *,
                 proven: list[Proof], native: list[Proof] | None,
                 placements: dict[str, str] | None, calls: dict[str, int],
                 ring: dict[str, float], gloo: dict[str, float], wire: list[WireCheck],
                 kept: dict[str, int], held: int,
                 native_kept: dict[str, int] | None = None) -> ModeRun:
        """What a rank measured, beside its proofs and what the shapes predict."""
        plan = planned_calls(config, sequence_parallel)
        return cls(sequence_parallel, proven, native, placements, dict(calls),
                   {k: float(v) for k, v in ring.items()}, {k: float(v) for k, v in gloo.items()},
                   plan, priced(plan, tp, ring_bytes), priced(plan, tp, gloo_bytes), list(wire),
                   merge_head(kept), predicted_kept(config, tp, sequence_parallel),
                   held, predicted_held(config, tp), native_kept)

    @property
    def name(self) -> str:
        return "TP + SP" if self.sequence_parallel else "TP"

    @property
    def as_planned(self) -> bool:
        """The calls issued per collective, and their bytes summed per collective (priced
        by either formula), are the plan's."""
        counts = {c: len(sizes) for c, sizes in self.planned.items()}
        return (self.calls == counts and self.ring == self.planned_ring
                and self.gloo == self.planned_gloo)

    @property
    def ok(self) -> bool:
        checks = [p.ok for p in [*self.proofs, *(self.native or [])]]
        return (all(checks) and self.as_planned and all(w.ok for w in self.wire)
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
    sharpness: Sharpness | None = None  # how small a wrong weight update the proofs catch

    @property
    def predicted_one_process_kept(self) -> dict[str, int]:
        """What the estimator predicts the one-process model keeps, per part."""
        return predicted_kept(self.config, 1, False, split=False)

    @property
    def ok(self) -> bool:
        one = self.one_process_kept == self.predicted_one_process_kept
        sharp = self.sharpness is None or self.sharpness.ok
        return one and sharp and all(m.ok for m in self.modes)

    def mode(self, sequence_parallel: bool) -> ModeRun:
        """The run without or with sequence parallelism."""
        for m in self.modes:
            if m.sequence_parallel == sequence_parallel:
                return m
        raise ValueError(f"sequence_parallel={sequence_parallel} was not run; valid: "
                         f"{[m.sequence_parallel for m in self.modes]}")

    def verdict(self) -> Verdict:
        """Every mode's proofs against one process, as one claim (each named by its mode)."""
        return Verdict(f"tp={self.world_size}: each rank's step = one process's",
                       [replace(p, what=f"tp={self.world_size} {m.name} {p.what}")
                        for m in self.modes for p in m.proofs])

    def native_verdict(self) -> Verdict | None:
        """``parallelize_module`` against the hand split, every mode that ran it (or None)."""
        found = [replace(p, what=f"tp={self.world_size} {m.name} {p.what}")
                 for m in self.modes for p in m.native or []]
        return Verdict("parallelize_module + loss_parallel = the hand split", found) \
            if found else None

    def same_with_sequence_parallel(self) -> bool:
        """Whether TP + SP's proofs read TP's largest differences, number for number (on gloo
        a reduce-scatter is an all-reduce then a slice: the residual stream is summed as
        under TP)."""
        plain, sp = self.mode(False), self.mode(True)
        return [p.max_diff for p in plain.proofs] == [p.max_diff for p in sp.proofs]

    def verdicts(self) -> dict[str, bool]:
        """Each mode's verdict, and the launch's."""
        return {**{m.name: m.ok for m in self.modes}, "all": self.ok}
