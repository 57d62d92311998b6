"""Checkers for lesson 07 (the tensor-parallel FFN)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from unittest import mock

import torch
import torch.distributed as dist

from helpers.exercises.feedback import NotSolved, Wrong, answer, checker, given, is_placeholder
from helpers.tensor_parallel import mappings as comm
from helpers.tensor_parallel.ffn import FeedForward, cut_shard
from helpers.tensor_parallel.mappings import ring_allreduce_bytes
from helpers.torchrun.in_notebook import run_ranks

TOLERANCE = 1e-5  # chosen: float32 sums of 2 partials in another order


def _ffn(hidden: int = 8, ffn: int = 16, seed: int = 0) -> FeedForward:
    torch.manual_seed(seed)
    return FeedForward(hidden, ffn)


def _rank_step(G: type, model: FeedForward, x: torch.Tensor, world_size: int):
    """One rank's forward and backward through ``g = G.apply`` with the lesson's ``f``."""

    def work(rank: int, group: object) -> dict:
        shard = cut_shard(model, world_size, rank)
        xr = x.clone().requires_grad_(True)
        out = G.apply(shard(comm.f(xr, group)), group)
        if is_placeholder(out):
            return {"unsolved": True}
        out.square().sum().backward()
        return {"out": out.detach(), "x_grad": xr.grad, "fc1_grad": shard.fc1.weight.grad,
                "fc2_grad": shard.fc2.weight.grad}

    return work


@checker("07.2", "Write forward and backward of AllReduceSum, then run this cell again.")
def check_g(G: type) -> str:
    """``G.apply(partial, group)`` as Megatron's g, in a 2-rank gloo group (threads)."""
    given(G)
    if not (isinstance(G, type) and issubclass(G, torch.autograd.Function)):
        raise Wrong(f"Expected a torch.autograd.Function subclass, got {G!r}")
    world_size = 2
    model = _ffn(seed=1)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2))
    xr = x.clone().requires_grad_(True)
    want = model(xr)
    want.square().sum().backward()
    results = run_ranks(world_size, _rank_step(G, model, x, world_size), timeout=30)
    for rank, result in enumerate(results):
        if isinstance(result, BaseException):
            raise Wrong(f"Rank {rank} raised {type(result).__name__}: {result}",
                        "these ranks have no default process group, so a collective reaches "
                        "only the group it is given: forward received it. And all_reduce writes "
                        "the sum into the tensor it is given, which autograd may still need: "
                        "the input handed to forward must stay as it was")
        if result.get("unsolved"):
            raise NotSolved
    per_rank = model.fc1.weight.shape[0] // world_size
    grads = list(zip(torch.split(model.fc1.weight.grad, per_rank, dim=0),
                     torch.split(model.fc2.weight.grad, per_rank, dim=1), strict=True))
    for rank, result in enumerate(results):
        diff = (result["out"] - want.detach()).abs().max().item()
        if diff > TOLERANCE:
            ratio = (result["out"].norm() / want.detach().norm()).item()
            raise Wrong(f"Forward: rank {rank}'s output differs from the FFN's by {diff:.2e} "
                        f"(norm ratio {ratio:.2f})",
                        "each rank holds a partial output; what makes it the full output?")
        for label, got, ref in (("input gradient", result["x_grad"], xr.grad),
                                ("fc1 gradient", result["fc1_grad"], grads[rank][0]),
                                ("fc2 gradient", result["fc2_grad"], grads[rank][1])):
            if got is None:
                raise Wrong(f"Backward: rank {rank} got no {label}",
                            "backward must return the gradient for partial (and None for group)")
            diff = (got - ref).abs().max().item()
            if diff > TOLERANCE:
                ratio = (got.norm() / ref.norm()).item()
                raise Wrong(f"Backward: rank {rank}'s {label} differs by {diff:.2e} (norm "
                            f"{ratio:.2f} times the reference's)",
                            "every rank already holds the gradient of the full output: what "
                            "must g's backward do to it?")
    return (f"Both ranks' outputs and gradients (input, fc1 and fc2 slices) match the "
            f"one-device FFN within {TOLERANCE:g}, with real gloo all-reduces between 2 ranks.")


