"""Prove before measuring: one training step of two models, compared.

The reference runs on one device, the candidate is split across devices. From
identical weights and inputs, both take one SGD step; we compare the outputs, the
loss, every gradient and every updated weight (parameters matched in order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class StepResult:
    """What one training step produced, copied to the CPU."""

    output: torch.Tensor
    loss: float
    grads: list[tuple[str, torch.Tensor]]
    weights: list[tuple[str, torch.Tensor]]


Named = list[tuple[str, torch.Tensor]]


def snapshot(model: nn.Module) -> tuple[Named, Named]:
    """(gradients, weights) of every parameter, by name, copied to the CPU."""
    params = list(model.named_parameters())
    grads = [
        (
            n,
            p.grad.detach().cpu().clone()
            if p.grad is not None
            else torch.zeros_like(p, device="cpu"),
        )
        for n, p in params
    ]
    return grads, [(n, p.detach().cpu().clone()) for n, p in params]


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest element-wise |a - b|, computed in float64 (shapes must match)."""
    if a.shape != b.shape:
        raise ValueError(
            f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}; compare like with like"
        )
    if a.numel() == 0:
        return 0.0
    return (a.detach().double().cpu() - b.detach().double().cpu()).abs().max().item()


def training_step(
    model: nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    lr: float = 0.01,
    optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
) -> StepResult:
    """Forward in training mode, backward, one optimizer step (SGD at ``lr`` unless
    ``optimizer`` builds another from the parameters); labels go to the output's device."""
    loss_fn = loss_fn or nn.MSELoss()
    model.train(True)  # a *training* step: BatchNorm uses the batch's statistics
    params = list(model.parameters())
    optimizer = optimizer(params) if optimizer else torch.optim.SGD(params, lr=lr)
    optimizer.zero_grad()
    output = model(inputs)
    loss = loss_fn(output, labels.to(output.device))
    loss.backward()
    grads, _ = snapshot(model)
    optimizer.step()
    _, weights = snapshot(model)
    return StepResult(output.detach().cpu(), loss.item(), grads, weights)


def _max_diff(
    a: list[tuple[str, torch.Tensor]], b: list[tuple[str, torch.Tensor]]
) -> tuple[float, str]:
    if len(a) != len(b):
        raise ValueError(f"the models have {len(a)} and {len(b)} parameters; they must match")
    worst, where = 0.0, ""
    for (name_a, ta), (name_b, tb) in zip(a, b, strict=True):
        if ta.shape != tb.shape:
            raise ValueError(f"parameter {name_a} {tuple(ta.shape)} != {name_b} {tuple(tb.shape)}")
        d = max_abs_diff(ta, tb)
        if d > worst or not where:
            worst, where = d, name_b
    return worst, where


@dataclass(frozen=True)
class StepComparison:
    """Largest absolute differences between two training steps."""

    output: float
    loss: float
    grads: float
    weights: float
    worst_grad: str
    worst_weight: str

    def rows(self) -> list[tuple[str, float]]:
        return [
            ("outputs", self.output),
            ("loss", self.loss),
            ("gradients", self.grads),
            ("updated weights", self.weights),
        ]

    def report(self, atol: float) -> str:
        """A table of the differences, each marked OK or FAILED against ``atol``.

        Every difference is written the same way, zero or not: which of the two a run
        gives can depend on the thread count, and the table must read alike on any machine.
        """
        lines = []
        for what, diff in self.rows():
            verdict = "OK" if diff <= atol else "FAILED"
            lines.append(f"{what:<16} max |diff| ≈ {diff:.1e}  {verdict} (tolerance {atol:g})")
        return "\n".join(lines)

    def proofs(self, atol: float, prefix: str = "") -> list[Proof]:
        """Each row as a ``Proof`` against ``atol`` (``prefix`` names the run)."""
        return [Proof(f"{prefix}{what}", diff, atol) for what, diff in self.rows()]

    def check(self, atol: float) -> str:
        """The report; raises AssertionError naming what differs (and where) beyond ``atol``."""
        text = self.report(atol)
        where = {"gradients": self.worst_grad, "updated weights": self.worst_weight}
        bad = [
            f"{what} (worst: {where[what]})" if what in where else what
            for what, diff in self.rows()
            if diff > atol
        ]
        if bad:
            raise AssertionError(f"differs beyond tolerance {atol:g}: {', '.join(bad)}\n{text}")
        return text


