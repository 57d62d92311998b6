"""Checkers for lesson 06 (data parallelism and ZeRO sharding), exercises 06.1 (what a rank
holds under ZeRO-2) and 06.2 (why ZeRO-3 sends half as much again as DDP); 06.3 (a
reduce-scatter of your own) is in ``helpers.exercises.collectives``."""

from __future__ import annotations

from collections.abc import Callable
from numbers import Real

from helpers.core.sizes import format_bytes
from helpers.exercises.feedback import Wrong, answer, checker
from helpers.memory import LLAMA_7B_SHAPE, TransformerShape, estimate_training_memory
from helpers.profiles import get_profile
from helpers.runs.data_parallel.traffic import planned, ring_prediction

# Mixed-precision Adam in the ZeRO paper's accounting: bytes per parameter.
WEIGHT_BYTES, GRAD_BYTES, STATE_BYTES = 2, 2, 12

# Exercise 06.1's closing note: Llama-7B, data parallel over DP cards, one sequence each.
DP, SEQ, BATCH = 8, 4096, 1
STAGES = (0, 1, 2, 3)
RUNS = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")  # stage k's run in the lesson's launch
SENDS_NOT_KEEPS = ("(N-1)/N is the share of a tensor a rank sends in a ring reduce-scatter; "
                   "what a rank keeps of a sharded tensor is its own shard")



# --- 06.1 -----------------------------------------------------------------------------------


def zero_bytes(params: int, world_size: int, stage: int) -> float:
    """Bytes one rank holds for weights, grads and Adam state under ZeRO-``stage`` (0 = DDP)."""
    shards = (stage >= 3, stage >= 2, stage >= 1)  # weights, grads, optimizer state
    parts = (WEIGHT_BYTES, GRAD_BYTES, STATE_BYTES)
    return sum(b * params / (world_size if cut else 1) for b, cut in zip(parts, shards, strict=True))


def small_lm_params() -> int:
    """Parameters of the course's small Llama (``helpers.models.llama``, profile small)."""
    return TransformerShape.of(get_profile("small").lm.model).parameters()


def zero2_cases() -> list[tuple[int, int]]:
    """(params, world size) pairs, the first one telling every usual mistake apart."""
    small, llama = small_lm_params(), LLAMA_7B_SHAPE.parameters()
    return [(small, 4), (small, 2), (llama, 8), (1_000_000, 16), (llama, 64), (1_000, 1)]


def _zero2_mistakes(p: int, n: int) -> list[tuple[float, str]]:
    """(what a usual wrong count gives, its hint), first match wins."""
    ring = (n - 1) / n
    return [
        (zero_bytes(p, n, 1), "that is ZeRO-1's count, where every rank keeps all the "
         "gradients. ZeRO-2 shards the gradients too: a rank keeps only the part of them it "
         "updates"),
        (zero_bytes(p, n, 3), "that is ZeRO-3's count. ZeRO-2 shards only the gradients and "
         "the optimizer state; every rank keeps all the weights"),
        (zero_bytes(p, n, 0), "that is plain data parallelism's count (DDP), every rank "
         "holding everything. Which of the three kinds does ZeRO-2 shard over the ranks?"),
        (2 * p + 14 * p * ring, SENDS_NOT_KEEPS),
        (16 * p * ring, SENDS_NOT_KEEPS),
        (4 * p + 16 * p / n, "in mixed precision the model computes with 16-bit weights and "
         "gradients; only the optimizer's state is float32"),
        (2 * p + 10 * p / n, "mixed-precision Adam keeps more than its two moments in "
         "float32: its update is applied to a float32 master copy of the weights"),
    ]


