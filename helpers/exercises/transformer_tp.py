"""Checkers for lesson 09 (tensor parallelism of a whole transformer), exercises 09.1 (why
each block needs f) and 09.2 (what sequence parallelism saves); 09.3 (the vocab-parallel
loss) is in ``helpers.exercises.vocab_loss``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from numbers import Real

import torch

from helpers.core.sizes import format_bytes
from helpers.exercises.feedback import Wrong, answer, checker, given
from helpers.memory import TransformerShape
from helpers.models.llama import Block
from helpers.runs.tp_llama.skip_f import wrong_gradients

# --- 09.1 -----------------------------------------------------------------------------------

F_BLOCK, F_TP = (64, 128, 8, 4), 2  # hidden, MLP width, heads, key/value heads; ranks
BLOCK_WEIGHTS = ("attn_norm.weight", "attn.q_proj.weight", "attn.k_proj.weight",
                 "attn.v_proj.weight", "attn.o_proj.weight", "mlp_norm.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
_MLP = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
_ATTENTION = ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
              "attn.o_proj.weight")


@functools.cache
def wrong_without_f_answer() -> frozenset[str]:
    """The block weights whose gradient goes wrong on rank 0 of 2 when f is skipped: run on
    thread ranks of a real gloo group (``skip_f``), against one process."""
    hidden, ffn, heads, kv_heads = F_BLOCK
    torch.manual_seed(0)
    block = Block(hidden, ffn, heads, kv_heads, rope=True)
    x = torch.randn(2, 8, hidden, generator=torch.Generator().manual_seed(1))
    return frozenset(wrong_gradients(block, x, F_TP, skip_f=True))


def _f_hint(got: set[str], want: frozenset[str]) -> str:
    """Why ``got`` is not the set of weights that go wrong without f."""
    if got & set(_MLP):
        return ("gate, up and down get the gradient of their output through g, whose backward "
                "is the identity: it is whole on every rank, and their input, the norm's "
                "output, is right in forward, so their gradients stay right")
    if not got >= {"mlp_norm.weight"}:
        return ("follow the gradient back from the block's output: the first weight it meets "
                "after the MLP's shards is mlp_norm's, and without f the gradient reaching the "
                "norm's output is only this rank's MLP columns' share")
    if not got >= set(_ATTENTION) | {"attn_norm.weight"}:
        return ("the gradient that goes on from mlp_norm into h is wrong too, and h carries it "
                "into g of the attention half: every weight of the attention half is trained "
                "from that wrong gradient, not only the norm's")
    return f"the weights that go wrong are {len(want)} of the {len(BLOCK_WEIGHTS)}"


@checker("09.1", "Set wrong_without_f to the set of a block's weights whose gradient goes wrong "
                 "without f, then run this cell again.")
def check_wrong_without_f(wrong_without_f: set[str]) -> str:
    """Which of a block's weights get a wrong gradient when both f are skipped."""
    got = given(wrong_without_f)
    if not isinstance(got, (set, frozenset, list, tuple)):
        raise Wrong(f"Expected a set of weight names, got {type(got).__name__}",
                    "e.g. {'attn_norm.weight', 'mlp.up_proj.weight'}")
    unknown = [n for n in got if n not in BLOCK_WEIGHTS]
    if unknown:
        raise Wrong(f"{unknown[0]!r} is not a weight of the block",
                    f"valid names: {', '.join(BLOCK_WEIGHTS)}")
    want = wrong_without_f_answer()
    if set(got) != want:
        raise Wrong("that is not the set of weights whose gradient goes wrong on rank 0 "
                    "without f", _f_hint(set(got), want))
    return ("Both norms and the whole attention half go wrong; the MLP's shards stay right. f's "
            "backward all-reduce is what makes the gradient leaving each tensor-parallel region "
            "whole. Without it the norms are the first casualty, and everything below them "
            "inherits the error: an all-reduce of the norms' gradients afterwards would mend "
            "mlp_norm's, but not q, k, v, o or attn_norm's.")


# --- 09.2 -----------------------------------------------------------------------------------

# (tokens, hidden, tp, element_size): the first tells the usual mistakes apart, except
# statistics counted at element_size, which only a size other than 4 shows (the second)
SP_CASES = ((2048, 1024, 4, 4), (4096, 4096, 4, 2), (512, 256, 8, 2), (128, 64, 1, 4),
            (1024, 2048, 2, 4), (64, 512, 4, 1))
QUOTED = SP_CASES[1]  # Llama-7B's width, 16-bit
STAT_BYTES = 4  # a norm's rstd per token is float32, whatever the activations' dtype