def measured_step_bytes(tokens: int, hidden: int, world_size: int, layers: int) -> float:
    """Bytes rank 0 sends in one training step of ``layers`` stacked tensor-parallel FFNs,
    counted: every all-reduce that f and g run, priced as a ring all-reduce."""
    if world_size == 1:
        return 0.0
    sent = [0.0] * world_size
    lock = threading.Lock()
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        rank = kwargs["group"].rank() if kwargs.get("group") is not None else args[1].rank()
        with lock:
            sent[rank] += ring_allreduce_bytes(tensor.numel() * tensor.element_size(), world_size)
        return real(tensor, *args, **kwargs)

    models = [_ffn(hidden, 2 * hidden, seed=layer) for layer in range(layers)]
    x = torch.randn(tokens, hidden)

    def work(rank: int, group: object) -> None:
        out = x.clone().requires_grad_(True)
        for model in models:
            out = comm.tp_forward(cut_shard(model, world_size, rank), out, group)
        out.square().sum().backward()

    with mock.patch.object(comm.dist, "all_reduce", counting):
        results = run_ranks(world_size, work, timeout=30)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return sent[0]


@checker("07.3", "Write the body of step_bytes(tokens, hidden, world_size, layers), then run "
                 "this cell again.")
def check_step_bytes(step_bytes: Callable[[int, int, int, int], float]) -> str:
    """Bytes one rank sends in a training step, against all-reduces counted in a real run."""
    for tokens, hidden, p, layers in ((6, 8, 2, 1), (6, 8, 4, 3), (10, 16, 2, 2), (4, 8, 1, 2)):
        got = float(answer(step_bytes, tokens, hidden, p, layers))
        want = measured_step_bytes(tokens, hidden, p, layers)
        if abs(got - want) > 0.5:
            one = tokens * hidden * 4
            hint = ("the backward pass sends too: which operator all-reduces there, and what?"
                    if abs(2 * got - want) < 0.5 else
                    "in a ring all-reduce no rank sends the whole tensor at once: it sends "
                    "pieces of 1/p of it, one per step, in a reduce-scatter and then in an "
                    "all-gather (the cost section counts the steps)"
                    if abs(got - want * p / (2 * (p - 1))) < 0.5 else
                    "count the all-reduces of one FFN layer, forward and backward, and the "
                    f"bytes of each ({one:,} here)")
            raise Wrong(f"step_bytes(tokens={tokens}, hidden={hidden}, world_size={p}, "
                        f"layers={layers}) = {got:,.0f}; rank 0 sent {want:,.0f} bytes in the "
                        "counted run", hint)
    return ("Every case tried matches the all-reduces counted on real ranks. Per layer, both "
            "directions together send about 4 times the activation once p is large, whatever "
            "p is, while each rank's FLOPs fall as 1/p: the reason tensor parallelism stays "
            "on fast links.")


PLANS = ("column-row", "row-column")