def _as_number(value: object, call: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise Wrong(f"{call} returned {type(value).__name__} {value!r}; expected a number "
                    "of bytes")
    return float(value)


@checker("06.1", "Write the body of zero2_bytes(params, world_size), then run this cell again.")
def check_zero2_bytes(zero2_bytes: Callable[[int, int], float]) -> str:
    """Bytes a rank holds under ZeRO-2 with mixed-precision Adam, for several sizes."""
    for p, n in zero2_cases():
        call = f"zero2_bytes(params={p:,}, world_size={n})"
        got = _as_number(answer(zero2_bytes, p, n), call)
        want = zero_bytes(p, n, 2)
        if abs(got - want) <= 1:
            continue
        hint = next((h for value, h in _zero2_mistakes(p, n) if abs(got - value) <= 1),
                    "go kind by kind: for the weights, the gradients and the optimizer state, "
                    "ask whether ZeRO-2 keeps it whole on every rank or split over the N ranks, "
                    "and how many bytes per parameter it takes (the exercise says)")
        raise Wrong(f"{call} = {got:,.0f}; a rank holds {want:,.0f} bytes", hint)
    llama = LLAMA_7B_SHAPE.parameters()
    mine, table = zero_bytes(llama, DP, 2), estimated_states(2)
    block = GRAD_BYTES * LLAMA_7B_SHAPE.block_parameters()[0]  # bytes: one block's gradient
    return (f"Llama-7B on {DP} GPUs: {format_bytes(mine)} per rank under ZeRO-2 against "
            f"{format_bytes(zero_bytes(llama, DP, 0))} with DDP, before any activations. The "
            "16-bit weights, which ZeRO-2 still copies to every rank, are now the largest "
            f"part. Section 6's table puts {format_bytes(table)} in its weights, grads and "
            "optimizer columns: the estimator also counts the one block whose whole gradient "
            "a rank holds while it is reduce-scattered "
            f"({format_bytes(block)}), and Adam's step counters "
            f"({table - mine - block:,.0f} B).")


# --- 06.2 -----------------------------------------------------------------------------------


def estimated_states(stage: int) -> int:
    """Bytes of weights, grads and optimizer state per GPU for Llama-7B on ``DP`` GPUs
    under ZeRO-``stage``, by the course's estimator (section 6's table)."""
    row = estimate_training_memory(LLAMA_7B_SHAPE, batch=BATCH, seq=SEQ, optimizer="adam",
                                   precision="mixed", dp=DP, zero=stage).sum()
    return row.weights + row.grads + row.optimizer_state


def step_ring_bytes(stage: int, weight_bytes: int, world_size: int) -> float:
    """Bytes one rank sends in one step under ZeRO-``stage`` (0: DDP) by the ring formula,
    from the plan the lesson checks every call of its launch against (``traffic.PLANS``)."""
    return ring_prediction(planned(RUNS[stage], {"model": [weight_bytes]}), world_size)


def ring_cases() -> list[tuple[int, int, int]]:
    """(stage, float32 weight bytes, world size): the small model on 8, 2 and 4 ranks, stage
    3 first (the one the question is about), then one rank, which sends nothing. On 8
    ranks every usual mistake gives its own count."""
    small = 4 * small_lm_params()
    return [(k, small, n) for n in (8, 2, 4) for k in (3, 0, 1, 2)] + [(3, small, 1)]


def _ring_mistakes(stage: int, s: float, n: int) -> list[tuple[float, str]]:
    """(what a usual wrong count gives, its hint), first match wins."""
    share = (n - 1) / n * s  # one ring pass: a reduce-scatter, or an all-gather
    twice = ("A stage-3 unit's weights are freed after its forward (that is how ZeRO-3 "
             "saves them), so they must be all-gathered again before its backward")
    once = ("ZeRO-1 and -2 keep the weights whole: after the update each rank all-gathers "
            "the new slices once, no more")
    mistakes = {3: [(2 * share, "that is one all-reduce's bytes, DDP's: as if ZeRO-3 "
                     "gathered the weights once. " + twice),
                    (4 * share, "you counted the reduce-scatter as an all-reduce, as gloo "
                     "runs it; in a ring it sends (N-1)/N of the tensor")],
                 1: [(share, "after the update each rank holds only its own slice of the new "
                      "weights; how do the other ranks get it?"), (3 * share, once)],
                 0: [(share, "an all-reduce is a reduce-scatter and an all-gather: two ring "
                      "passes")]}
    mistakes[2] = mistakes[1]
    return [*mistakes[stage], (s * 2 * {0: 1, 1: 1, 2: 1, 3: 1.5}[stage],
                               "a ring pass sends (N-1)/N of the tensor, not all of it: a "
                               "rank never sends the chunk it ends with")]


@checker("06.2", "Write the body of ring_bytes_per_step(stage, weight_bytes, world_size), then "
                 "run this cell again.")
def check_zero_ring_bytes(ring_bytes_per_step: Callable[[int, int, int], float]) -> str:
    """Bytes one rank sends per step by the ring formula, DDP and ZeRO-1/2/3."""
    for stage, s, n in ring_cases():
        call = f"ring_bytes_per_step(stage={stage}, weight_bytes={s:,}, world_size={n})"
        got = _as_number(answer(ring_bytes_per_step, stage, s, n), call)
        want = step_ring_bytes(stage, s, n)
        if abs(got - want) <= 1:
            continue
        hint = ("one rank has no one to send to" if n == 1 else next(
            (h for value, h in _ring_mistakes(stage, s, n) if abs(got - value) <= 1),
            "list the collectives the stage issues for each weight in one step (the lesson's "
            "section 3 says which), then add up what each sends in a ring"))
        raise Wrong(f"{call} = {got:,.0f}; a rank sends {want:,.0f} bytes", hint)
    s, n = 4 * small_lm_params(), 8
    ratios = ", ".join(f"{RUNS[k]} {step_ring_bytes(k, s, n) / step_ring_bytes(0, s, n):g}"
                       for k in STAGES)
    return ("In all-reduces of the weights, by the ring formula: " + ratios + ". ZeRO-1 and -2 "
            "cut DDP's all-reduce in two: a reduce-scatter of the gradients, then an "
            "all-gather of the updated weights. ZeRO-3 frees each unit's weights after its "
            "forward and gathers them again for its backward: one more all-gather, half an "
            "all-reduce, the price of holding 1/N of the weights. FSDP2 with "
            "reshard_after_forward=False gathers once, and holds every unit whole until its "
            "backward (section 4).")
