"""Checkers for lesson 09 (tensor parallelism of a whole transformer), exercises 09.1 and
09.2; 09.3 (the vocab-parallel loss) is in ``helpers.exercises.vocab_loss``."""

from __future__ import annotations

from collections.abc import Callable
from numbers import Real

from helpers.core.sizes import format_bytes
from helpers.exercises.feedback import NotSolved, Wrong, answer, checker, given, is_placeholder
from helpers.memory import TransformerShape
from helpers.models.llama import LMConfig, build_lm
from helpers.tensor_parallel.llama import model_cuts

# --- 09.1 -----------------------------------------------------------------------------------

CHOICES = ("rows", "columns", "replicated")
SPLIT_CONFIG = LMConfig(vocab=64, hidden=64, blocks=1, ffn=128, heads=8, kv_heads=4, rope=True)
SPLIT_TP = 2
_BLOCK = "blocks.0."
_COLUMN_PARALLEL = ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
                    "mlp.gate_proj.weight", "mlp.up_proj.weight")
_ROW_PARALLEL = ("attn.o_proj.weight", "mlp.down_proj.weight")
_NORMS = ("attn_norm.weight", "mlp_norm.weight", "norm.weight")
_VOCAB = ("embed.weight", "head.weight")


def split_answer() -> dict[str, str]:
    """Name -> how a rank holds it, from ``model_cuts`` (block names relative to the block)."""
    cuts = model_cuts(build_lm(SPLIT_CONFIG, seed=0), rank=0, tp=SPLIT_TP)
    return {name.removeprefix(_BLOCK): cut.how for name, cut in cuts.items()}


def _split_hint(name: str, got: str) -> str:
    """Why ``got`` is not how a rank holds ``name``."""
    if name in _ROW_PARALLEL:
        return (f"{name.split('.')[1]} is row-parallel: its input is the part of the heads (or "
                "of the MLP width) this rank computed, so a rank keeps the matching *input* "
                "columns of the (out, in) weight and its partial outputs are summed (g)")
    if name in _COLUMN_PARALLEL:
        return (f"{name.split('.')[1]} is column-parallel: a rank computes some of its output "
                "features (its heads, or its part of the MLP width), the rows of the (out, in) "
                "weight; its input, the norm's output, is whole on every rank")
    if name in _NORMS:
        return ("a norm is replicated: every rank normalises the whole hidden vector of every "
                "token (the RMS runs over all of it), so each holds the whole weight")
    if got == "replicated":
        return ("the embedding and the head are the largest weights: each rank keeps the rows "
                "of its slice of the vocabulary, [start, end)")
    return ("the embedding and the head are split by vocabulary, which is their rows (vocab, "
            "hidden); the hidden vector stays whole on every rank")


def _check_keys(got: dict, want: dict[str, str]) -> None:
    unknown = [k for k in got if k not in want]
    if unknown:
        name = unknown[0]
        hint = (f"name a block's weights inside the block, without '{_BLOCK}': e.g. "
                f"'{name.removeprefix(_BLOCK)}'" if isinstance(name, str)
                and name.startswith("blocks.") else f"valid names: {', '.join(want)}")
        raise Wrong(f"split_of_block has an unknown name {name!r}", hint)
    missing = [k for k in want if k not in got]
    if missing:
        raise Wrong(f"split_of_block lacks {', '.join(map(repr, missing))}",
                    f"it needs all {len(want)}: the 9 weights of a block, embed.weight, "
                    "norm.weight and head.weight")
    for name, how in got.items():
        if not is_placeholder(how) and how not in CHOICES:
            raise Wrong(f"split_of_block[{name!r}] = {how!r}; valid: "
                        f"{', '.join(map(repr, CHOICES))}",
                        "'rows' or 'columns' of the weight as PyTorch stores it (nn.Linear: "
                        "(out, in); nn.Embedding: (vocab, hidden)), or 'replicated' (whole)")


def held_share(tp: int = SPLIT_TP) -> float:
    """The share of the model's weights rank 0 holds."""
    model = build_lm(SPLIT_CONFIG, seed=0)
    cuts = model_cuts(model, 0, tp)
    params = dict(model.named_parameters())
    return sum(cuts[n].take(p).numel() for n, p in params.items()) / sum(
        p.numel() for p in params.values())


@checker("09.1", "Fill in split_of_block: 'rows', 'columns' or 'replicated' for each weight, "
                 "then run this cell again.")
def check_split_of_block(split_of_block: dict[str, str]) -> str:
    """How each weight of the Llama is dealt to a rank, against ``model_cuts``."""
    got = given(split_of_block)
    if not isinstance(got, dict):
        raise Wrong(f"Expected a dict from weight name to 'rows', 'columns' or 'replicated', "
                    f"got {type(got).__name__}")
    want = split_answer()
    _check_keys(got, want)
    wrong = [n for n in want if not is_placeholder(got[n]) and got[n] != want[n]]
    if wrong:
        name = wrong[0]
        raise Wrong(f"split_of_block[{name!r}] = {got[name]!r}, which is not what a rank holds "
                    f"({len(wrong)} of {len(want)} wrong)", _split_hint(name, got[name]))
    if any(is_placeholder(v) for v in got.values()):
        raise NotSolved
    return ("Every weight as model_cuts deals it: q, k, v, gate and up column-parallel "
            "(rows), o and down row-parallel (columns), each pair joined without "
            "communication and summed by one all-reduce; the norms whole; the embedding and "
            f"the head by vocabulary rows. At tp={SPLIT_TP} a rank of this small model holds "
            f"{held_share():.0%} of its weights: only the norms are copied.")


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
