"""Checker for lesson 10's exercise 10.2: the layout that fits a given model and cluster.

Llama-70B on 64 cards of 80 GiB (8 per node), mixed-precision Adam, sequences of 4096
tokens, a global batch of 1024 sequences in micro-batches of one, 1F1B, and *no*
recomputation: which ``(tp, pp)`` has the fewest model-parallel GPUs and fits, with tensor
parallelism before pipeline stages? The reference is the lesson's own layout search, run now.
"""

from __future__ import annotations

from helpers.composed.layout_search import (
    CARD,
    Candidate,
    Search,
    describe,
    search_layouts,
    valid_tp,
)
from helpers.core.sizes import format_bytes
from helpers.exercises.feedback import Wrong, checker, given
from helpers.memory import LLAMA_70B_SHAPE

GPUS, SEQ, GLOBAL_BATCH = 64, 4096, 1024
SHAPE = LLAMA_70B_SHAPE


def search(tp: int | None = None) -> Search:
    """The lesson's search for this exercise, without recomputation (one ``tp`` if given)."""
    return search_layouts(SHAPE, GPUS, model="Llama-70B", seq=SEQ, global_batch=GLOBAL_BATCH,
                          gpu_bytes=CARD, recompute=(False,), tp=(tp,) if tp else None)


def best_at(tp: int, pp: int) -> Candidate | None:
    """The best fitting layout with this ``tp`` and ``pp`` (any sharding), or None."""
    return next((c for c in search(tp).fitting if c.pp == pp), None)


def closest_at(tp: int, pp: int) -> Candidate:
    """The layout with this ``tp`` and ``pp`` whose fullest GPU holds the least."""
    return min((c for c in search(tp).tried if c.pp == pp), key=lambda c: c.memory.total)


def _valid(got: object) -> tuple[int, int]:
    tps = [t for t in valid_tp(SHAPE) if GPUS % t == 0]
    if (not isinstance(got, tuple) or len(got) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in got)):
        raise Wrong(f"layout_70b_64 = {got!r}; expected a pair of whole numbers (tp, pp), "
                    "e.g. (8, 2)")
    tp, pp = got
    if tp not in tps:
        raise Wrong(f"tp = {tp}; valid: {tps} (inside one node of 8 GPUs, dividing the 64 "
                    "heads and the 8 key/value heads)")
    if pp < 1 or (GPUS // tp) % pp or pp > SHAPE.blocks:
        valid = [p for p in range(1, GPUS // tp + 1) if (GPUS // tp) % p == 0]
        raise Wrong(f"pp = {pp} with tp = {tp}; valid: {valid} (tp x pp must divide the "
                    f"{GPUS} GPUs, the rest are data-parallel ranks)")
    return tp, pp


def _overflow_hint(near: Candidate) -> str:
    """What overflows the card in the closest layout, and what divides it."""
    kinds = {"weights": near.memory.weights, "gradients": near.memory.grads,
             "optimizer state": near.memory.optimizer_state,
             "activations": near.memory.activations}
    largest = max(kinds, key=kinds.__getitem__)
    if largest != "activations":
        return (f"the {largest} fill the card: more GPUs must share each copy of the model")
    return ("what fills the card is the activations: without recomputation a GPU keeps every "
            "activation of its blocks for each micro-batch in flight. ZeRO shards weights, "
            "gradients and optimizer state, never activations; tensor parallelism (with "
            "sequence parallelism) splits each block's; a 1F1B pipeline gives each stage "
            "fewer blocks, but its first stage keeps one micro-batch in flight per stage")


@checker("10.2", "Set layout_70b_64 to a pair (tp, pp), then run this cell again.")
def check_layout_70b_64(layout_70b_64: tuple[int, int]) -> str:
    """The fewest model-parallel GPUs (TP before PP) that fit Llama-70B on 64 GPUs without
    recomputation."""
    tp, pp = _valid(given(layout_70b_64))
    want = search().chosen
    if want is None:
        raise ValueError("no layout fits: the exercise needs a search that finds one")
    got = best_at(tp, pp)
    if got is None:
        near = closest_at(tp, pp)
        raise Wrong(f"TP {tp} x PP {pp} does not fit: even as {describe(near)} the fullest GPU "
                    f"needs {format_bytes(near.memory.total)}, over {format_bytes(CARD)}",
                    _overflow_hint(near))
    if got.model_parallel > want.model_parallel:
        raise Wrong(f"TP {tp} x PP {pp} fits ({describe(got)}: "
                    f"{format_bytes(got.memory.total)}), but fewer model-parallel GPUs fit "
                    "too: each one taken from data parallelism adds communication inside "
                    "every step",
                    "the rule's first criterion is just enough model parallelism to fit, and "
                    "data parallelism for the rest")
    if (got.tp, got.pp) != (want.tp, want.pp):
        raise Wrong(f"TP {tp} x PP {pp} fits with {tp * pp} model-parallel GPUs, but so does "
                    f"a layout with more tensor parallelism and fewer pipeline stages: TP "
                    "inside a node first, and a smaller bubble",
                    "at equal tp x pp, the rule keeps tensor parallelism inside a node before "
                    "it cuts pipeline stages across nodes")
    without = closest_at(1, 1)
    return (f"{describe(want)}: the fullest GPU needs {format_bytes(want.memory.total)} of "
            f"{format_bytes(CARD)}. Without tensor parallelism, {describe(without)} would "
            f"need {format_bytes(without.memory.total)}: each GPU keeps a whole micro-batch's "
            "activations for all 80 blocks, and TP (with sequence parallelism) splits them.")
