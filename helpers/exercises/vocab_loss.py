"""Checker for lesson 09's exercise 09.3: the vocab-parallel cross-entropy from three
all-reduces, run on real gloo ranks (threads, as 06.3) and compared with ``F.cross_entropy``."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.exercises.collectives import _peer_gone, _stuck
from helpers.exercises.feedback import NotSolved, Wrong, checker, given, is_placeholder
from helpers.torchrun.in_notebook import registered, run_ranks

# (ranks, logit scale): at scale 100, exp of an unshifted logit overflows float32 (> 88.7)
LOSS_CASES = ((2, 1.0), (4, 100.0))
TOKENS, PER_RANK = 8, 5  # a rank's slice of the vocabulary: PER_RANK columns
LOSS_RTOL = 1e-5  # relative: float32 sums in another order
LOSS_TIMEOUT = 10.0  # seconds a rank may wait for its peers
_GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single", "_all_gather_base",
            "all_gather_object", "gather", "all_to_all", "all_to_all_single")


@contextlib.contextmanager
def calls_watched() -> Iterator[dict]:
    """Watch (and still run) the collectives: each thread's all-reduced element counts, and
    the gathers called."""
    seen: dict = {"all_reduce": {}, "gathers": []}
    lock = threading.Lock()
    real_all_reduce = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        with lock:
            seen["all_reduce"].setdefault(threading.get_ident(), []).append(tensor.numel())
        return real_all_reduce(tensor, *args, **kwargs)

    def watched(name: str, real: Callable) -> Callable:
        def call(*args, **kwargs):
            with lock:
                seen["gathers"].append(name)
            return real(*args, **kwargs)
        return call

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(dist, "all_reduce", all_reduce))
        for name in _GATHERS:
            if hasattr(dist, name):
                stack.enter_context(mock.patch.object(dist, name, watched(name, getattr(dist, name))))
        yield seen


def loss_inputs(world_size: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Full logits (TOKENS, world_size * PER_RANK) and targets, some in every rank's slice
    (the last column's among them)."""
    gen = torch.Generator().manual_seed(world_size)
    vocab = world_size * PER_RANK
    logits = torch.randn(TOKENS, vocab, generator=gen) * scale
    targets = torch.randint(vocab, (TOKENS,), generator=gen)
    targets[:world_size] = torch.arange(world_size) * PER_RANK + torch.arange(world_size)
    targets[-1] = vocab - 1
    return logits, targets


def mistaken_losses(logits: torch.Tensor, targets: torch.Tensor, world_size: int
                    ) -> list[tuple[list[float], str]]:
    """(each rank's loss, hint) of the usual mistakes, computed here in one process."""
    slices = logits.chunk(world_size, dim=1)
    rows = torch.arange(len(targets))
    owner = targets // PER_RANK
    m = logits.max(dim=1).values
    local_m = [s.max(dim=1).values for s in slices]
    sums = [(s - m[:, None]).exp().sum(dim=1) for s in slices]
    total = torch.stack(sums).sum(dim=0)
    target = logits[rows, targets] - m
    mine = [torch.where(owner == r, target, 0.0) for r in range(world_size)]
    local = (sum((s - lm[:, None]).exp().sum(dim=1) for s, lm in zip(slices, local_m, strict=True))
             .log() - (logits[rows, targets] - torch.stack(local_m)[owner, rows]))
    right = total.log() - target

    def same(loss: torch.Tensor) -> list[float]:
        return [loss.mean().item()] * world_size

    return [
        ([(total.log() - t).mean().item() for t in mine], "the target logit lives in one "
         "rank's columns only, yet every rank needs it for its loss: how can the rank that "
         "holds it share it, when the others can contribute nothing?"),
        ([(s.log() - target).mean().item() for s in sums], "softmax's denominator runs over "
         "the whole vocabulary, and each rank's sum of exponentials covers only its slice"),
        (same(local), "exponentials from different ranks can be added only if every rank "
         "shifted its logits by the same number; each rank's own maximum differs from rank to "
         "rank, the row's maximum over the whole vocabulary does not"),
        (same(total.log() - logits[rows, targets]), "the log of the shifted exponentials is "
         "the log-sum-exp less the shift: the target logit must be measured from the same "
         "shift"),
        ([right.sum().item()] * world_size, "F.cross_entropy averages over the tokens (its "
         "reduction='mean'); this is their sum"),
    ]


def _loss_work(my_loss: Callable, logits: torch.Tensor, targets: torch.Tensor) -> Callable:
    """One rank: the learner's loss from this rank's columns of the logits."""
    def work(rank: int, group: object) -> object:
        start, end = rank * PER_RANK, (rank + 1) * PER_RANK
        with registered(group):
            return my_loss(logits[:, start:end].clone(), targets.clone(), start, end, group)

    return work


