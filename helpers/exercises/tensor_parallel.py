"""Checkers for lesson 07 (the tensor-parallel FFN)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from unittest import mock

import torch
import torch.distributed as dist

from helpers.exercises.feedback import NotSolved, Wrong, answer, checker, given, is_placeholder
from helpers.tensor_parallel import mappings as comm
from helpers.tensor_parallel.ffn import FeedForward, cut_shard, split_weights
from helpers.tensor_parallel.mappings import ring_allreduce_bytes
from helpers.torchrun.in_notebook import run_ranks

TOLERANCE = 1e-5  # chosen: float32 sums of 2 partials in another order


def _ffn(hidden: int = 8, ffn: int = 16, seed: int = 0) -> FeedForward:
    torch.manual_seed(seed)
    return FeedForward(hidden, ffn)


@checker("07.1", "Write the body of my_shard(fc1_weight, fc2_weight, rank, world_size), then run "
                 "this cell again.")
def check_my_shard(my_shard: Callable) -> str:
    """A rank's slices of fc1 and fc2, against ``split_weights``."""
    model = _ffn()
    fc1, fc2 = model.fc1.weight.detach(), model.fc2.weight.detach()
    for world_size in (1, 2, 4):
        for rank, (want1, want2) in enumerate(split_weights(model, world_size)):
            got = answer(my_shard, fc1, fc2, rank, world_size)
            try:
                got1, got2 = got
            except (TypeError, ValueError) as error:
                raise Wrong(f"my_shard returned {type(got).__name__}; expected a pair "
                            "(fc1 part, fc2 part)") from error
            call = f"my_shard(rank={rank}, world_size={world_size})"
            for label, g, w, hint in (
                ("fc1", got1, want1, "fc1's output features are the FFN's inner units (ffn_size): "
                 "split them, so each rank computes some whole units"),
                ("fc2", got2, want2, "fc2 must take exactly the inner units this rank computed "
                 "as its input features"),
            ):
                if not isinstance(g, torch.Tensor):
                    raise Wrong(f"{call}: the {label} part is a {type(g).__name__}; expected a "
                                "tensor (a slice of the weight)")
                if tuple(g.shape) != tuple(w.shape):
                    raise Wrong(f"{call}: the {label} part has shape {tuple(g.shape)}; a rank "
                                f"of {world_size} needs {tuple(w.shape)}", hint)
                if not torch.equal(g, w):
                    raise Wrong(f"{call}: the {label} part has the right shape but other "
                                "values", f"which slice belongs to rank {rank}? {hint}")
    return ("Each rank's slices are exactly split_weights'. fc1 is split by rows "
            "(column-parallel), fc2 by columns (row-parallel).")


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
