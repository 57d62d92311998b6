"""What each rank did, and when: the stage actions of a ``torch.distributed.pipelining`` step.

``record_actions`` wraps, on this process's stage objects, the three methods every
schedule calls to compute: ``forward_one_chunk`` (F), ``backward_one_chunk`` (B, or I
when a zero-bubble schedule asks for the input gradient only) and
``backward_weight_one_chunk`` (W), and the schedules' wait for sends and receives to complete
(``_wait_batch_p2p``, a private function: ``validate_instrumentable`` fails loudly if a torch
upgrade removes it). Times come from ``time.monotonic_ns``, one clock for all processes
of a machine, so ranks' events line up; on a GPU each compute action ends with a
synchronize, so its time is the GPU's, not the launch's. A wait is not synchronized: with
NCCL, ``Work.wait`` makes the GPU's stream wait, not the host, so on a GPU the time a rank
waits shows up inside its next compute action.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed.pipelining.schedules as schedules_module

COMPUTE = ("F", "B", "I", "W")
STAGE_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


@dataclass(frozen=True)
class Action:
    """One action of one rank: kind (F, B, I, W or wait), stage, micro-batch, times in ns."""

    rank: int
    kind: str
    stage: int
    microbatch: int
    start_ns: int
    end_ns: int
    live_bytes: int = 0  # activation bytes held for backward right after the action

    def as_dict(self) -> dict:
        return asdict(self)


def validate_instrumentable(stage: object | None = None) -> None:
    """Raise if the pipelining internals that lesson 04 wraps are gone: those of
    ``record_actions``, and ``_batch_p2p``, where its transfers are counted."""
    missing = [f"torch.distributed.pipelining.schedules.{name}"
               for name in ("_wait_batch_p2p", "_batch_p2p")
               if not callable(getattr(schedules_module, name, None))]
    if stage is not None:
        missing += [m for m in STAGE_METHODS if not callable(getattr(stage, m, None))]
    if missing:
        raise RuntimeError(f"torch.distributed.pipelining changed: {missing} not found; "
                           "helpers.pipeline.events must be updated for this torch version")


@contextlib.contextmanager
def record_actions(rank: int, stages: Sequence[object], meter: object | None = None,
                   clock=time.monotonic_ns) -> Iterator[list[Action]]:
    """Record every compute action of ``stages`` and every communication wait, into the list.

    ``meter`` (a ``helpers.memory.SavedTensorMeter``) adds the live activation bytes
    after each action.
    """
    for stage in stages:
        validate_instrumentable(stage)
    out: list[Action] = []

    def live() -> int:
        return sum(meter.live.values()) if meter is not None else 0

    def wrap(stage: object, name: str):
        original = getattr(stage, name)
        index = stage.stage_index
        on_cuda = torch.device(stage.device).type == "cuda"

        def timed(chunk: int, *args, **kwargs):
            start = clock()
            result = original(chunk, *args, **kwargs)
            if on_cuda:  # kernels run asynchronously: the action ends when the GPU is done
                torch.cuda.synchronize(stage.device)
            full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
            kind = {"forward_one_chunk": "F", "backward_weight_one_chunk": "W"}.get(
                name, "B" if full else "I")
            out.append(Action(rank, kind, index, chunk, start, clock(), live()))
            return result

        setattr(stage, name, timed)
        return original

    originals = [(s, n, wrap(s, n)) for s in stages for n in STAGE_METHODS]
    waiting = schedules_module._wait_batch_p2p

    def timed_wait(*args, **kwargs):
        start = clock()
        result = waiting(*args, **kwargs)
        out.append(Action(rank, "wait", -1, -1, start, clock(), live()))
        return result

    schedules_module._wait_batch_p2p = timed_wait
    try:
        yield out
    finally:
        schedules_module._wait_batch_p2p = waiting
        for stage, name, original in originals:
            setattr(stage, name, original)


def idle_fractions(actions: Sequence[Action | dict], ranks: int, start_ns: int,
                   end_ns: int) -> list[float]:
    """Per rank: 1 - (time spent computing) / (step time), from the recorded actions."""
    if end_ns <= start_ns:
        raise ValueError(f"step from {start_ns} to {end_ns} ns: valid: end after start")
    busy = [0] * ranks
    for a in actions:
        a = a if isinstance(a, dict) else a.as_dict()
        if a["kind"] in COMPUTE:
            busy[a["rank"]] += min(a["end_ns"], end_ns) - max(a["start_ns"], start_ns)
    return [1 - b / (end_ns - start_ns) for b in busy]


def bubble_theory(schedule: str, stages: int, microbatches: int, chunks: int = 1) -> float:
    """Idle fraction of an ideal pipeline (equal stage costs, free communication).

    GPipe and 1F1B: (K-1)/(M+K-1) (Huang et al. 2019). Interleaved 1F1B with v chunks per
    rank: (K-1)/(v*M+K-1) (Narayanan et al. 2021). Zero bubble (ZB-H1, Qi et al. 2024):
    idle (K-1)(F+B-W) against M(F+B+W) of work, with F = B = W: (K-1)/(3*v*M+K-1).
    """
    k, m, v = stages, microbatches, chunks
    formulas = {
        "gpipe": (k - 1) / (m + k - 1),
        "1f1b": (k - 1) / (m + k - 1),
        "interleaved_1f1b": (k - 1) / (v * m + k - 1),
        "zero_bubble": (k - 1) / (3 * v * m + k - 1),
    }
    if schedule not in formulas:
        raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(formulas)}")
    return formulas[schedule]
