"""What the meter reads of a collective call: the names it goes by at each door, which
argument holds its full tensor, its root, its bytes; and the :class:`Tally` it adds to."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from helpers.memory.measure import nbytes

# the dispatcher's names for the collectives, and which argument holds the full tensor (S)
C10D_OPS = {
    "allreduce_": ("all_reduce", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1),  # (output chunk, full input)
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "_allgather_base_": ("all_gather", 0),  # (full output, input chunk)
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "broadcast_": ("broadcast", 0),
}
# torch.distributed's functions: (the collective, which parameter holds S; None: no data)
DIST = {"all_reduce": ("all_reduce", 0), "broadcast": ("broadcast", 0),
         "all_gather_single": ("all_gather", 0), "all_gather_into_tensor": ("all_gather", 0),
         "all_gather": ("all_gather", 0), "reduce_scatter_single": ("reduce_scatter", 1),
         "reduce_scatter_tensor": ("reduce_scatter", 1), "reduce_scatter": ("reduce_scatter", 1),
         "barrier": ("barrier", None)}
# the functional collectives DTensor calls: (the collective, the group's argument index);
# their first argument is this rank's input (the whole tensor, except for an all-gather)
FUNCOL = {"all_gather_single": ("all_gather", 2), "reduce_scatter_single": ("reduce_scatter", 3),
           "all_reduce": ("all_reduce", 2)}


def call_bytes(value: object) -> int:
    """Bytes of a tensor, or of a list of tensors (this rank's pieces)."""
    tensors = value if isinstance(value, (list, tuple)) else [value]
    return sum(nbytes(t) for t in tensors if isinstance(t, torch.Tensor))


def dispatched_root(func: object, args: tuple) -> int:
    """The root (group rank) of a dispatched broadcast; 0 for any other collective."""
    names = [a.name for a in func._schema.arguments]
    return int(args[names.index("root_rank")]) if "root_rank" in names else 0


def group_root(group: dist.ProcessGroup, bound: dict) -> int:
    """The root (group rank) of a ``dist.broadcast`` call, given its bound arguments."""
    if bound.get("group_src") is not None:
        return int(bound["group_src"])
    return dist.get_group_rank(group, bound.get("src") or 0)


@dataclass
class Tally:
    """Calls, bytes sent (by the ring formula, and by gloo's algorithms) and seconds, per
    key (a group's name, or a collective)."""

    calls: Counter = field(default_factory=Counter)
    ring: Counter = field(default_factory=Counter)
    gloo: Counter = field(default_factory=Counter)
    seconds: Counter = field(default_factory=Counter)
