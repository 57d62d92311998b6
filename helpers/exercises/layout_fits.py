"""Checker for lesson 13's exercise 13.2: what fills the card, and which cut divides it.

Llama-70B on 64 cards of 80 GiB (8 per node), mixed-precision Adam, sequences of 4096
tokens, a global batch of 1024 sequences in micro-batches of one, 1F1B, and *no*
recomputation. FSDP over all 64 GPUs does not fit: which kind of memory fills the card,
and which of the three cuts divides it? The reference is the lesson's own estimator and
layout search, run now: the learner reasons, the estimator confirms.
"""

from __future__ import annotations

from helpers.composed.layout_search import CARD, Candidate, Search, describe, search_layouts
from helpers.core.sizes import format_bytes
from helpers.exercises.feedback import Wrong, checker, given
from helpers.memory import LLAMA_70B_SHAPE

GPUS, SEQ, GLOBAL_BATCH = 64, 4096, 1024
SHAPE = LLAMA_70B_SHAPE
KINDS = {"weights": "weights", "gradients": "grads", "optimizer state": "optimizer_state",
         "activations": "activations"}
CUTS = ("dp", "tp", "pp")


def search(tp: int | None = None) -> Search:
    """The lesson's search for this exercise, without recomputation (one ``tp`` if given)."""
    return search_layouts(SHAPE, GPUS, model="Llama-70B", seq=SEQ, global_batch=GLOBAL_BATCH,
                          gpu_bytes=CARD, recompute=(False,), tp=(tp,) if tp else None)


def closest_at(tp: int, pp: int) -> Candidate:
    """The layout with this ``tp`` and ``pp`` whose fullest GPU holds the least."""
    return min((c for c in search(tp).tried if c.pp == pp), key=lambda c: c.memory.total)


def held(c: Candidate) -> dict[str, int]:
    """Bytes on ``c``'s fullest GPU, per kind, by the names the exercise uses."""
    return {kind: getattr(c.memory, field) for kind, field in KINDS.items()}


def what_cuts_do() -> tuple[Candidate, dict[str, Candidate]]:
    """FSDP over all the GPUs, and what each cut makes of it: ``dp`` the least sharding
    (DDP: ZeRO stages change no activation), ``tp`` and ``pp`` a factor of 2."""
    base = closest_at(1, 1)
    ddp = next(c for c in search(1).tried if c.pp == 1 and c.zero == 0)
    return base, {"dp": ddp, "tp": closest_at(2, 1), "pp": closest_at(1, 2)}


def _valid(got: object) -> tuple[str, str]:
    if (not isinstance(got, tuple) or len(got) != 2
            or not all(isinstance(v, str) for v in got)):
        raise Wrong(f"fills_and_cut = {got!r}; expected a pair of strings (kind, cut), e.g. "
                    "('weights', 'pp')")
    kind, cut = got
    if kind not in KINDS:
        raise Wrong(f"kind = {kind!r}; valid: {', '.join(map(repr, KINDS))}")
    if cut not in CUTS:
        raise Wrong(f"cut = {cut!r}; valid: {', '.join(map(repr, CUTS))}")
    return kind, cut


@checker("13.2", "Set fills_and_cut to a pair (kind, cut), then run this cell again.")
def check_fills_and_cut(fills_and_cut: tuple[str, str]) -> str:
    """Which kind fills the card under FSDP 64 without recomputation, and which cut
    divides it, against the estimator."""
    kind, cut = _valid(given(fills_and_cut))
    base, cuts = what_cuts_do()
    have = held(base)
    fills = max(have, key=have.__getitem__)
    gib = {k: format_bytes(v) for k, v in have.items()}
    if kind != fills:
        raise Wrong(f"Under {describe(base)} without recomputation the fullest GPU holds "
                    f"{gib[kind]} of {kind} but {gib[fills]} of {fills}, of "
                    f"{format_bytes(base.memory.total)} in all",
                    "FSDP already divides weights, gradients and optimizer state by the "
                    "number of GPUs; ZeRO never shards what the forward keeps for the "
                    "backward")
    after = {c: held(x)[fills] for c, x in cuts.items()}
    best = min(after, key=after.__getitem__)
    if cut != best:
        why = {"dp": ("data parallelism splits the batch, not a sequence: each GPU still "
                      "runs a whole micro-batch through every block, under any ZeRO stage"),
               "pp": ("a 1F1B pipeline gives each stage half the blocks, but its first "
                      "stage keeps one micro-batch in flight per stage: two here")}
        raise Wrong(f"{describe(cuts[cut])} still keeps {format_bytes(after[cut])} of "
                    f"{fills} on its fullest GPU, against {gib[fills]} under "
                    f"{describe(base)}", why.get(cut, ""))
    chosen = search().chosen
    return (f"{fills.capitalize()} fill the card: {gib[fills]} of {format_bytes(base.memory.total)} "
            f"under {describe(base)}. {describe(cuts['tp'])} cuts them to "
            f"{format_bytes(after['tp'])}: tensor parallelism, with sequence parallelism, "
            f"splits every block's activations, which no ZeRO stage "
            f"({format_bytes(after['dp'])} under {describe(cuts['dp'])}) and no pipeline "
            f"({format_bytes(after['pp'])} under {describe(cuts['pp'])}) does. The search "
            f"without recomputation chooses {describe(chosen)}: "
            f"{format_bytes(chosen.memory.total)} of {format_bytes(CARD)}.")
