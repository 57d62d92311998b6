"""A learnable task made locally: sequences from a fixed random Markov chain.

Each token has ``branching`` likely successors (drawn once from ``seed``), so the next
token is far from uniform: a model that learns the transitions brings its loss from
about ln(vocab) down towards the chain's entropy, :meth:`MarkovTask.entropy`, within a few
dozen steps. Every batch is a function of the step number alone, so every layout of a
parallel run, and the one-process reference, sees the same tokens at every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class MarkovTask:
    """Token ``t`` is followed by one of ``branching`` successors, with fixed probabilities."""

    vocab: int
    seed: int = 0
    branching: int = 4
    transitions: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("vocab", "branching"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}; valid: an integer >= 1")
        if self.branching > self.vocab:
            raise ValueError(f"branching={self.branching} > vocab={self.vocab}; valid: "
                             f"1 .. {self.vocab}")
        g = torch.Generator().manual_seed(self.seed)
        successors = torch.stack([torch.randperm(self.vocab, generator=g)[:self.branching]
                                  for _ in range(self.vocab)])
        weights = torch.rand(self.vocab, self.branching, generator=g) + 0.5
        probs = torch.zeros(self.vocab, self.vocab)
        probs.scatter_(1, successors, weights / weights.sum(dim=1, keepdim=True))
        object.__setattr__(self, "transitions", probs)

    def batch(self, batch: int, seq: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, next-token targets), ``(batch, seq)`` int64 each, the same for every caller
        at the same ``step``."""
        if batch < 1 or seq < 1 or step < 0:
            raise ValueError(f"batch={batch}, seq={seq}, step={step}; valid: batch, seq >= 1 "
                             "and step >= 0")
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step + 1)
        tokens = torch.empty(batch, seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab, (batch,), generator=g)
        for t in range(seq):
            tokens[:, t + 1] = torch.multinomial(self.transitions[tokens[:, t]], 1,
                                                 generator=g).squeeze(1)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def entropy(self) -> float:
        """The chain's entropy per token (nats) under its stationary distribution: the
        lowest mean cross-entropy a next-token model can reach on long sequences."""
        p = self.transitions.double()
        stationary = torch.full((self.vocab,), 1.0 / self.vocab, dtype=torch.float64)
        for _ in range(1000):
            stationary = stationary @ p
        logs = torch.where(p > 0, p.log(), torch.zeros_like(p))
        return float(-(stationary[:, None] * p * logs).sum())

    def uniform_loss(self) -> float:
        """ln(vocab): the loss of a model that knows nothing."""
        return math.log(self.vocab)
