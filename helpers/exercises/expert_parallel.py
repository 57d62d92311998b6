"""Checkers for the expert-parallelism lesson: 11.1 (the bytes one rank sends in a
dispatch all-to-all), 11.2 (which assignments capacity drops) and 11.3 (why the experts'
gradients are not all-reduced while the router's are). Each answer is checked against the
lesson's own code, run now: ``traffic.ep_traffic``, ``moe.keep_within_capacity``, and a
two-rank run of ``dispatch.ExpertParallelMoE`` against one device."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from numbers import Real

import torch

from helpers.exercises.feedback import Wrong, answer, checker, given
from helpers.expert_parallel.dispatch import ExpertParallelMoE, sum_replicated_grads
from helpers.expert_parallel.moe import MoEFFN, MoEShape, keep_within_capacity
from helpers.expert_parallel.traffic import ep_traffic, routing_matrix
from helpers.torchrun.in_notebook import run_ranks

# --- 11.1 -----------------------------------------------------------------------------------

# (counts (ep, E): each rank's rows per expert, hidden, element_bytes); the first tells the
# usual mistakes apart (E = 2 ep, so an expert's number is not its rank's)
SENT_CASES = (
    (torch.tensor([[7, 1, 4, 12], [3, 9, 2, 2]]), 64, 2),
    (torch.tensor([[5, 0, 3, 9, 2, 6, 1, 4], [8, 2, 0, 1, 7, 3, 5, 6],
                   [1, 1, 9, 4, 0, 2, 6, 3], [2, 7, 3, 3, 5, 0, 4, 8]]), 128, 4),
)


def _owner(experts: int, ep: int) -> torch.Tensor:
    """The rank that holds each expert: evenly, in order."""
    return torch.arange(experts) // (experts // ep)


def _sent_mistakes(counts: torch.Tensor, rank: int, hidden: int,
                   element_bytes: int) -> list[tuple[int, str]]:
    """(what a usual wrong count gives, its hint), the first match wins."""
    ep, experts = counts.shape
    matrix, row = routing_matrix(counts), hidden * element_bytes
    right = ep_traffic(matrix, rank, hidden, element_bytes, experts).dispatch
    round_robin = int(counts[rank][torch.arange(experts) % ep != rank].sum()) * row
    as_ranks = int(counts[rank][torch.arange(experts) != rank].sum()) * row
    return [
        (int(matrix[rank].sum()) * row, "the rows for this rank's own experts stay home: "
         "the all-to-all sends a rank nothing to itself"),
        (int(matrix[:, rank].sum() - matrix[rank, rank]) * row, "that is what the rank "
         "receives (a column of the routing matrix); it sends a row of it"),
        (right // element_bytes, "count bytes: each of a row's hidden elements takes "
         "element_bytes"),
        (right // hidden, "a row is a whole token vector, hidden elements of element_bytes each"),
        (2 * right, "one dispatch all-to-all, forward only: the backward sends the "
         "combine's gradient the same way, in an all-to-all of its own"),
        (right + int(matrix[:, rank].sum() - matrix[rank, rank]) * row, "the dispatch only: "
         "the combine, which sends the results back, is an all-to-all of its own"),
        (round_robin, "experts are split evenly, in order: rank r holds experts r E/ep to "
         "(r+1) E/ep - 1, not every ep-th expert"),
        (as_ranks, "an expert's number is not its rank's: with E/ep experts a rank, expert e "
         "lives on rank e // (E/ep)"),
    ]


def _as_number(got: object) -> float:
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, Real):
        raise Wrong(f"expected a number of bytes, got {type(got).__name__} {got!r}")
    return float(got)


@checker("11.1", "Write the body of bytes_sent(counts, rank, hidden, element_bytes), then "
         "run this cell again.")
def check_bytes_sent(bytes_sent) -> str:
    """Bytes one rank sends in the dispatch all-to-all, against ``traffic.ep_traffic``."""
    for counts, hidden, element_bytes in SENT_CASES:
        ep, experts = counts.shape
        for rank in range(ep):
            got = _as_number(answer(bytes_sent, counts.clone(), rank, hidden, element_bytes))
            want = ep_traffic(routing_matrix(counts), rank, hidden, element_bytes,
                              experts).dispatch
            if got != want:
                hint = next((h for value, h in _sent_mistakes(counts, rank, hidden,
                                                                element_bytes) if got == value),
                            "sum the rank's rows for the experts other ranks hold, times "
                            "hidden x element_bytes")
                raise Wrong(f"bytes_sent(<counts {ep}x{experts}>, rank={rank}, hidden={hidden}, "
                            f"element_bytes={element_bytes}) = {got:g}: not what the rank sends",
                            hint)
    counts, hidden, element_bytes = SENT_CASES[1]
    matrix = routing_matrix(counts)
    sent = [ep_traffic(matrix, r, hidden, element_bytes, 8).dispatch for r in range(4)]
    back = [ep_traffic(matrix, r, hidden, element_bytes, 8).combine for r in range(4)]
    return (f"in the 4-rank case the ranks send {sent} B in the dispatch and {back} B back in "
            "the combine. Unlike an all-reduce, whose bytes the tensor's size fixes, an "
            "all-to-all's bytes follow the router: they change every step, and the rank that "
            "receives the most sends the most back.")


# --- 11.2 -----------------------------------------------------------------------------------

# (expert choices (T, k), experts, capacity); each token's k experts distinct
DROP_CASES = (
    (torch.tensor([[0, 1], [1, 0], [0, 2], [1, 3], [0, 1], [2, 0], [1, 2], [3, 0]]), 4, 3),
    (torch.tensor([[2], [2], [0], [2], [1], [2], [3], [2], [0]]), 4, 2),
    (torch.tensor([[3, 0, 1], [0, 1, 2], [1, 0, 3], [0, 3, 2], [2, 0, 1]]), 4, 4),
    (torch.tensor([[0, 1], [1, 0], [2, 3]]), 4, 9),
)


def _drops(experts: torch.Tensor, num: int, capacity: int, *, slot_first: bool = False,
           last: bool = False) -> torch.Tensor:
    """A wrong (or, with the defaults, the right) way to pick the dropped assignments."""
    order = experts.t() if slot_first else experts
    flat = order.reshape(-1).flip(0) if last else order.reshape(-1)
    kept = keep_within_capacity(flat[:, None], capacity, num).reshape(-1)
    kept = kept.flip(0) if last else kept
    kept = kept.view_as(order)
    return ~(kept.t() if slot_first else kept)


def _drop_mistakes(experts: torch.Tensor, num: int, capacity: int) -> list[tuple[torch.Tensor, str]]:
    right = ~keep_within_capacity(experts, capacity, num)
    return [
        (~right, "return True where an assignment is dropped, False where it is kept"),
        (_drops(experts, num, capacity, slot_first=True), "go in token order: token 0's "
         "slots, then token 1's, and so on, not every token's first slot first"),
        (_drops(experts, num, capacity, last=True), "an expert keeps the first assignments "
         "in token order and drops the later ones"),
        (_drops(experts, num, capacity - 1), "an expert takes exactly capacity assignments: "
         "the (capacity + 1)-th is the first dropped"),
        (_drops(experts, num, capacity + 1), "an expert takes exactly capacity assignments: "
         "the (capacity + 1)-th is the first dropped"),
    ]


def _as_mask(got: object, shape: torch.Size) -> torch.Tensor:
    try:
        mask = torch.as_tensor(got)
    except (TypeError, ValueError, RuntimeError) as error:
        raise Wrong(f"expected a bool tensor of shape {tuple(shape)}, got "
                    f"{type(got).__name__}") from error
    if mask.shape != shape or not (mask.dtype == torch.bool or
                                   ((mask == 0) | (mask == 1)).all()):
        raise Wrong(f"expected a bool tensor of shape {tuple(shape)} (one entry per token and "
                    f"slot), got shape {tuple(mask.shape)}, dtype {mask.dtype}")
    return mask.bool()


@checker("11.2", "Write the body of capacity_drops(expert_choices, num_experts, capacity), "
         "then run this cell again.")
def check_capacity_drops(capacity_drops) -> str:
    """Which (token, slot) assignments capacity drops, against ``keep_within_capacity``."""
    for experts, num, capacity in DROP_CASES:
        got = _as_mask(answer(capacity_drops, experts.clone(), num, capacity), experts.shape)
        want = ~keep_within_capacity(experts, capacity, num)
        if not torch.equal(got, want):
            hint = next((h for value, h in _drop_mistakes(experts, num, capacity)
                         if torch.equal(got, value)),
                        "count each expert's assignments in (token, slot) order; from the "
                        "(capacity + 1)-th on, they are dropped")
            wrong = torch.nonzero(got != want).tolist()
            raise Wrong(f"capacity_drops(<choices {tuple(experts.shape)}>, {num}, {capacity}) is "
                        f"wrong at (token, slot) {wrong[:3]}", hint)
    experts, num, capacity = DROP_CASES[0]
    dropped = int((~keep_within_capacity(experts, capacity, num)).sum())
    return (f"with capacity {capacity}, {dropped} of the first case's {experts.numel()} "
            "assignments are dropped: each expert serves the first comers in token order. "
            "A dropped assignment adds nothing to its token's output; the residual connection "
            "carries the token on. Expert-parallel ranks receive the rows in the same order, "
            "so they drop the same ones.")


# --- 11.3 -----------------------------------------------------------------------------------

CHOICES = {
    "a": "An expert's weights are too large to all-reduce every step, so expert parallelism "
         "accepts expert gradients that miss the other ranks' tokens.",
    "b": "Each expert lives on one rank of the group, and the all-to-all's backward brought it "
         "the gradients of every rank's tokens routed to it: its gradient is already whole. "
         "The router is copied on every rank and each copy saw only its own tokens.",
    "c": "The experts' gradients are summed too, only inside the combine all-to-all's "
         "backward instead of by an all-reduce.",
    "d": "All-reducing the experts' gradients over the group would be harmless but wasted "
         "work: every rank would get the same expert gradients.",
}
RIGHT = "b"


@dataclass(frozen=True)
class GradientProof:
    """Two ranks against one device, float64, without any collective on the experts."""

    expert_diff: float  # max |expert gradient on its rank - one device's|
    router_partial: float  # rank 0's router gradient before the all-reduce, relative error
    router_summed: float  # after the all-reduce, max |difference|
    mixed: float  # relative change of expert 0's gradient if expert 2's were added to it


@functools.cache
def gradient_proof() -> GradientProof:
    """Run one MoE layer on two gloo thread ranks and on one device, and compare."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        moe = MoEFFN(MoEShape(hidden=8, ffn=12, experts=4, top_k=2), torch.float64)
        x, dout = torch.randn(2, 2, 6, 8, dtype=torch.float64)

    def work(rank: int, group) -> tuple[dict, torch.Tensor, torch.Tensor]:
        layer = ExpertParallelMoE(moe, group)
        out, _ = layer(x.chunk(2)[rank])
        (out * dout.chunk(2)[rank]).sum().backward()
        partial = layer.router.gate.weight.grad.clone()
        sum_replicated_grads(layer)
        experts = {n: p.grad.clone() for n, p in layer.experts.named_parameters()}
        return experts, partial, layer.router.gate.weight.grad.clone()

    ranks = run_ranks(2, work, timeout=30)
    for result in ranks:
        if isinstance(result, BaseException):
            raise result
    out, _ = moe(x)
    (out * dout).sum().backward()
    one = {n: p.grad for n, p in moe.experts.named_parameters()}
    router = moe.router.gate.weight.grad
    expert_diff = max((g - one[n]).abs().max().item() for r in ranks for n, g in r[0].items())
    name = "0.down_proj.weight"
    return GradientProof(
        expert_diff,
        ((ranks[0][1] - router).norm() / router.norm()).item(),
        max((r[2] - router).abs().max().item() for r in ranks),
        ((one["2.down_proj.weight"]).norm() / one[name].norm()).item())