def _plan_forward(plan: str, model: FeedForward, x: torch.Tensor, rank: int, p: int,
                  group: object) -> torch.Tensor:
    """One rank's forward of the FFN with a GeLU, every rank holding all of ``x``.

    column-row: Megatron's (``tp_forward`` of the rank's shard). row-column: fc1 cut by
    its input features (partial sums of every unit, added before the GeLU), fc2 by its
    output features (some output features per rank, gathered at the end)."""
    if plan == "column-row":
        return comm.tp_forward(cut_shard(model, p, rank, "gelu"), x, group)
    mine = slice(rank * x.shape[-1] // p, (rank + 1) * x.shape[-1] // p)
    partial = x[:, mine] @ model.fc1.weight[:, mine].detach().T
    dist.all_reduce(partial, group=group)  # the units must be whole before the GeLU
    out = torch.nn.functional.gelu(partial) @ model.fc2.weight[mine].detach().T
    pieces = [torch.empty_like(out) for _ in range(p)]
    dist.all_gather(pieces, out, group=group)  # every rank needs every output feature
    return torch.cat(pieces, dim=-1)


def counted_values(tokens: int, hidden: int, ffn: int, world_size: int, plan: str
                   ) -> tuple[int, float]:
    """(values rank 0's collectives returned in one forward of ``plan``, the largest |diff|
    of any rank's output from the whole FFN's), run on real ranks (threads)."""
    torch.manual_seed(3)
    model = FeedForward(hidden, ffn, activation="gelu")
    x = torch.randn(tokens, hidden)
    with torch.no_grad():
        want = model(x)
    if world_size == 1:
        return 0, (model(x) - want).abs().max().item()
    values = [0] * world_size
    lock = threading.Lock()
    real_reduce, real_gather = dist.all_reduce, dist.all_gather

    def reduce(tensor, *args, group=None, **kwargs):
        with lock:
            values[group.rank()] += tensor.numel()
        return real_reduce(tensor, *args, group=group, **kwargs)

    def gather(pieces, tensor, *args, group=None, **kwargs):
        with lock:
            values[group.rank()] += sum(t.numel() for t in pieces)
        return real_gather(pieces, tensor, *args, group=group, **kwargs)

    def work(rank: int, group: object) -> float:
        with torch.no_grad():
            out = _plan_forward(plan, model, x, rank, world_size, group)
        return (out - want).abs().max().item()

    with mock.patch.object(dist, "all_reduce", reduce), \
            mock.patch.object(dist, "all_gather", gather):
        results = run_ranks(world_size, work, timeout=30)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return values[0], max(results)


@checker("07.1", "Write the body of forward_values(tokens, hidden, ffn, world_size, plan), "
                 "then run this cell again.")
def check_forward_values(forward_values: Callable[[int, int, int, int, str], int]) -> str:
    """Values one rank's collectives return in a forward, for both ways of cutting the FFN,
    against the collectives counted on real ranks."""
    for tokens, hidden, ffn, p in ((6, 8, 32, 2), (4, 8, 16, 4), (5, 4, 16, 1)):
        for plan in PLANS:
            got = answer(forward_values, tokens, hidden, ffn, p, plan)
            want, diff = counted_values(tokens, hidden, ffn, p, plan)
            assert diff <= TOLERANCE, (plan, diff)  # both plans compute the FFN
            if isinstance(got, bool) or not isinstance(got, (int, float)) or got != want:
                out, inner = tokens * hidden, tokens * ffn
                hint = (
                    "one rank holds all of fc1 and fc2: no collective at all" if p == 1 else
                    "cut by its input features, fc1 leaves each rank a partial sum of every "
                    "inner unit, and GeLU of a partial sum is not a partial sum of the GeLU: "
                    "what must the ranks do before it?" if plan == "row-column" and got == out
                    else "cut by its output features, fc2 leaves each rank some columns of "
                    "the output; every rank needs all of them" if plan == "row-column"
                    and got == inner else
                    "between fc1 and fc2 each rank needs only the inner units it computed "
                    "itself, whole: count only what g sums" if plan == "column-row"
                    and got in (inner, out + inner, 2 * out) else
                    f"count each collective's result: {out} values of output, {inner} of "
                    "fc1's output, here")
                raise Wrong(f"forward_values(tokens={tokens}, hidden={hidden}, ffn={ffn}, "
                            f"world_size={p}, plan={plan!r}) = {got!r}; rank 0's collectives "
                            f"returned {want} values in the counted run", hint)
    return ("Both match the collectives counted on real ranks, and both plans compute the "
            "FFN. Megatron's column-row order leaves each rank whole inner units, so the GeLU "
            "is local and fc2's rows take exactly those units: one sum of the small output, "
            "tokens x hidden. Cut the other way, the ranks add tokens x ffn values before the "
            "GeLU and gather the output after it.")
