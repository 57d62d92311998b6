"""Calls, bytes and seconds of the collectives a rank issues, per process group and per
collective: one instrument, :class:`CommMeter`.

``with CommMeter(groups) as meter:`` charges each collective issued inside to the name
``groups`` gives its process group (a mesh dimension's: ``{"dp": mesh["dp"].get_group()}``;
any other group is ``"other"``) and to the collective, with the bytes this rank sends for
it three ways:

- ``ring``: by the ring formula (:func:`~helpers.comm.collectives.ring_bytes`), what NCCL's
  ring sends; for a pipeline's send, the bytes of the tensors sent; for an all-to-all
  (``all_to_all_single``, even or uneven), the blocks this rank sends to the others, which
  every algorithm sends directly (:func:`~helpers.comm.collectives.all_to_all_sent`);
- ``gloo``: by gloo's algorithms (:func:`~helpers.comm.collectives.gloo_bytes`), what this
  run's backend sends for the same calls (a reduce-scatter is an all-reduce on gloo);
- ``meter.wire``: what left this process, read from the kernel's socket counters
  (:class:`~helpers.comm.wire.WireMeter`), for the whole ``with``, store traffic apart.

It listens at one of two places:

- untimed (the default), at the dispatcher: ``torch.distributed`` sends every collective
  through it as a ``c10d`` operator, whoever issues it (our code, DDP's C++ reducer,
  FSDP2), and a ``TorchDispatchMode`` reads its tensors' sizes on the way. It sees
  everything, but routes every operator through Python, which slows what it watches: it
  counts and does not time. With ``sends=True`` it also charges each point-to-point send
  (``ProcessGroup.send``, ``dist.isend``) as ``"p2p"``.
- ``timed=True``, at the Python doors, in every thread, for the length of the ``with``:
  ``torch.distributed``'s collective functions (our code, ``fully_shard``), the functional
  collectives (``DTensor``, ``loss_parallel``) and the pipeline schedule's batches of
  ``isend``/``irecv`` (``pipelining.schedules._batch_p2p``, waited for in
  ``_wait_batch_p2p``). A collective is timed to its completion (the wrapper waits for it;
  ``synchronize=True`` also waits for the GPU before and after, since NCCL only queues
  it); a pipeline transfer by the time its posting takes plus the time the schedule later
  blocks waiting for it (not the interval between, when computation runs). Time in a
  collective includes waiting for the slowest rank of the group to arrive, and time in a
  pipeline wait includes the neighbour's micro-batch: the bubble shows up as pipeline
  communication. A collective issued from C++ (DDP's reducer) passes no Python door.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.comm.collectives import all_to_all_sent, gloo_bytes, ring_bytes
from helpers.comm.wire import WireMeter
from helpers.memory.measure import nbytes

OTHER = "other"  # the name of every group the mapping does not name
P2P = "p2p"  # a pipeline's sends and receives, beside the collectives
ALL_TO_ALL = "all_to_all"  # each rank sends block j of its input to rank j

# the dispatcher's names for the collectives, and which argument holds the full tensor (S)
_C10D_OPS = {
    "allreduce_": ("all_reduce", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1),  # (output chunk, full input)
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "_allgather_base_": ("all_gather", 0),  # (full output, input chunk)
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "broadcast_": ("broadcast", 0),
}
# torch.distributed's functions: (the collective, which parameter holds S; None: no data)
_DIST = {"all_reduce": ("all_reduce", 0), "broadcast": ("broadcast", 0),
         "all_gather_single": ("all_gather", 0), "all_gather_into_tensor": ("all_gather", 0),
         "all_gather": ("all_gather", 0), "reduce_scatter_single": ("reduce_scatter", 1),
         "reduce_scatter_tensor": ("reduce_scatter", 1), "reduce_scatter": ("reduce_scatter", 1),
         "barrier": ("barrier", None)}
# the functional collectives DTensor calls: (the collective, the group's argument index);
# their first argument is this rank's input (the whole tensor, except for an all-gather)
_FUNCOL = {"all_gather_single": ("all_gather", 2), "reduce_scatter_single": ("reduce_scatter", 3),
           "all_reduce": ("all_reduce", 2)}


def _bytes(value: object) -> int:
    """Bytes of a tensor, or of a list of tensors (this rank's pieces)."""
    tensors = value if isinstance(value, (list, tuple)) else [value]
    return sum(nbytes(t) for t in tensors if isinstance(t, torch.Tensor))


def _root(func: object, args: tuple) -> int:
    """The root (group rank) of a dispatched broadcast; 0 for any other collective."""
    names = [a.name for a in func._schema.arguments]
    return int(args[names.index("root_rank")]) if "root_rank" in names else 0


def _group_root(group: dist.ProcessGroup, bound: dict) -> int:
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


class CommMeter(TorchDispatchMode):
    """What the collectives inside the ``with`` sent (and, timed, how long they took):
    ``per_group`` and ``per_collective``, each a :class:`Tally`; ``wire``, what this
    process's sockets sent."""

    def __init__(self, groups: dict[str, dist.ProcessGroup] | None = None, *,
                 timed: bool = False, synchronize: bool = False, sends: bool = False) -> None:
        super().__init__()
        self.groups, self.timed, self.synchronize = dict(groups or {}), timed, synchronize
        self.sends = sends  # untimed: also charge point-to-point sends, as "p2p"
        self.per_group, self.per_collective = Tally(), Tally()
        self.wire = WireMeter()
        # by the ranks a group spans: two groups over the same ranks (a mesh built twice)
        # are the same dimension's
        self._names = {frozenset(dist.get_process_group_ranks(g)): name
                       for name, g in self.groups.items()}
        self._saved: list[tuple[object, str, object]] = []
        self._inside = threading.local()  # an alias calling its new name is one call

    @property
    def total_ring(self) -> float:
        """Bytes this rank sends by the ring formula, all groups and collectives together."""
        return float(sum(self.per_collective.ring.values()))

    @property
    def total_gloo(self) -> float:
        """Bytes this rank sends by gloo's algorithms, all groups and collectives together."""
        return float(sum(self.per_collective.gloo.values()))

    @property
    def total_seconds(self) -> float:
        """Seconds spent in collectives and pipeline transfers (timed only)."""
        return float(sum(self.per_collective.seconds.values()))

    def group_name(self, group: dist.ProcessGroup) -> str:
        """The name ``groups`` gives ``group`` (by its ranks), else ``"other"``."""
        if not self._names:
            return OTHER
        return self._names.get(frozenset(dist.get_process_group_ranks(group)), OTHER)

    def charge(self, group: str, collective: str, ring: float | None,
               seconds: float | None = None, calls: int = 1,
               gloo: float | None = None) -> None:
        """Add a call's bytes (and seconds) to its group's and its collective's tallies;
        ``gloo`` defaults to ``ring`` (the algorithms agree)."""
        gloo = ring if gloo is None else gloo
        for tally, key in ((self.per_group, group), (self.per_collective, collective)):
            if calls:
                tally.calls[key] += calls
            if ring is not None:
                tally.ring[key] += ring
            if gloo is not None:
                tally.gloo[key] += gloo
            if seconds is not None:
                tally.seconds[key] += seconds

    # -- untimed: at the dispatcher --------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d" and func._opname in _C10D_OPS:
            collective, full = _C10D_OPS[func._opname]  # full: the argument holding S
            at = [a.name for a in func._schema.arguments].index("process_group")
            group = dist.ProcessGroup.unbox(args[at])
            size, root = _bytes(args[full]), _root(func, args)
            self.charge(self.group_name(group), collective,
                        ring_bytes(collective, group.size(), size),
                        gloo=gloo_bytes(collective, group.size(), size, group.rank(), root))
        elif func.namespace == "c10d" and func._opname == "alltoall_base_":
            group = dist.ProcessGroup.unbox(args[2])
            sent = all_to_all_sent(args[1], args[4], group.rank(), group.size())
            self.charge(self.group_name(group), ALL_TO_ALL, sent)  # no ring: each block direct
        elif func.namespace == "c10d" and func._opname == "send" and self.sends:
            group = dist.ProcessGroup.unbox(args[1])
            self.charge(self.group_name(group), P2P, _bytes(args[0]))
        return func(*args, **(kwargs or {}))

    # -- timed: at the Python doors ----------------------------------------------------
    def _sync(self) -> None:
        if self.synchronize:
            torch.cuda.synchronize()

    def _dist_call(self, call, kind: str, which: int | None):
        signature = inspect.signature(call)
        full_name = None if which is None else list(signature.parameters)[which]

        @functools.wraps(call)
        def wrapped(*args, **kwargs):
            if getattr(self._inside, "door", False):
                return call(*args, **kwargs)
            bound = signature.bind(*args, **kwargs).arguments
            group = bound.get("group") or dist.group.WORLD
            self._sync()
            start, self._inside.door = time.perf_counter(), True
            try:
                work = call(*args, **kwargs)
            finally:
                self._inside.door = False
            if work is not None and hasattr(work, "wait"):  # async_op=True: waited for here
                work.wait()
            self._sync()
            seconds = time.perf_counter() - start
            if full_name is None:
                self.charge(self.group_name(group), kind, 0.0, seconds)
                return work
            size, n = _bytes(bound[full_name]), group.size()
            root = _group_root(group, bound) if kind == "broadcast" else 0
            self.charge(self.group_name(group), kind, ring_bytes(kind, n, size), seconds,
                        gloo=gloo_bytes(kind, n, size, group.rank(), root))
            return work
        return wrapped

    def _funcol_call(self, call, kind: str, where: int):
        from torch.distributed import _functional_collectives as funcol

        @functools.wraps(call)
        def wrapped(*args, **kwargs):
            group = kwargs["group"] if "group" in kwargs else args[where]
            name = funcol._resolve_group_name(group)
            self._sync()
            start = time.perf_counter()
            out = call(*args, **kwargs)
            if isinstance(out, funcol.AsyncCollectiveTensor):
                out = out.wait()
            self._sync()
            group = dist.distributed_c10d._resolve_process_group(name)
            n = dist.get_world_size(group)
            full = nbytes(args[0]) * (n if kind == "all_gather" else 1)
            self.charge(self.group_name(group), kind, ring_bytes(kind, n, full),
                        time.perf_counter() - start, gloo=gloo_bytes(kind, n, full))
            return out
        return wrapped

    def _p2p_call(self, call):
        @functools.wraps(call)
        def wrapped(p2p_ops, *args, **kwargs):
            start = time.perf_counter()
            works = call(p2p_ops, *args, **kwargs)  # posted, not waited for: the schedule
            sent = sum(nbytes(p.tensor) for p in p2p_ops if p.op is dist.isend)  # waits
            if p2p_ops:
                self.charge(self.group_name(p2p_ops[0].group), P2P, sent, time.perf_counter() - start)
            return works
        return wrapped

    def _p2p_wait(self, call):
        pp = "pp" if "pp" in self.groups else OTHER

        @functools.wraps(call)
        def wrapped(works, *args, **kwargs):
            self._sync()
            start = time.perf_counter()
            out = call(works, *args, **kwargs)
            self._sync()
            self.charge(pp, P2P, None, time.perf_counter() - start, calls=0)
            return out
        return wrapped

    def _patch(self, owner: object, name: str, wrapper) -> None:
        original = getattr(owner, name, None)
        if original is None:  # an older torch: not there, not counted
            return
        self._saved.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    def __enter__(self) -> CommMeter:
        self.wire.__enter__()
        if not self.timed:
            return super().__enter__()
        from torch.distributed import _functional_collectives as funcol
        from torch.distributed.pipelining import schedules

        for name, (kind, which) in _DIST.items():
            self._patch(dist, name, lambda c, k=kind, w=which: self._dist_call(c, k, w))
        for name, (kind, where) in _FUNCOL.items():
            self._patch(funcol, name, lambda c, k=kind, w=where: self._funcol_call(c, k, w))
        self._patch(schedules, "_batch_p2p", self._p2p_call)
        self._patch(schedules, "_wait_batch_p2p", self._p2p_wait)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if not self.timed:
                return super().__exit__(*exc)
            for owner, name, original in reversed(self._saved):
                setattr(owner, name, original)
            self._saved.clear()
            return None
        finally:
            self.wire.__exit__(*exc)
