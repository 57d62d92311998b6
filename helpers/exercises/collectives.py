"""Checker for lesson 06's exercise 06.3: reduce-scatter written from other collectives."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from unittest import mock

import torch
import torch.distributed as dist

from helpers.exercises.feedback import NotSolved, Wrong, checker, given, is_placeholder
from helpers.torchrun.in_notebook import registered, run_ranks

# each case is (world size, elements of the flat input)
RS_CASES = ((2, 6), (4, 12))
RS_TIMEOUT = 10.0  # seconds a rank may wait for its peers before the check calls it stuck
# the reference, bound now: the learner's calls of the library's own are watched (patched)
_LIBRARY_RS = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_LIBRARY_NAMES = ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter")


# --- 06.3 -----------------------------------------------------------------------------------


@contextlib.contextmanager
def library_calls_counted() -> Iterator[list[str]]:
    """Count (and still run) the library's own reduce-scatters while the learner's code runs."""
    used: list[str] = []
    lock = threading.Lock()

    def counted(name: str, real: Callable) -> Callable:
        def call(*args, **kwargs):
            with lock:
                used.append(name)
            return real(*args, **kwargs)
        return call

    with contextlib.ExitStack() as stack:
        for name in _LIBRARY_NAMES:
            if hasattr(dist, name):
                stack.enter_context(mock.patch.object(dist, name, counted(name, getattr(dist, name))))
        yield used


def rank_inputs(world_size: int, numel: int) -> list[torch.Tensor]:
    """Each rank's flat input: small whole numbers, so every sum is exact in float32."""
    gen = torch.Generator().manual_seed(world_size)
    return [torch.randint(-9, 10, (numel,), generator=gen).float() for _ in range(world_size)]


def _rs_work(my_reduce_scatter: Callable, inputs: list[torch.Tensor]) -> Callable:
    """One rank: the library's reduce-scatter, then the learner's on an untouched copy."""
    world_size = len(inputs)

    def work(rank: int, group: object) -> dict:
        want = torch.empty(inputs[rank].numel() // world_size)
        _LIBRARY_RS(want, inputs[rank].clone(), group=group)
        full = inputs[rank].clone()
        with registered(group):
            got = my_reduce_scatter(full, rank, world_size, group)
        return {"got": got, "want": want, "after": full}

    return work


def _stuck(error: BaseException) -> bool:
    return isinstance(error, TimeoutError) or "timed out" in str(error).lower()


def _peer_gone(error: BaseException) -> bool:
    return "connection closed" in str(error).lower()


def _raise_rank_error(results: list[object], world_size: int) -> None:
    errors = [(r, e) for r, e in enumerate(results) if isinstance(e, BaseException)]
    if not errors:
        return
    if any(isinstance(e, NotImplementedError) for _, e in errors):
        raise NotSolved
    first = [(r, e) for r, e in errors if not _stuck(e) and not _peer_gone(e)]
    stuck = [r for r, e in errors if _stuck(e)]
    if stuck and not first:
        raise Wrong(f"With {world_size} ranks, rank {stuck[0]} waited {RS_TIMEOUT:g} s for a "
                    "peer that never answered",
                    "a blocking dist.send waits for its matching recv: if every rank sends "
                    "first, each waits for a neighbour that is itself waiting. Some rank must "
                    "be receiving while its neighbour sends (a send that does not block, "
                    "dist.isend, is one way)")
    rank, error = (first or errors)[0]
    hint = ("these ranks have no default group: use the rank and world_size arguments, and "
            "pass group=group to every call" if "default process group" in str(error).lower()
            else "pass group=group to every call; dist.send and dist.recv want contiguous "
            "tensors of the same shape on both ends")
    raise Wrong(f"With {world_size} ranks, rank {rank} raised {type(error).__name__}: {error}",
                hint)


def _check_rank(result: dict, rank: int, world_size: int, total: torch.Tensor) -> None:
    got, want = result["got"], result["want"]
    call = f"my_reduce_scatter(rank={rank}, world_size={world_size})"
    if not isinstance(got, torch.Tensor):
        raise Wrong(f"{call} returned {type(got).__name__}; expected a tensor")
    if got.shape == total.shape and torch.equal(got, total):
        raise Wrong(f"{call} returned the whole sum, {tuple(got.shape)}",
                    f"rank r keeps only chunk r of the sum, 1/{world_size} of it")
    if got.shape != want.shape:
        raise Wrong(f"{call} returned shape {tuple(got.shape)}; its chunk is {tuple(want.shape)}")
    chunks = total.chunk(world_size)
    other = next((k for k, c in enumerate(chunks) if k != rank and torch.equal(got, c)), None)
    if other is not None:
        raise Wrong(f"{call} returned chunk {other} of the sum",
                    f"rank r keeps chunk r (elements r*{want.numel()} to "
                    f"(r+1)*{want.numel()}), as dist.reduce_scatter_single does")
    if torch.allclose(got * world_size, want):
        raise Wrong(f"{call} returned the mean of the ranks' chunks, not their sum",
                    "reduce-scatter sums (ReduceOp.SUM); averaging, as DDP does for "
                    "gradients, is a division by N of its own, after the collective")
    if not torch.equal(got, want):
        raise Wrong(f"{call} differs from dist.reduce_scatter_single by "
                    f"{(got - want).abs().max().item():g}",
                    "after the last step, chunk r of rank r must hold the sum of every rank's "
                    "chunk r")


def _check_untouched(result: dict, rank: int, world_size: int, given_input: torch.Tensor) -> None:
    if not torch.equal(result["after"], given_input):
        raise Wrong(f"Right chunks, but with {world_size} ranks rank {rank}'s input tensor "
                    "was changed",
                    "dist.all_reduce and recv write into the tensor you give them, and this one "
                    "belongs to the caller, who may still need it (to clip or log its local "
                    "gradients, or to accumulate the next micro-batch): the library's "
                    "reduce-scatter leaves it as it was")


@checker("06.3", "Write the body of my_reduce_scatter(full, rank, world_size, group), then run "
                 "this cell again.")
def check_my_reduce_scatter(my_reduce_scatter: Callable) -> str:
    """The learner's reduce-scatter on real gloo ranks, against the library's."""
    given(my_reduce_scatter)
    if not callable(my_reduce_scatter):
        raise Wrong(f"Expected a function, got {type(my_reduce_scatter).__name__}")
    for world_size, numel in RS_CASES:
        inputs = rank_inputs(world_size, numel)
        with library_calls_counted() as used:
            results = run_ranks(world_size, _rs_work(my_reduce_scatter, inputs),
                                timeout=RS_TIMEOUT)
        _raise_rank_error(results, world_size)
        if any(is_placeholder(r["got"]) for r in results):
            raise NotSolved
        if used:
            raise Wrong(f"my_reduce_scatter calls dist.{used[0]}, the library's own "
                        "reduce-scatter", "build it from dist.all_reduce, or from "
                        "dist.send/recv (isend/irecv) between neighbours")
        total = torch.stack(inputs).sum(dim=0)
        for rank, result in enumerate(results):
            _check_rank(result, rank, world_size, total)
            _check_untouched(result, rank, world_size, inputs[rank])
    cases = " and ".join(str(n) for n, _ in RS_CASES)
    return (f"Every rank's chunk equals dist.reduce_scatter_single's, on {cases} real gloo "
            "ranks, and the inputs are untouched. A ring (NCCL's) sends (N-1)/N of the tensor "
            "per rank; an all-reduce followed by slicing, which is how gloo runs its own "
            "reduce-scatter, sends twice that.")
