"""Pipeline parallelism: micro-batches flowing through K stages.

- ``MicroBatchPipeline``: the in-process version (as in PyTorch's original tutorial).
  Stage k works on micro-batch i while stage k+1 works on micro-batch i-1 *only* if the
  devices run asynchronously (GPUs); on a CPU the calls simply run one after another.
- ``accumulated_step``: the single-process reference a pipelined step must reproduce.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from helpers.core.checks import StepResult, snapshot
from helpers.model_parallel.stages import StagedModel

# A pipelined step against ``accumulated_step``: the same float32 products, summed in another
# order (the loss is a mean of micro-batch means), so a few units in the 7th digit are
# expected; 1e-5 is a chosen bound, not a derived one.
PROOF_TOLERANCE = 1e-5


def ideal_speedup(stages: int, microbatches: int) -> float:
    """GPipe's bubble model: K*M / (M + K - 1) for K equal stages and M micro-batches."""
    if stages < 1 or microbatches < 1:
        raise ValueError(f"stages={stages!r}, microbatches={microbatches!r}; valid: integers >= 1")
    return stages * microbatches / (microbatches + stages - 1)


def validate_microbatches(batch_size: int, microbatches: int) -> int:
    """The micro-batch size, or an error when ``microbatches`` does not divide the batch."""
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches={microbatches!r}; valid: an integer >= 1")
    if batch_size % microbatches:
        divisors = [d for d in range(1, batch_size + 1) if batch_size % d == 0]
        raise ValueError(
            f"microbatches={microbatches} does not divide the batch of {batch_size}; "
            f"valid: one of {divisors}"
        )
    return batch_size // microbatches


class MicroBatchPipeline(nn.Module):
    """Runs a ``StagedModel`` on micro-batches in a wavefront (fill, steady state, drain).

    At tick t, stage k processes micro-batch t - k. Later stages are issued first, so on
    GPUs their kernels are already queued while the earlier stage computes.
    """

    def __init__(self, staged: StagedModel, microbatches: int) -> None:
        super().__init__()
        self.staged = staged
        self.microbatches = microbatches

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = validate_microbatches(x.shape[0], self.microbatches)
        stages, devices = self.staged.stages, self.staged.devices
        k_count, m_count = len(stages), self.microbatches
        acts: list[list[torch.Tensor | None]] = [[None] * m_count for _ in range(k_count + 1)]
        acts[0] = list(x.split(size))
        for tick in range(m_count + k_count - 1):
            for k in reversed(range(k_count)):
                i = tick - k
                if 0 <= i < m_count:
                    acts[k + 1][i] = stages[k](acts[k][i].to(devices[k]))
        return torch.cat(acts[k_count])  # type: ignore[arg-type]


def accumulated_step(
    model: nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    microbatches: int,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    lr: float = 0.01,
) -> StepResult:
    """One SGD step with gradients accumulated over micro-batches, in one process.

    Mean of the micro-batch losses, so with equal micro-batches the gradient is that of
    the whole batch — except where a layer mixes samples (BatchNorm's batch statistics).
    """
    size = validate_microbatches(inputs.shape[0], microbatches)
    loss_fn = loss_fn or nn.MSELoss()
    model.train(True)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    optimizer.zero_grad()
    outputs, losses = [], []
    for x, y in zip(inputs.split(size), labels.split(size), strict=True):
        out = model(x)
        loss = loss_fn(out, y.to(out.device))
        (loss / microbatches).backward()
        outputs.append(out.detach().cpu())
        losses.append(loss.item())
    grads, _ = snapshot(model)
    optimizer.step()
    _, weights = snapshot(model)
    return StepResult(torch.cat(outputs), sum(losses) / len(losses), grads, weights)


def gpipe_timeline(stages: int, microbatches: int) -> str:
    """GPipe's schedule as text: all forwards (F), then all backwards (B); '..' is idle.

    Each forward or backward of one micro-batch on one stage counts as one tick here
    (in reality a backward costs about twice a forward; the idle share is the same).
    """
    ideal_speedup(stages, microbatches)  # validates the arguments
    ticks = 2 * (microbatches + stages - 1)
    rows = [" " * 9 + "".join(f"{t:>4}" for t in range(ticks))]
    for k in range(stages):
        cells = [".."] * ticks
        for i in range(microbatches):
            cells[k + i] = f"F{i}"
            cells[microbatches + stages - 1 + (stages - 1 - k) + i] = f"B{i}"
        rows.append(f"stage {k}: " + "".join(f"{c:>4}" for c in cells))
    busy = 2 * microbatches * stages
    rows.append(
        f"idle (the bubble): {1 - busy / (ticks * stages):.0%} of device time = "
        f"(K-1)/(M+K-1) with K={stages}, M={microbatches}"
    )
    return "\n".join(rows)
