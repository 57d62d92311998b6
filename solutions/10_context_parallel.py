"""Lesson 10's exercises, solved. Try them in the notebook first."""

import torch


# %% Exercise 10.1: merge two partial attention results
def merge_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                   lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The merged denominator is exp(lse_a) + exp(lse_b); each block's output was divided by
    its own denominator, so it is re-weighted by its share of the total."""
    lse = torch.logaddexp(lse_a, lse_b)
    out = torch.exp(lse_a - lse)[..., None] * out_a + torch.exp(lse_b - lse)[..., None] * out_b
    return out, lse


# %% Exercise 10.2: ring or Ulysses at cp = 8
# A rank holds 8192 / 8 = 1024 tokens. Its key (or value) block: 1 x 8 x 1024 x 128 x 2 B =
# 2 MiB; its query block 1 x 32 x 1024 x 128 x 2 B = 8 MiB.
# Ring: forward 2 x 7 key/value blocks, backward 4 x 7 + 2: 44 blocks of 2 MiB.
# Ulysses: each way q, k, v and the output: (2 x 8 + 2 x 2) MiB x 7/8, twice.
ring_and_ulysses = (44 * 2 * 2**20, 2 * (2 * 8 + 2 * 2) * 2**20 * 7 // 8)


# %% Exercise 10.3: why the zig-zag split balances the work
def zigzag_pieces(cp: int) -> list[int]:
    """Rank r holds chunks r and 2cp-1-r of 2cp; chunk c's queries see chunks 0..c."""
    return [(r + 1) + (2 * cp - r) for r in range(cp)]


ANSWERS = {"10.1": merge_partials, "10.2": ring_and_ulysses, "10.3": zigzag_pieces}
