"""Checker for lesson 10's exercise 10.1: which ranks a ``(pp, dp, tp)`` ``DeviceMesh`` groups.

The reference is PyTorch itself, not a formula: for every rank of a layout, one *fake*
process group (backend ``"fake"``: a single process, no communication) stands in for that
rank, ``init_device_mesh`` builds the mesh, and ``mesh[dim]`` is the group along ``dim``
that holds the rank. Every group built is destroyed before the check returns.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
from collections.abc import Callable, Iterator
from numbers import Integral

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from helpers.exercises.feedback import NotSolved, Wrong, answer, checker, given, is_placeholder

Groups = dict[str, list[list[int]]]
DIMS = ("pp", "dp", "tp")  # outermost first, as lesson 10's mesh names them
GPUS_PER_NODE = 8
NODE_LAYOUT = (2, 4, 8)  # 64 GPUs on 8 nodes: the success message counts nodes per group
LAYOUTS = ((2, 2, 2), (1, 2, 2), (2, 1, 4), (4, 2, 1), (3, 2, 2), NODE_LAYOUT)
ROW_MAJOR = ("the mesh takes the ranks row-major, as a tensor's elements lie in memory: the "
             "dimension named last, tp, is the innermost and varies fastest in the rank "
             "numbering, the one named first, pp, slowest")
GROUP = "a group along one dimension holds the ranks that differ only in that dimension's index"


@contextlib.contextmanager
def _fake_rank(rank: int, world_size: int) -> Iterator[None]:
    """This process plays ``rank`` of ``world_size`` in a fake default process group.

    ``init_process_group`` also wraps ``sys.excepthook`` (to prefix tracebacks with the
    rank) and never unwraps it; the hook is put back, so that checks leave no trace."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    hook = sys.excepthook
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def _refuse_a_live_group() -> None:
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process; this "
                           "check plays each rank in a fake one of its own: call "
                           "torch.distributed.destroy_process_group() or restart the kernel")


def torch_groups(pp: int, dp: int, tp: int) -> Groups:
    """The groups ``init_device_mesh`` forms along each dimension of a ``(pp, dp, tp)``
    mesh, read from PyTorch rank by rank; each group sorted, the groups sorted."""
    _refuse_a_live_group()
    world_size = pp * dp * tp
    found: dict[str, set[tuple[int, ...]]] = {dim: set() for dim in DIMS}
    for rank in range(world_size):
        with _fake_rank(rank, world_size):
            mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=DIMS)
            for dim in DIMS:
                found[dim].add(tuple(mesh[dim].mesh.tolist()))
    return {dim: [list(group) for group in sorted(found[dim])] for dim in DIMS}


def _normal(got: object, call: str) -> Groups:
    """The answer with each group sorted and the groups sorted; a malformed one refused."""
    shape = "a dict from 'pp', 'dp' and 'tp' to lists of groups, each a list of ranks"
    if not isinstance(got, dict):
        raise Wrong(f"{call} returned {type(got).__name__} {got!r}; expected {shape}")
    if sorted(map(str, got)) != sorted(DIMS):
        raise Wrong(f"{call} has the keys {', '.join(map(repr, got)) or 'none'}; expected "
                    f"{shape}",
                    "one key per mesh dimension name: 'pp', 'dp' and 'tp'")
    if any(is_placeholder(got[dim]) for dim in DIMS):
        raise NotSolved
    normal = {}
    for dim in DIMS:
        groups = got[dim]
        if not isinstance(groups, list | tuple) or not all(
                isinstance(g, list | tuple) and all(
                    isinstance(r, Integral) and not isinstance(r, bool) for r in g)
                for g in groups):
            raise Wrong(f"{call}[{dim!r}] = {groups!r}; expected a list of groups, each a "
                        "list of ranks (integers), e.g. [[0, 1], [2, 3]]")
        normal[dim] = sorted(sorted(int(r) for r in g) for g in groups)
    return normal


def _groups_in_order(sizes: dict[str, int], order: tuple[str, ...], dim: str) -> list[list[int]]:
    """The groups along ``dim`` if the ranks were numbered with ``order``'s last dimension
    varying fastest; each sorted, the groups sorted."""
    grid = torch.arange(math.prod(sizes.values())).reshape([sizes[d] for d in order])
    moved = grid.movedim(order.index(dim), -1).reshape(-1, sizes[dim])
    return sorted(sorted(g) for g in moved.tolist())


