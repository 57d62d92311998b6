"""The four collectives of data parallelism: what each computes, what a rank sends, how long.

In a ring of N ranks a tensor of S bytes is cut into N chunks. Reduce-scatter passes chunks
round the ring N - 1 times, adding as it goes: each rank ends with one chunk of the sum and
has sent (N - 1)/N x S. All-gather passes the finished chunks round N - 1 more times, also
(N - 1)/N x S. All-reduce is the two in a row: 2(N - 1)/N x S. Broadcast along the ring
forwards the whole tensor once per rank: S. These are the volumes of the bandwidth-optimal
algorithms (Patarasuk and Yuan 2009; NCCL's ring); a library may pick another algorithm
for small tensors, so these are each collective's volume, not a packet capture.

gloo, the backend of every CPU run here, runs two of them differently (:func:`gloo_bytes`):
a reduce-scatter is an all-reduce of a copy followed by a slice (torch 2.14's
``ProcessGroupGloo``), so it sends an all-reduce's 2(N - 1)/N x S, twice the ring's; and a
broadcast is a binomial tree (gloo's ``broadcast.cc``): the root sends the tensor to
log2(N) ranks, a leaf sends nothing. :class:`helpers.comm.wire.WireMeter` reads what was
actually sent from the kernel's socket counters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


# torch 2.14 calls the one-tensor forms all_gather_single and reduce_scatter_single (the
# older names, all_gather_into_tensor and reduce_scatter_tensor, now warn); older releases
# have only the older names. Same arguments: (output, input, ..., group=...).
# Looked up at each call, so that a clock wrapping ``torch.distributed``'s functions sees them.
def all_gather(output: torch.Tensor, input: torch.Tensor, **kwargs: object):
    """Every rank's ``input``, concatenated along dim 0 into ``output``."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, input, **kwargs)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, **kwargs: object):
    """This rank's chunk (along dim 0) of the sum over ranks of ``input``, into ``output``."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(output, input, **kwargs)


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


def validate_collective(name: str) -> str:
    """``name`` if it is one of :data:`COLLECTIVES`, else a ValueError naming them."""
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; valid choices: {', '.join(COLLECTIVES)}")
    return name


def ring_bytes(collective: str, world_size: int, nbytes: float) -> float:
    """Bytes one rank sends for ``collective`` of a full tensor of ``nbytes`` in a ring."""
    validate_collective(collective)
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r}; valid: an integer >= 1")
    n = world_size
    if n == 1:
        return 0.0
    share = (n - 1) / n * nbytes
    return {"all_reduce": 2 * share, "reduce_scatter": share, "all_gather": share,
            "broadcast": float(nbytes)}[collective]


def gloo_bytes(collective: str, world_size: int, nbytes: float, rank: int = 0,
               root: int = 0) -> float:
    """Bytes rank ``rank`` of a gloo group sends for ``collective`` of a full tensor of
    ``nbytes``, by gloo's algorithms. Payload only: gloo also writes 96 B of headers per
    piece sent and 48 B per piece received (:mod:`helpers.comm.headers`). All-reduce and
    all-gather are rings; a reduce-scatter is an all-reduce; a broadcast from ``root`` is a
    binomial tree."""
    validate_collective(collective)
    if collective == "reduce_scatter":
        return ring_bytes("all_reduce", world_size, nbytes)
    if collective != "broadcast":
        return ring_bytes(collective, world_size, nbytes)
    ring_bytes(collective, world_size, nbytes)  # the same checks of world_size
    if not 0 <= rank < world_size or not 0 <= root < world_size:
        raise ValueError(f"rank={rank!r}, root={root!r}; valid: 0 to {world_size - 1}")
    virtual = (rank - root) % world_size  # the root is virtual rank 0
    # in round i the ranks below 2**i send to the rank 2**i above them, if there is one
    children = sum(1 for i in range(max(world_size - 1, 0).bit_length())
                   if virtual < 2 ** i and virtual + 2 ** i < world_size)
    return float(children * nbytes)


def all_to_all_sent(input: torch.Tensor, splits: list[int], rank: int, size: int) -> int:
    """Bytes rank ``rank`` sends in an all-to-all of ``input``: every block of dim 0 but its
    own (``splits``: the rows of each block; empty: ``size`` equal blocks)."""
    rows = input.shape[0] if input.dim() else 1
    splits = list(splits) or [rows // size] * size
    if len(splits) != size or sum(splits) != rows:
        raise ValueError(f"splits={splits} do not cut {rows} rows into {size} blocks")
    return (rows - splits[rank]) * (input.numel() * input.element_size() // max(rows, 1))


@dataclass(frozen=True)
class AlphaBeta:
    """t = alpha + beta x bytes sent, fitted by least squares to one collective's timings."""

    collective: str
    alpha_s: float  # the fixed cost of one call (latency, launch)
    beta_s_per_byte: float  # the inverse of the bandwidth the rank sees
    sent_bytes: list[float]
    times_s: list[float]

    @property
    def bandwidth(self) -> float:
        """Bytes per second: 1 / beta."""
        return 1 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")

    def predict(self, sent_bytes: float) -> float:
        """Seconds for one call that sends ``sent_bytes`` per rank."""
        return self.alpha_s + self.beta_s_per_byte * sent_bytes

    @property
    def residuals(self) -> list[float]:
        """Measured minus fitted, per size (seconds)."""
        return [t - self.predict(b) for b, t in zip(self.sent_bytes, self.times_s, strict=True)]

    @property
    def relative_residuals(self) -> list[float]:
        return [r / t for r, t in zip(self.residuals, self.times_s, strict=True)]