def _raise_rank_error(results: list[object], world_size: int) -> None:
    errors = [(r, e) for r, e in enumerate(results) if isinstance(e, BaseException)]
    if not errors:
        return
    if any(isinstance(e, NotImplementedError) for _, e in errors):
        raise NotSolved
    first = [(r, e) for r, e in errors if not _stuck(e) and not _peer_gone(e)
             and "connection reset" not in str(e).lower()]  # a peer that gave up waiting
    if not first and any(_stuck(e) for _, e in errors):
        raise Wrong(f"With {world_size} ranks, rank {errors[0][0]} waited {LOSS_TIMEOUT:g} s "
                    "for a peer that never answered",
                    "every rank must make the same all-reduces in the same order, even a rank "
                    "that holds none of the targets")
    rank, error = (first or errors)[0]
    text = str(error).lower()
    hint = ("these ranks have no default group: pass group=group to every call"
            if "default process group" in text else
            "only targets in [start, end) are columns of local_logits, counted from start: a "
            "target outside them is on another rank, and must not index this one's columns"
            if isinstance(error, IndexError) or "index" in text else
            "pass group=group to every call; dist.all_reduce works in place, on a tensor")
    raise Wrong(f"With {world_size} ranks, rank {rank} raised {type(error).__name__}: {error}",
                hint)


def _check_calls(seen: dict, world_size: int) -> None:
    if seen["gathers"]:
        raise Wrong(f"my_vocab_parallel_loss calls dist.{seen['gathers'][0]}",
                    "gathering the logits is what the vocab-parallel loss avoids: all-reduce "
                    "one number per token instead (the max, the sum of exponentials, the "
                    "target logit)")
    counts = seen["all_reduce"].values()
    calls, numel = max(map(len, counts), default=0), max(map(sum, counts), default=0)
    if calls > 3 or numel > 3 * TOKENS:
        raise Wrong(f"With {world_size} ranks, a rank all-reduced {numel} numbers in {calls} "
                    f"call{'s' * (calls != 1)}, for {TOKENS} tokens",
                    "three all-reduces of one number per token carry all softmax needs: the "
                    "row's max (MAX), the sum of exponentials (SUM), the target logit (SUM)")


def _check_value(got: object, rank: int, world_size: int, want: float,
                 mistakes: list[tuple[list[float], str]]) -> None:
    call = f"my_vocab_parallel_loss on rank {rank} of {world_size}"
    if not isinstance(got, torch.Tensor):
        raise Wrong(f"{call} returned {type(got).__name__}; expected a tensor (the mean loss)")
    if got.numel() == TOKENS:
        raise Wrong(f"{call} returned one loss per token, shape {tuple(got.shape)}",
                    "return their mean over the tokens, as F.cross_entropy does")
    if got.numel() != 1:
        raise Wrong(f"{call} returned shape {tuple(got.shape)}; expected one number")
    value = got.detach().float().item()
    if not torch.isfinite(torch.tensor(value)):
        raise Wrong(f"{call} returned {value} for logits in the hundreds",
                    "exp overflows float32 past 88.7. Softmax does not change when every "
                    "logit of a row moves by the same amount, so the row's maximum (over the "
                    "whole vocabulary) can be moved to 0 first; small logits hide this")
    if abs(value - want) <= LOSS_RTOL * abs(want):
        return
    hint = next((h for losses, h in mistakes
                 if abs(value - losses[rank]) <= 1e-4 * max(1.0, abs(losses[rank]))),
                "per token, cross-entropy is the log of softmax's denominator less the "
                "target's logit, both measured from one shift; each needs the whole "
                "vocabulary, which no rank holds alone")
    raise Wrong(f"{call} = {value:.6g}; F.cross_entropy on the full logits gives {want:.6g}",
                hint)


@checker("09.3", "Write the body of my_vocab_parallel_loss(local_logits, targets, start, end, "
                 "group), then run this cell again.")
def check_my_vocab_parallel_loss(my_vocab_parallel_loss: Callable) -> str:
    """The learner's loss on real gloo ranks, each against ``F.cross_entropy``."""
    given(my_vocab_parallel_loss)
    if not callable(my_vocab_parallel_loss):
        raise Wrong(f"Expected a function, got {type(my_vocab_parallel_loss).__name__}")
    for world_size, scale in LOSS_CASES:
        logits, targets = loss_inputs(world_size, scale)
        with calls_watched() as seen:
            results = run_ranks(world_size, _loss_work(my_vocab_parallel_loss, logits, targets),
                                timeout=LOSS_TIMEOUT)
        _raise_rank_error(results, world_size)
        if any(is_placeholder(r) for r in results):
            raise NotSolved
        _check_calls(seen, world_size)
        want = F.cross_entropy(logits, targets).item()
        mistakes = mistaken_losses(logits, targets, world_size)
        for rank, got in enumerate(results):
            _check_value(got, rank, world_size, want, mistakes)
    return (f"Every rank's loss equals F.cross_entropy on the full logits (within "
            f"{LOSS_RTOL:g}, relative), on {LOSS_CASES[0][0]} and {LOSS_CASES[1][0]} real gloo "
            "ranks, logits in the hundreds included. Each rank all-reduced 3 numbers per token; "
            "gathering the logits would move the whole vocabulary per token (32,000 numbers "
            "for Llama-7B).")
