"""Training the MoE small Llama three ways, to see the load balance move: no balancing,
the auxiliary loss, and DeepSeek-V3's bias update.

:func:`balance_run` trains :func:`~helpers.expert_parallel.llama.moe_llama` on one process,
on :class:`~helpers.composed.data.MarkovTask` batches, with AdamW, and records every step:

- the language-model loss (the cross-entropy, in nats per token, without the auxiliary
  term, so that the three modes are compared on what the model learns);
- the tokens each expert was chosen for, per block (counted before any capacity drop:
  they add up to ``tokens x top_k`` per block);
- each block's imbalance, the most chosen expert over the mean
  (:func:`~helpers.expert_parallel.balance.imbalance`).

Modes: ``"none"`` trains on the cross-entropy alone; ``"aux"`` adds ``aux_weight`` times
the blocks' Switch auxiliary losses; ``"bias"`` trains on the cross-entropy alone and,
after each step, moves every router's selection bias by ``bias_rate`` towards balance
from that step's counts (:func:`~helpers.expert_parallel.balance.update_bias`).
:func:`balance_chart` draws the runs side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from helpers.composed.data import MarkovTask
from helpers.core.drawing import RANK_COLOURS
from helpers.core.plotting import save_figure
from helpers.expert_parallel.balance import imbalance, update_bias
from helpers.expert_parallel.llama import aux_loss, moe_layers, moe_llama
from helpers.expert_parallel.moe import MoEShape
from helpers.models.llama import LMConfig

MODES = ("none", "aux", "bias")


@dataclass(frozen=True)
class BalanceRun:
    """What one run recorded, step by step."""

    mode: str
    losses: list[float]  # the language-model loss per step (nats/token), before the update
    counts: torch.Tensor  # (steps, blocks, experts) int64: tokens each expert was chosen for
    imbalances: torch.Tensor  # (steps, blocks) float64: max over mean of each block's counts
    tokens: int  # tokens per step (batch x seq)
    top_k: int

    @property
    def steps(self) -> int:
        return len(self.losses)

    def imbalance_per_step(self) -> list[float]:
        """Each step's imbalance, the mean over the blocks: every block's all-to-all waits
        for its own busiest expert, so the step's time follows the sum of the blocks'."""
        return self.imbalances.mean(dim=1).tolist()

    def final_imbalance(self, last: int = 5) -> float:
        """The mean of :meth:`imbalance_per_step` over the ``last`` steps."""
        if not 1 <= last <= self.steps:
            raise ValueError(f"last={last!r}; valid: 1 to steps={self.steps}")
        return sum(self.imbalance_per_step()[-last:]) / last


def _check(mode: str, steps: int, aux_weight: float, bias_rate: float) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; valid: {', '.join(map(repr, MODES))}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r}; valid: an integer >= 1")
    if aux_weight < 0 or bias_rate < 0:
        raise ValueError(f"aux_weight={aux_weight!r}, bias_rate={bias_rate!r}; valid: "
                         "numbers >= 0")


def balance_run(lm: LMConfig, shape: MoEShape, *, steps: int, mode: str, seed: int = 0,
                aux_weight: float = 0.1, bias_rate: float = 0.005, batch: int = 32,
                seq: int = 32, lr: float = 1e-2) -> BalanceRun:
    """Train the MoE small Llama of ``lm`` and ``shape`` for ``steps`` steps in ``mode``
    (``"none"``, ``"aux"`` or ``"bias"``); weights and batches drawn from ``seed``. It runs
    on one thread: the model is too small for a second to help, and on busy cores a second
    thread spends its time waiting.

    The defaults suit a few dozen steps of a small model: the papers' values (Switch:
    ``aux_weight`` 0.01; DeepSeek-V3: ``bias_rate`` 0.001, on sigmoid scores) act over
    thousands of steps, too slowly to be seen here."""
    _check(mode, steps, aux_weight, bias_rate)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(lm, shape, steps, mode, seed, aux_weight, bias_rate, batch, seq, lr)
    finally:
        torch.set_num_threads(threads)


def _train(lm: LMConfig, shape: MoEShape, steps: int, mode: str, seed: int, aux_weight: float,
           bias_rate: float, batch: int, seq: int, lr: float) -> BalanceRun:
    model = moe_llama(lm, shape, seed=seed).train()
    layers = moe_layers(model)
    task = MarkovTask(vocab=lm.vocab, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses, counts = [], []
    for step in range(steps):
        ids, targets = task.batch(batch, seq, step)
        logits = model(ids)
        lm_loss = F.cross_entropy(logits.reshape(-1, lm.vocab), targets.reshape(-1))
        loss = lm_loss + aux_weight * aux_loss(model) if mode == "aux" else lm_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        chosen = torch.stack([torch.bincount(layer.last_routing.experts.reshape(-1),
                                             minlength=shape.experts) for layer in layers])
        if mode == "bias":
            for layer, layer_counts in zip(layers, chosen, strict=True):
                update_bias(layer.router, layer_counts, bias_rate)
        losses.append(lm_loss.item())
        counts.append(chosen)
    stacked = torch.stack(counts)
    ratios = torch.tensor([[imbalance(c) for c in step] for step in stacked],
                          dtype=torch.float64)
    return BalanceRun(mode, losses, stacked, ratios, batch * seq, shape.top_k)


def balance_chart(runs: Sequence[BalanceRun], path: str | Path, title: str) -> Path:
    """Imbalance (left) and language-model loss (right) over the steps, one line per run;
    saved to ``path`` (PNG, at most 950 px wide), which is returned."""
    if not runs:
        raise ValueError("runs is empty; valid: one or more BalanceRun")
    if not title.strip():
        raise ValueError("a chart's title states its takeaway; got an empty title")
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.6, 3.2))
    for i, run in enumerate(runs):
        steps = range(1, run.steps + 1)
        colour = RANK_COLOURS[i % len(RANK_COLOURS)]
        left.plot(steps, run.imbalance_per_step(), color=colour, label=run.mode)
        right.plot(steps, run.losses, color=colour, label=run.mode)
    left.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="perfect balance")
    left.set_ylabel("imbalance (max / mean tokens per expert)", fontsize=8)
    right.set_ylabel("language-model loss (nats/token)", fontsize=8)
    for ax in (left, right):
        ax.set_xlabel("training step")
        ax.grid(True, alpha=0.4)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8,
               bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return save_figure(fig, path)