def fit_alpha_beta(collective: str, sent_bytes: list[float], times_s: list[float]) -> AlphaBeta:
    """Least-squares fit of t = alpha + beta x bytes, weighting each size by 1/t (relative
    errors), so that the small sizes, whose times are microseconds, still count."""
    if len(sent_bytes) != len(times_s) or len(sent_bytes) < 2:
        raise ValueError(f"{len(sent_bytes)} sizes and {len(times_s)} times; valid: the same "
                         "number of each, at least 2")
    x, t = np.asarray(sent_bytes, float), np.asarray(times_s, float)
    w = 1 / t
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    return AlphaBeta(collective, float(alpha), float(beta), list(map(float, x)), list(map(float, t)))


def run_collective(name: str, full: torch.Tensor, rank: int, world_size: int,
                   group=None) -> torch.Tensor:
    """Issue ``name`` on this rank's ``full``-size tensor; return what the rank ends with.

    all_reduce: the sum, full size. reduce_scatter: this rank's chunk of the sum.
    all_gather: every rank's chunk (this rank's is chunk ``rank`` of ``full``), concatenated.
    broadcast: rank 0's tensor.
    """
    validate_collective(name)
    chunk = full.numel() // world_size
    if name == "all_reduce":
        out = full.clone()
        dist.all_reduce(out, group=group)
    elif name == "reduce_scatter":
        out = torch.empty(chunk, dtype=full.dtype, device=full.device)
        reduce_scatter(out, full, group=group)
    elif name == "all_gather":
        out = torch.empty_like(full)
        all_gather(out, full[rank * chunk:(rank + 1) * chunk].clone(), group=group)
    else:
        out = full.clone()
        dist.broadcast(out, src=0, group=group)  # rank 0 of the default group
    return out


def expected_result(name: str, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
    """What rank ``rank`` must end with, computed locally from every rank's input."""
    validate_collective(name)
    n = len(inputs)
    chunk = inputs[0].numel() // n
    total = torch.stack(inputs).sum(0)
    if name == "all_reduce":
        return total
    if name == "reduce_scatter":
        return total[rank * chunk:(rank + 1) * chunk]
    if name == "all_gather":
        return torch.cat([inputs[r][r * chunk:(r + 1) * chunk] for r in range(n)])
    return inputs[0]


def rank_input(rank: int, numel: int) -> torch.Tensor:
    """Rank r's test tensor: 0, 1, 2, ... plus 1000 r (every rank's differs, all exact)."""
    return torch.arange(numel, dtype=torch.float32) + 1000 * rank