def _hint(dim: str, got: list[list[int]], want: Groups, sizes: dict[str, int]) -> str:
    """Why ``got`` is not PyTorch's groups along ``dim``: the misconception it shows, then
    the principle."""
    other = next((d for d in DIMS if d != dim and want[d] == got), None)
    if other:
        return f"those are the {other} groups; {GROUP}; {ROW_MAJOR}"
    if all(len(g) == 1 for g in want[dim]):
        return ("a dimension of size 1 still forms groups: one per rank, holding that rank "
                "alone")
    world_size = math.prod(sizes.values())
    if sorted(r for g in got for r in g) != list(range(world_size)):
        return (f"the groups along one dimension split all {world_size} ranks: each rank is "
                f"in exactly one of them")
    orders = [order for order in itertools.permutations(DIMS)
              if order != DIMS and _groups_in_order(sizes, order, dim) == got]
    if orders:
        # a dimension of size 1 varies at no speed: leave it out of the ordering
        real = [tuple(d for d in order if sizes[d] > 1) for order in orders]
        fastest = {order[-1] for order in real if order}
        slowest = {order[0] for order in real if order}
        if len(set(real)) == 1 and len(real[0]) > 1:  # one ordering explains them
            return (f"those groups number the ranks with {real[0][-1]} varying fastest "
                    f"and {real[0][0]} slowest; {ROW_MAJOR}")
        if len(fastest) == 1:  # several do: say only what they share
            return (f"those groups number the ranks with {fastest.pop()} varying fastest; "
                    f"{ROW_MAJOR}")
        if len(slowest) == 1:
            return (f"those groups number the ranks with {slowest.pop()} varying slowest; "
                    f"{ROW_MAJOR}")
    return f"{GROUP}; {ROW_MAJOR}"


def _spans(groups: list[list[int]]) -> set[int]:
    """How many nodes of ``GPUS_PER_NODE`` consecutive ranks each group spans."""
    return {len({r // GPUS_PER_NODE for r in g}) for g in groups}


def _nodes(count: set[int]) -> str:
    return "one node" if count == {1} else "/".join(map(str, sorted(count))) + " nodes"


@checker("10.1", "Write the body of mesh_groups(pp, dp, tp), then run this cell again.")
def check_mesh_groups(mesh_groups: Callable[[int, int, int], Groups]) -> str:
    """The groups of a ``(pp, dp, tp)`` mesh, against the ones PyTorch's ``DeviceMesh`` forms."""
    given(mesh_groups)
    _refuse_a_live_group()
    wants, hook = {}, sys.excepthook
    try:
        for pp, dp, tp in LAYOUTS:
            want = wants[pp, dp, tp] = torch_groups(pp, dp, tp)
            call = f"mesh_groups(pp={pp}, dp={dp}, tp={tp})"
            got = answer(mesh_groups, pp, dp, tp)
            if dist.is_initialized():
                raise Wrong(f"{call} left a process group initialised",
                            "destroy what the function creates before it returns")
            got = _normal(got, call)
            for dim in DIMS:
                if got[dim] != want[dim]:
                    raise Wrong(f"For (pp, dp, tp) = ({pp}, {dp}, {tp}), {call}[{dim!r}] = "
                                f"{got[dim]}; PyTorch's DeviceMesh forms {want[dim]}",
                                _hint(dim, got[dim], want, {"pp": pp, "dp": dp, "tp": tp}))
    finally:
        if dist.is_initialized():  # one the answer left behind: none was there before
            dist.destroy_process_group()
        sys.excepthook = hook
    pp, dp, tp = NODE_LAYOUT
    spans = {dim: _nodes(_spans(wants[NODE_LAYOUT][dim])) for dim in DIMS}
    return (f"Every group is the one PyTorch's DeviceMesh forms, in {len(LAYOUTS)} layouts. "
            f"On nodes of {GPUS_PER_NODE} GPUs (ranks numbered node by node), a "
            f"(pp, dp, tp) = ({pp}, {dp}, {tp}) mesh of {pp * dp * tp} ranks keeps each tp "
            f"group within {spans['tp']}, on its fast links, while each dp group spans "
            f"{spans['dp']} and each pp group {spans['pp']}: the innermost dimension is the "
            "one that stays inside a node.")