def _within(diff: float) -> str:
    return "exactly" if diff == 0 else f"within {diff:.0e}"


@checker("11.3", "Set why_not_all_reduced to the letter of your answer, then run this cell "
         "again.")
def check_why_not_all_reduced(why_not_all_reduced: str) -> str:
    """Why the experts' gradients are not all-reduced over the expert-parallel group."""
    got = given(why_not_all_reduced)
    if not isinstance(got, str) or got.strip().lower() not in CHOICES:
        raise Wrong(f"why_not_all_reduced = {got!r}; valid: "
                    f"{', '.join(map(repr, CHOICES))}")
    choice, proof = got.strip().lower(), gradient_proof()
    hints = {
        "a": f"nothing is missed: on two ranks, each expert's gradient, with no collective on "
             f"it, equals one device's {_within(proof.expert_diff)}",
        "c": "the all-to-all's backward moves each row's activation gradient back to the rank "
             "the row came from; it adds nothing up. An expert's weight gradient is formed on "
             "its own rank, from the rows that arrived there",
        "d": "the ranks of the group hold different experts: an all-reduce would add expert 2's "
             f"gradient (rank 1) into expert 0's (rank 0), changing it by {proof.mixed:.0%}",
    }
    if choice != RIGHT:
        raise Wrong(f"({choice}) is not why", hints[choice])
    return (f"measured on two ranks: each expert's gradient, with no collective on it, equals "
            f"one device's {_within(proof.expert_diff)}; the router's gradient on rank 0 "
            f"alone is off by {proof.router_partial:.0%} (it misses rank 1's tokens), and after "
            f"the all-reduce equals one device's {_within(proof.router_summed)}. A weight is "
            "all-reduced over the ranks that hold copies of it: the router over the whole "
            "group; an expert only over its replicas, when ep < dp.")
