"""Checker for lesson 13's exercise 13.1: which ranks a ``(pp, dp, tp)`` ``DeviceMesh`` groups.

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

from helpers.core.sizes import format_bytes
from helpers.exercises.feedback import NotSolved, Wrong, answer, checker, given, is_placeholder

Groups = dict[str, list[list[int]]]
DIMS = ("pp", "dp", "tp")  # outermost first, as lesson 13's mesh names them
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


def _spans(groups: list[list[int]], per_node: int = GPUS_PER_NODE) -> set[int]:
    """How many nodes of ``per_node`` consecutive ranks each group spans."""
    return {len({r // per_node for r in g}) for g in groups}


def _nodes(count: set[int]) -> str:
    return "one node" if count == {1} else "/".join(map(str, sorted(count))) + " nodes"


@checker("13.1", "Write the body of mesh_groups(pp, dp, tp), then run this cell again.")
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


# Exercise 13.3: why tp is innermost. The 2 x 2 x 2 mesh on nodes of 2 GPUs, ranks numbered
# node by node: only the innermost dimension's groups stay inside a node.
SMALL_MESH, SMALL_NODE = {"pp": 2, "dp": 2, "tp": 2}, 2


def crossing_calls(innermost: str, calls: dict[str, float]) -> float:
    """A rank's ``calls`` per step along the dimensions whose groups leave a node, when
    ``innermost`` is the mesh's last dimension (the other two in lesson 13's order)."""
    order = (*(d for d in DIMS if d != innermost), innermost)
    return float(sum(calls.get(d, 0) for d in DIMS if _spans(
        _groups_in_order(SMALL_MESH, order, d), SMALL_NODE) != {1}))


@checker("13.3", "Set innermost_and_crossing to a pair (dimension, calls), then run this "
         "cell again.")
def check_innermost(innermost_and_crossing: tuple[str, float], calls: dict[str, float],
                    sent: dict[str, float]) -> str:
    """The dimension to put innermost, and the calls per step that still leave a node,
    from a rank's counted ``calls`` and bytes ``sent`` per dimension."""
    got = given(innermost_and_crossing)
    if (not isinstance(got, tuple) or len(got) != 2 or got[0] not in DIMS
            or isinstance(got[1], bool) or not isinstance(got[1], int | float)):
        raise Wrong(f"innermost_and_crossing = {got!r}; expected a pair (dimension, calls), "
                    f"the dimension one of {', '.join(map(repr, DIMS))}, e.g. ('pp', 12)")
    innermost, crossing = got
    cross = {d: crossing_calls(d, calls) for d in DIMS}
    best = min(cross, key=cross.__getitem__)
    heavy = max(sent, key=sent.__getitem__)
    if innermost != best:
        extra = (f"; {innermost} sends the most bytes, but in few calls, which FSDP can "
                 "start early on GPUs" if innermost == heavy else "")
        raise Wrong(f"With {innermost} innermost, {cross[innermost]:.0f} calls per step "
                    f"leave the node; with {best} innermost, {cross[best]:.0f}{extra}",
                    "every call that crosses a node waits on the slower link, and the "
                    "next operation waits for it: keep the dimension that calls most "
                    "often inside the node")
    if abs(crossing - cross[best]) > 1e-9:
        raise Wrong(f"With {best} innermost, the calls per step that leave the node are not "
                    f"{crossing}",
                    "on nodes of 2 GPUs only the innermost groups are neighbours; a group "
                    "of the other two dimensions holds ranks 2 or 4 apart, on two nodes")
    return (f"{best} innermost: {cross[best]:.0f} of the rank's {sum(calls.values()):.0f} calls "
            f"per step leave its node, against "
            + " and ".join(f"{cross[d]:.0f} with {d} innermost" for d in DIMS if d != best)
            + f". By bytes {heavy} would win ({format_bytes(sent[heavy])} a step against "
            f"{format_bytes(sent[best])} for {best}); what decides is how often the next "
            f"operation waits. {best}'s calls sit inside every block, forward and "
            "backward, and nothing can run until each returns.")
