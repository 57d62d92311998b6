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
  ``_wait_batch_p2p``), any other point-to-point send (``ProcessGroup.send``: a
  context-parallel ring's), charged as ``"p2p"`` to its group, and ``all_to_all_single``
  (an expert-parallel layer's). A collective is timed to its completion (the wrapper waits for it;
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

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.comm.calls import (
    C10D_OPS,
    DIST,
    FUNCOL,
    Tally,
    call_bytes,
    dispatched_root,
    group_root,
)
from helpers.comm.collectives import all_to_all_sent, gloo_bytes, ring_bytes
from helpers.comm.wire import WireMeter
from helpers.memory.measure import nbytes

OTHER = "other"  # the name of every group the mapping does not name
P2P = "p2p"  # a pipeline's sends and receives, beside the collectives
ALL_TO_ALL = "all_to_all"  # each rank sends block j of its input to rank j


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
        # a group is named first as itself (two dimensions may span the same ranks: cp,
        # and dp x cp flattened when dp = 1), then by its ranks (a mesh built twice)
        self._ids = {g.group_name: name for name, g in self.groups.items()}
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
        """The name ``groups`` gives ``group`` (itself, else by its ranks), else ``"other"``."""
        if not self._names:
            return OTHER
        if group.group_name in self._ids:
            return self._ids[group.group_name]
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
        if func.namespace == "c10d" and func._opname in C10D_OPS:
            collective, full = C10D_OPS[func._opname]  # full: the argument holding S
            at = [a.name for a in func._schema.arguments].index("process_group")
            group = dist.ProcessGroup.unbox(args[at])
            size, root = call_bytes(args[full]), dispatched_root(func, args)
            self.charge(self.group_name(group), collective,
                        ring_bytes(collective, group.size(), size),
                        gloo=gloo_bytes(collective, group.size(), size, group.rank(), root))
        elif func.namespace == "c10d" and func._opname == "alltoall_base_":
            group = dist.ProcessGroup.unbox(args[2])
            sent = all_to_all_sent(args[1], args[4], group.rank(), group.size())
            self.charge(self.group_name(group), ALL_TO_ALL, sent)  # no ring: each block direct
        elif func.namespace == "c10d" and func._opname == "send" and self.sends:
            group = dist.ProcessGroup.unbox(args[1])
            self.charge(self.group_name(group), P2P, call_bytes(args[0]))
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
            size, n = call_bytes(bound[full_name]), group.size()
            root = group_root(group, bound) if kind == "broadcast" else 0
            self.charge(self.group_name(group), kind, ring_bytes(kind, n, size), seconds,
                        gloo=gloo_bytes(kind, n, size, group.rank(), root))
            return work
        return wrapped

    def _all_to_all_call(self, call):
        signature = inspect.signature(call)

        @functools.wraps(call)
        def wrapped(*args, **kwargs):
            bound = signature.bind(*args, **kwargs).arguments
            group = bound.get("group") or dist.group.WORLD
            self._sync()
            start = time.perf_counter()
            work = call(*args, **kwargs)
            if work is not None and hasattr(work, "wait"):  # async_op=True: waited for here
                work.wait()
            self._sync()
            sent = all_to_all_sent(bound["input"], bound.get("input_split_sizes") or [],
                                   group.rank(), group.size())
            self.charge(self.group_name(group), ALL_TO_ALL, sent, time.perf_counter() - start)
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
            start, self._inside.door = time.perf_counter(), True  # its sends: counted here
            try:
                works = call(p2p_ops, *args, **kwargs)  # posted, not waited for: the schedule
            finally:
                self._inside.door = False
            sent = sum(nbytes(p.tensor) for p in p2p_ops if p.op is dist.isend)  # waits
            if p2p_ops:
                self.charge(self.group_name(p2p_ops[0].group), P2P, sent, time.perf_counter() - start)
            return works
        return wrapped

    def _send_call(self, call):
        @functools.wraps(call)
        def wrapped(group, tensors, *args, **kwargs):
            if getattr(self._inside, "door", False):
                return call(group, tensors, *args, **kwargs)
            start = time.perf_counter()
            work = call(group, tensors, *args, **kwargs)  # posted; its sender waits for it
            self.charge(self.group_name(group), P2P, float(sum(nbytes(t) for t in tensors)),
                        time.perf_counter() - start)
            return work
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
        # a class's method is put back as the class stored it (a pybind method's binder,
        # not the bare function getattr hands out, which would lose its ``self``)
        stored = vars(owner).get(name, original) if isinstance(owner, type) else original
        self._saved.append((owner, name, stored))
        setattr(owner, name, wrapper(original))

    def __enter__(self) -> CommMeter:
        self.wire.__enter__()
        if not self.timed:
            return super().__enter__()
        from torch.distributed import _functional_collectives as funcol
        from torch.distributed.pipelining import schedules

        for name, (kind, which) in DIST.items():
            self._patch(dist, name, lambda c, k=kind, w=which: self._dist_call(c, k, w))
        for name, (kind, where) in FUNCOL.items():
            self._patch(funcol, name, lambda c, k=kind, w=where: self._funcol_call(c, k, w))
        self._patch(schedules, "_batch_p2p", self._p2p_call)
        self._patch(schedules, "_wait_batch_p2p", self._p2p_wait)
        self._patch(dist.ProcessGroup, "send", self._send_call)
        self._patch(dist, "all_to_all_single", self._all_to_all_call)
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