@dataclass(frozen=True)
class Proof:
    """One quantity of a parallel run against its one-device reference, and its verdict.

    ``tolerance`` is decided where the proof is made (the worker or the lesson's helper),
    from a named rule; ``ok`` is the only place the verdict is taken.
    """

    what: str
    max_diff: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_diff <= self.tolerance

    def line(self, width: int = 12) -> str:
        """``what  max |diff| ≈ ...  tolerance ≈ ...  OK``"""
        return (
            f"{self.what:<{width}} max |diff| ≈ {self.max_diff:.1e}  "
            f"tolerance ≈ {self.tolerance:.1e}  {'OK' if self.ok else 'FAILED'}"
        )

    def as_dict(self) -> dict:
        return {"what": self.what, "max_diff": self.max_diff, "tolerance": self.tolerance}

    @classmethod
    def from_dict(cls, data: dict) -> Proof:
        return cls(data["what"], data["max_diff"], data["tolerance"])


def compare_steps(reference: StepResult, candidate: StepResult) -> StepComparison:
    """Compare two training steps' results."""
    grads, worst_grad = _max_diff(reference.grads, candidate.grads)
    weights, worst_weight = _max_diff(reference.weights, candidate.weights)
    return StepComparison(
        output=max_abs_diff(reference.output, candidate.output),
        loss=abs(reference.loss - candidate.loss),
        grads=grads,
        weights=weights,
        worst_grad=worst_grad,
        worst_weight=worst_weight,
    )


def compare_training_step(
    reference: nn.Module,
    candidate: nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    **step_kwargs,
) -> StepComparison:
    """One training step of each model on the same batch, compared."""
    return compare_steps(
        training_step(reference, inputs, labels, **step_kwargs),
        training_step(candidate, inputs, labels, **step_kwargs),
    )


@dataclass(frozen=True)
class Verdict:
    """Many proofs of one claim, read as one line: the rigor stays, one click down.

    ``line()`` is what a lesson shows in view, e.g. ``✓ ZeRO-1, -2 and -3 take DDP's step
    (12 checks; worst 9.4e-06, allowed 1.0e-04)``; ``table()`` lists every proof for a
    folded cell. The worst proof is the one nearest its own tolerance.
    """

    claim: str
    proofs: tuple[Proof, ...]

    def __init__(self, claim: str, proofs: Iterable[Proof]) -> None:
        object.__setattr__(self, "claim", claim)
        object.__setattr__(self, "proofs", tuple(proofs))
        if not self.proofs:
            raise ValueError(f"the verdict {claim!r} has no proofs: pass at least one Proof")

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.proofs)

    @property
    def failed(self) -> tuple[Proof, ...]:
        return tuple(p for p in self.proofs if not p.ok)

    @property
    def worst(self) -> Proof:
        """The proof nearest (or furthest beyond) its tolerance."""

        def share(p: Proof) -> float:
            if p.tolerance > 0:
                return p.max_diff / p.tolerance
            return 0.0 if p.max_diff == 0 else float("inf")

        return max(self.proofs, key=share)

    def line(self) -> str:
        """One line: the mark, the claim, how many checks, the worst against its allowance."""
        n = len(self.proofs)
        checks = f"{n} check{'s' if n > 1 else ''}"
        if not self.ok:
            bad = self.failed[0]
            return (f"✗ {self.claim} ({len(self.failed)} of {checks} failed; {bad.what}: "
                    f"{bad.max_diff:.1e} > {bad.tolerance:.1e} allowed)")
        if all(p.max_diff == 0 for p in self.proofs):
            return f"✓ {self.claim} ({checks}, all exact)"
        w = self.worst
        return f"✓ {self.claim} ({checks}; worst {w.max_diff:.1e}, allowed {w.tolerance:.1e})"

    def table(self) -> str:
        """Every proof, one line each (for a folded cell)."""
        width = max(len(p.what) for p in self.proofs) + 1
        return "\n".join(p.line(width) for p in self.proofs)

    def check(self) -> str:
        """``line()``; raises AssertionError with the table when a proof fails."""
        if not self.ok:
            raise AssertionError(f"{self.line()}\n{self.table()}")
        return self.line()

    def __str__(self) -> str:
        return self.line()
