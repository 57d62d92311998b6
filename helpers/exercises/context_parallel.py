"""Checkers for lesson 10 (context parallelism): merging partial attention by the
log-sum-exp, which chunks a zig-zag rank holds and why that balances causal work, and what
ring attention and Ulysses send."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.context_parallel.merge import block_attention
from helpers.context_parallel.split import causal_work, chunks_of
from helpers.context_parallel.traffic import AttentionShape, layer_traffic
from helpers.exercises.feedback import Wrong, answer, checker, given

MERGE_ATOL = 1e-12  # float64 inputs: a right merge rounds a few times; a wrong one is O(1)


@checker("10.1", "Write the body of merge_partials(out_a, lse_a, out_b, lse_b), then run this "
         "cell again.")
def check_merge_partials(merge_partials) -> str:
    given(merge_partials)
    q = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    k, v = (torch.randn(2, 3, 12, 8, dtype=torch.float64) for _ in range(2))
    want = F.scaled_dot_product_attention(q, k, v)
    a, b = block_attention(q, k[..., :4, :], v[..., :4, :]), block_attention(q, k[..., 4:, :], v[..., 4:, :])
    got = answer(merge_partials, *a, *b)
    out = got[0] if isinstance(got, tuple) else got
    if not isinstance(out, torch.Tensor) or out.shape != want.shape:
        raise Wrong(f"expected a tensor of shape {tuple(want.shape)} (or (out, lse)), got "
                    f"{type(out).__name__}", "Return the merged output, optionally with its lse.")
    diff = (out - want).abs().max().item()
    if diff > MERGE_ATOL:
        simple = (a[0] + b[0]) / 2
        hint = ("Averaging the two outputs weights each block equally; weight each by its "
                "share of the total denominator, exp(lse_block - lse_total)."
                if (simple - out).abs().max() < MERGE_ATOL else
                "lse_total = logaddexp(lse_a, lse_b); each output is scaled by "
                "exp(its lse - lse_total), with a trailing dimension to broadcast.")
        raise Wrong(f"the merged output differs from full attention by {diff:.1e}", hint)
    return ("the two blocks' outputs, each weighted by its share of the softmax's denominator, "
            "are exactly attention over all 12 keys.")


@checker("10.2", "Set ring_and_ulysses to a pair (ring bytes, Ulysses bytes) one rank sends "
         "per layer, forward and backward, then run this cell again.")
def check_ring_or_ulysses(ring_and_ulysses) -> str:
    shape = AttentionShape(batch=1, seq=8192, heads=32, kv_heads=8, head_dim=128,
                           element_bytes=2)
    ring, ulysses = layer_traffic("ring", shape, 8).step, layer_traffic("ulysses", shape, 8).step
    got = given(ring_and_ulysses)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Wrong(f"expected a pair (ring bytes, Ulysses bytes), got {got!r}")
    if tuple(got) != (ring, ulysses):
        raise Wrong(f"ring {got[0]}, Ulysses {got[1]}: not what the ranks would send",
                    "A rank's block is batch x heads x seq/cp x head_dim x 2 bytes (kv_heads for "
                    "keys and values). Ring: forward 2(cp-1) key/value blocks, backward "
                    "4(cp-1)+2. Ulysses: 4 all-to-alls each way, each sending (cp-1)/cp of its "
                    "tensor.")
    more = "Ulysses" if ulysses > ring else "the ring"
    return (f"the ring sends {ring:,} B and Ulysses {ulysses:,} B per layer per step: "
            f"{more} sends more here. The ring's bytes grow with cp; Ulysses' shrink.")


@checker("10.3", "Write the body of zigzag_pieces(cp), then run this cell again.")
def check_zigzag_pieces(zigzag_pieces) -> str:
    for cp in (2, 3, 4, 8):
        got = answer(zigzag_pieces, cp)
        want = [causal_work(r, cp, 2 * cp, "zigzag") for r in range(cp)]
        if list(got) != want:
            first = [len(range(c + 1)) for c in chunks_of(0, cp, "zigzag")]
            raise Wrong(f"zigzag_pieces({cp}) = {list(got)}: not the pieces each rank "
                        "computes there",
                        f"Rank r holds chunks r and 2cp-1-r; chunk c's queries see chunks 0..c, "
                        f"c + 1 pieces (rank 0 at cp={cp}: {first}).")
    return ("every rank computes 2cp + 1 pieces: chunk r sees r + 1 chunks and chunk 2cp-1-r "
            "sees 2cp - r, and the two always add up to the same. A contiguous split gives "
            "rank r a load of r + 1 blocks, so the last rank sets everyone's pace.")