def case_shape(hidden: int, tp: int) -> TransformerShape:
    """A valid block of width ``hidden`` for ``tp`` ranks (heads and MLP split evenly)."""
    heads = max(tp, hidden // 64)
    kv_heads = heads // 2 if heads % (2 * tp) == 0 else None  # grouped-query where it splits
    return TransformerShape(hidden=hidden, blocks=1, heads=heads, ffn=4 * hidden, vocab=64,
                            kv_heads=kv_heads)


def sp_saving_bytes(tokens: int, hidden: int, tp: int, element_size: int,
                    shape: TransformerShape | None = None) -> int:
    """Bytes of one block's saved activations that sequence parallelism saves per rank."""
    shape = shape or case_shape(hidden, tp)
    kept = [shape.block_activation_bytes(tokens, element_size, tp, seq_parallel=sp)
            for sp in (False, True)]
    return kept[0] - kept[1]


def _sp_mistakes(t: int, h: int, tp: int, e: int) -> list[tuple[float, str]]:
    """(what a usual wrong count gives, its hint), first match wins."""
    saved, s = 1 - 1 / tp, STAT_BYTES
    gathered = ("sequence parallelism saves only what a rank keeps of its own tokens. The two "
                "norm outputs are all-gathered to every token before the column-parallel "
                "projections, which keep the whole gathered tensor for their backward (as "
                "PyTorch's SequenceParallel does): here they stay whole on every rank. "
                "(Korthikanti et al. split those inputs too: Megatron keeps only a rank's "
                "tokens of them and all-gathers them again in backward.)")
    return [
        (t * (6 * h * e + 2 * s) * saved, gathered),
        (t * 6 * h * e * saved, gathered),
        (t * 4 * h * e * saved, "a norm keeps more than width-h tensors for its backward: "
         "each norm also keeps one float32 rstd per token, a statistic of that token, so it "
         "is split by tokens like the rest"),
        (t * (4 * h + 2) * e * saved, "the norms' statistics stay float32 whatever "
         "element_size the activations use (the norm kernels compute them in float32)"),
        (t * (4 * h * e + s) * saved, "a block has two norms (before attention and before the "
         "MLP), and each keeps its own statistics"),
        (t * (4 * h * e + 2 * s) / tp, "that is what a rank still keeps of these tensors; the "
         "saving is what it no longer keeps"),
        (t * (4 * h * e + 2 * s), "a rank still keeps its own tokens' share of these tensors: "
         "it saves the other ranks' tokens, not all"),
        (t * (4 * h * e + 2 * s) * (tp - 1), "that is all tp ranks' saving together; the "
         "question is one rank's"),
        (t * (4 * h + 2) * saved, "count bytes, not elements: a width-h tensor has "
         "element_size bytes per element, a float32 statistic 4"),
    ]


@checker("09.2", "Write the body of sp_saving(tokens, hidden, tp, element_size), then run "
                 "this cell again.")
def check_sp_saving(sp_saving: Callable[[int, int, int, int], float]) -> str:
    """Bytes sequence parallelism saves per block and rank, against the estimator."""
    for t, h, tp, e in SP_CASES:
        call = f"sp_saving(tokens={t}, hidden={h}, tp={tp}, element_size={e})"
        got = answer(sp_saving, t, h, tp, e)
        if isinstance(got, bool) or not isinstance(got, Real):
            raise Wrong(f"{call} returned {type(got).__name__} {got!r}; expected a number "
                        "of bytes")
        want = sp_saving_bytes(t, h, tp, e)
        if abs(float(got) - want) <= 1:
            continue
        hint = next((hint for value, hint in _sp_mistakes(t, h, tp, e)
                     if abs(float(got) - value) <= 1),
                    "ask of each tensor a block keeps around its norms: does it stay in a "
                    "rank's own tokens (then sequence parallelism splits it) or is it "
                    "all-gathered first (then it stays whole)? Here four width-h tensors and the "
                    "norms' statistics stay in a rank's tokens; the docstring names them")
        raise Wrong(f"{call} = {float(got):,.0f}; the estimator saves {want:,} bytes", hint)
    t, h, tp, e = QUOTED
    shape = case_shape(h, tp)
    before = shape.block_activation_bytes(t, e, tp, seq_parallel=False)
    return (f"At {t} tokens of Llama-7B's width ({h}), 16-bit, tp={tp}: sequence parallelism "
            f"saves "
            f"{format_bytes(sp_saving_bytes(t, h, tp, e))} of the {format_bytes(before)} one "
            "block keeps per rank, whatever the heads and the MLP width: what it cuts lies "
            "around the norms, outside the split layers.")

