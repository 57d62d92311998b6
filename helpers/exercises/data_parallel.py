"""Checkers for lesson 06 (data parallelism and ZeRO sharding), exercises 06.1 and 06.2;
06.3 (a reduce-scatter of your own) is in ``helpers.exercises.collectives``."""

from __future__ import annotations

from collections.abc import Callable
from numbers import Real

from helpers.core.sizes import format_bytes
from helpers.exercises.feedback import Wrong, answer, checker, given
from helpers.memory import LLAMA_7B_SHAPE, TransformerShape, estimate_training_memory
from helpers.profiles import get_profile

# Mixed-precision Adam in the ZeRO paper's accounting: bytes per parameter.
WEIGHT_BYTES, GRAD_BYTES, STATE_BYTES = 2, 2, 12

# Exercise 06.2: Llama-7B, data parallel over DP cards of CARD bytes, one sequence each.
DP, CARD, SEQ, BATCH = 8, 24 * 2**30, 4096, 1
STAGES = (0, 1, 2, 3)
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
            f"part. Section 7's table puts {format_bytes(table)} in its weights, grads and "
            "optimizer columns: the estimator also counts the one block whose whole gradient "
            "a rank holds while it is reduce-scattered "
            f"({format_bytes(block)}), and Adam's step counters "
            f"({table - mine - block:,.0f} B).")


# --- 06.2 -----------------------------------------------------------------------------------


def estimated_states(stage: int) -> int:
    """Bytes of weights, grads and optimizer state per GPU for Llama-7B on ``DP`` GPUs
    under ZeRO-``stage``, by the course's estimator (section 7's table)."""
    row = estimate_training_memory(LLAMA_7B_SHAPE, batch=BATCH, seq=SEQ, optimizer="adam",
                                   precision="mixed", dp=DP, zero=stage).sum()
    return row.weights + row.grads + row.optimizer_state


def zero_stage_total(stage: int) -> int:
    """Bytes per GPU for exercise 06.2's Llama-7B run under ZeRO-``stage`` (the estimator's)."""
    ledger = estimate_training_memory(LLAMA_7B_SHAPE, batch=BATCH, seq=SEQ, optimizer="adam",
                                      precision="mixed", dp=DP, zero=stage, recompute=True)
    return ledger.sum().total


def smallest_fitting_stage() -> int:
    """The smallest ZeRO stage whose per-GPU total fits the card."""
    for stage in STAGES:
        if zero_stage_total(stage) <= CARD:
            return stage
    raise ValueError(f"no ZeRO stage fits {format_bytes(CARD)}")


def stage_table() -> str:
    """Each stage's per-GPU total, in one line."""
    return "; ".join(f"ZeRO-{k}{' (DDP)' if k == 0 else ''}: "
                     f"{format_bytes(zero_stage_total(k))}" for k in STAGES)


@checker("06.2", "Set smallest_zero_stage_7b to a stage (0 to 3), then run this cell again.")
def check_smallest_zero_stage_7b(smallest_zero_stage_7b: int) -> str:
    """The smallest ZeRO stage with which Llama-7B trains on 8 cards of 24 GiB."""
    got = given(smallest_zero_stage_7b)
    if isinstance(got, bool) or not isinstance(got, int) or got not in STAGES:
        raise Wrong(f"smallest_zero_stage_7b = {got!r}; expected a stage: 0 (plain DDP), 1, "
                    "2 or 3")
    want = smallest_fitting_stage()
    if got < want:
        raise Wrong(f"With ZeRO-{got} each GPU would need {format_bytes(zero_stage_total(got))}, "
                    f"over {format_bytes(CARD)}",
                    "each stage shards one more kind over the GPUs (1: the optimizer state, "
                    "2: the gradients too, 3: the weights too), so a higher stage never needs "
                    "more: ask the estimator about the stages above this one")
    if got > want:
        raise Wrong(f"ZeRO-{got} fits ({format_bytes(zero_stage_total(got))} per GPU), but a "
                    "smaller stage fits too",
                    "the question asks for the smallest stage that fits: prefer it, as every "
                    "stage adds bookkeeping and in a ring (NCCL) ZeRO-3 sends 1.5 times DDP's "
                    "bytes. Ask the estimator about the stages below this one")
    return f"ZeRO-{want} is the smallest stage that fits: {stage_table()}.{_why(want)}"


def _why(stage: int) -> str:
    """What the stage below lacked, when the answer is the last stage."""
    if stage != 3:
        return ""
    weights = format_bytes(WEIGHT_BYTES * LLAMA_7B_SHAPE.parameters())
    return (f" Under ZeRO-2 every card still holds all the 16-bit weights, {weights}; ZeRO-3 "
            f"keeps 1/{DP} of them and gathers each layer's only while it runs, for 1.5 times "
            "DDP's traffic in a ring (NCCL).")
