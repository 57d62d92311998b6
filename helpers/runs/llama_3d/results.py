"""The 3-D run's typed results, what the shapes predict, and every verdict.

Tolerances, named once, both in units of the run's floating-point epsilon (float32's
or float64's): the layouts compute the same products and add them in another order (a
micro-batch's mean, then the mean over micro-batches and data-parallel shards; the
vocabulary's softmax in slices), and each reordering costs an epsilon or two.

- ``EPSILONS`` (4) epsilons of a step's loss: how far its loss may be from the one
  process's. A wrong gradient (half of it, say) moves the next loss by far more.
- The final weights: AdamW moves a weight by ``lr * m / (sqrt(v) + eps_adam)``. Where a
  gradient is near zero that quotient's slope is ``1 / eps_adam`` (1e8), so a rounding
  difference in a gradient (``EPSILONS`` epsilons of the largest gradient, G) can move
  the weight by ``lr * EPSILONS * eps * G / eps_adam`` per step. In float64 that bound is
  tight; in float32 it exceeds all the run's updates together (``steps * lr``): float32
  runs agree on their losses, but under AdamW their weights can only be compared loosely.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from helpers.composed.layout import Layout
from helpers.memory.ledger import KINDS, DeviceMemory
from helpers.runs.contract import Record
from helpers.runs.llama_3d.config import SuiteConfig

EPSILONS = 4
ACTIVATION_TOLERANCE = 0.01  # see ``ledger``: index tensors and the like, a few hundred bytes
ADAM_EPS = 1e-8  # torch.optim.AdamW's default
DIMS = ("dp", "tp", "pp")


@dataclass
class RankRecord(Record):
    """One rank of one layout: where it sits, what it held, sent and spent."""

    rank: int
    coords: dict[str, int]  # its index along pp, dp, tp
    measured: DeviceMemory  # activations: the peak of the last step, over what it began with
    predicted: DeviceMemory
    held_over: int  # saved-for-backward bytes still alive as the last step began
    sent: dict[str, float]  # bytes per step, per mesh dimension
    predicted_sent: dict[str, float]
    comm_s: dict[str, float]  # seconds in communication per timed step, per mesh dimension
    step_s: list[float]  # each timed step (the first step, the warm-up, is left out)

    @property
    def stage(self) -> int:
        """Its pipeline stage."""
        return self.coords["pp"]

    @property
    def first_of_stage(self) -> bool:
        """The stage's rank at dp = tp = 0 (its stage's ranks hold the same sizes)."""
        return self.coords["dp"] == self.coords["tp"] == 0

    @property
    def state_ok(self) -> bool:
        """Weights, gradients and optimizer state: measured = predicted, to the byte."""
        return all(getattr(self.measured, k) == getattr(self.predicted, k) for k in KINDS[:3])

    @property
    def activation_error(self) -> float:
        """(measured - predicted) / predicted activations."""
        return (self.measured.activations - self.predicted.activations) / self.predicted.activations

    @property
    def sent_ok(self) -> bool:
        """Bytes sent per mesh dimension: counted = predicted (``ledger.predicted_sent``)."""
        return self.sent == self.predicted_sent

    @property
    def ledger_ok(self) -> bool:
        return self.state_ok and abs(self.activation_error) <= ACTIVATION_TOLERANCE


@dataclass
class LayoutRun(Record):
    """One layout trained for ``steps`` steps, against the one-process run."""

    pp: int
    dp: int
    tp: int
    dtype: str
    lr: float
    losses: list[float]
    reference: list[float]
    weight_diff: float  # the largest |w - w_ref| over every parameter, after the last step
    grad_scale: float  # the largest |gradient| element of the one-process run, any step
    weights_compared: int  # parameters compared (each once), to be the model's count
    parameters: int
    weights_sha256: str  # the final weights' fingerprint (``digest``), whatever the layout
    ranks: list[RankRecord] = field(default_factory=list)
    resumed_from: int | None = None  # the checkpoint's step, when it started from one
    attempt: int = 0  # torchrun's restart count when this run finished
    loaded_ok: bool | None = None  # the loaded weights' fingerprint = the checkpoint's

    @property
    def layout(self) -> Layout:
        return Layout(self.pp, self.dp, self.tp)

    @property
    def loss_diffs(self) -> list[float]:
        return [abs(a - b) for a, b in zip(self.losses, self.reference, strict=True)]

    @property
    def eps(self) -> float:
        return torch.finfo(getattr(torch, self.dtype)).eps

    @property
    def loss_tolerances(self) -> list[float]:
        return [EPSILONS * self.eps * abs(b) for b in self.reference]

    @property
    def losses_ok(self) -> bool:
        return all(d <= t for d, t in zip(self.loss_diffs, self.loss_tolerances, strict=True))

    @property
    def weight_tolerance(self) -> float:
        steps = len(self.losses)
        return steps * self.lr * EPSILONS * self.eps * self.grad_scale / ADAM_EPS

    @property
    def weights_ok(self) -> bool:
        return (self.weight_diff <= self.weight_tolerance
                and self.weights_compared == self.parameters)

    @property
    def ok(self) -> bool:
        return self.losses_ok and self.weights_ok and self.loaded_ok is not False

    def stage_ranks(self) -> list[RankRecord]:
        """One rank per pipeline stage (the others of a stage hold the same sizes)."""
        return [r for r in self.ranks if r.first_of_stage]

    def step_time(self, rank: int = 0) -> tuple[float, float]:
        """Mean and standard deviation of a rank's timed steps, seconds."""
        times = self.ranks[rank].step_s
        return statistics.mean(times), statistics.stdev(times) if len(times) > 1 else 0.0

    def report(self) -> str:
        worst = max(d / t for d, t in zip(self.loss_diffs, self.loss_tolerances, strict=True))
        return (f"{str(self.layout):18s} losses max |diff| {max(self.loss_diffs):.1e} "
                f"({worst:.2f} of the tolerance); weights {self.weight_diff:.1e} "
                f"(tolerance {self.weight_tolerance:.1e}, {self.weights_compared}/"
                f"{self.parameters} compared): {'equal' if self.ok else 'DIFFERENT'}")


@dataclass
class SuiteResult(Record):
    """Every layout's run, and the three runs of the checkpoint round trip."""

    config: SuiteConfig
    runs: list[LayoutRun]  # the 3-D one saved a checkpoint after ``save_step``
    two_d: LayoutRun  # dp x tp, resumed from the 3-D checkpoint, saving after the next step
    back: LayoutRun  # 3-D again, resumed from the 2-D checkpoint

    @property
    def ok(self) -> bool:
        return all(r.ok for r in [*self.runs, self.two_d, self.back])
