"""How long a rank spends inside collectives: a clock around ``torch.distributed``'s calls.

Inside ``with CommClock() as clock:`` each collective function of ``torch.distributed``
is wrapped: the call runs, its completion is waited for, and the time is added up. That
is the transfer plus any wait for a slower rank to arrive; the rest of a step is
computation. (A ``TorchDispatchMode`` would see the collectives too, but it sends every
operator through Python, which slows the computation it is meant to leave alone.)
On the CPU (gloo) a collective has finished when it returns; on a GPU (NCCL) it has only
been queued, so ``synchronize=True`` waits for the device before and after each one.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.distributed as dist

TIMED = ("all_reduce", "all_gather_single", "all_gather_into_tensor", "reduce_scatter_single",
         "reduce_scatter_tensor", "all_gather", "reduce_scatter", "broadcast", "barrier")


class CommClock:
    """``clock.seconds`` spent in collectives inside the ``with``, over ``clock.calls`` calls."""

    def __init__(self, synchronize: bool = False) -> None:
        self.seconds, self.calls, self.synchronize = 0.0, 0, synchronize
        self._saved: dict[str, object] = {}

    def _timed(self, call):
        @functools.wraps(call)
        def timed(*args, **kwargs):
            if self.synchronize:
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = call(*args, **kwargs)
            if hasattr(out, "wait"):  # async_op=True: this clock waits for it
                out.wait()
            if self.synchronize:
                torch.cuda.synchronize()
            self.seconds += time.perf_counter() - start
            self.calls += 1
            return out
        return timed

    def __enter__(self) -> CommClock:
        self._saved = {name: getattr(dist, name) for name in TIMED if hasattr(dist, name)}
        for name, call in self._saved.items():
            setattr(dist, name, self._timed(call))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, call in self._saved.items():
            setattr(dist, name, call)
