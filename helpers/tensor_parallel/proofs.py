"""How close a tensor-parallel result must be to the native one, and the checks that use it.

Both compute the same products but add them up in another order, and each rank rounds
its partial output to the dtype before the sum over ranks: the differences are a few
units in the last place. ``output_tolerance`` allows 4 per rank, a chosen factor, not a
derived bound. A wrong or missing shard misses by far more.
"""

from __future__ import annotations

import torch

from helpers.core.checks import Proof, max_abs_diff
from helpers.core.devices import resolve_dtype

# Lesson 07's simulated training step (chosen, not derived): float32 sums in another
# order, each difference relative to the largest value of its kind (gradients, weights,
# input gradient, loss).
STEP_TOLERANCE = 1e-6
# Lesson 07's splits on paper, in float64 on values of order 1 (chosen, not derived):
# float64's rounding leaves differences of a few 1e-15 in these sums of 8 and 12
# products, a wrong split misses by the values' own size; 1e-12 sits far from both.
PAPER_TOLERANCE = 1e-12


def paper_check(what: str, full: torch.Tensor, split: torch.Tensor) -> Proof:
    """The split's result against the full product, within ``PAPER_TOLERANCE``."""
    return Proof(what, max_abs_diff(full, split), PAPER_TOLERANCE)


def eps(dtype: torch.dtype | str) -> float:
    """Machine epsilon: the gap between 1 and the next number of ``dtype``."""
    return torch.finfo(resolve_dtype(dtype)).eps


def output_tolerance(reference: torch.Tensor, dtype: torch.dtype | str, world_size: int) -> float:
    """Largest element-wise difference allowed between native and tensor-parallel outputs.

    ``4 * p * eps * max|y|``: every rounding moves a value by up to eps/2 relative, the
    reordered sums a few more; a few units in the last place per rank. The factor 4 is
    chosen, not derived.
    """
    return 4 * max(world_size, 1) * eps(dtype) * reference.detach().abs().max().item()


def outputs_agree(
    reference: torch.Tensor, candidate: torch.Tensor, dtype: torch.dtype | str, world_size: int
) -> tuple[float, float, bool]:
    """(max |diff|, tolerance, whether within it), element by element over the full output."""
    diff = max_abs_diff(reference, candidate)
    tol = output_tolerance(reference, dtype, world_size)
    return diff, tol, diff <= tol


def checksum(out: torch.Tensor) -> tuple[float, float]:
    """(sum, sum of absolute values) of an output, added up in float64.

    The source prints ``out.sum()`` in float16, which rounds the sum itself to 11 bits;
    the float64 sum keeps every digit printed meaningful. Information only: the proofs
    compare outputs element by element.
    """
    out = out.detach().double()
    return out.sum().item(), out.abs().sum().item()


def checksum_tolerance(abs_sum: float, dtype: torch.dtype | str) -> float:
    """How far apart the sums of two correct computations may be: ``eps * sum|y|``."""
    return eps(dtype) * abs_sum


def checksums_match(reference: float, candidate: float, abs_sum: float, dtype) -> bool:
    """Whether two outputs' sums agree within ``eps * sum|y|`` of the reference's |y|."""
    return abs(reference - candidate) <= checksum_tolerance(abs_sum, dtype)
