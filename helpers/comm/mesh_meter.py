"""What a rank of the 3-D run sends, and how long it waits, per mesh dimension.

Three libraries send for it, each through its own door, and :class:`MeshComms` stands at
each one for the length of a ``with``:

- ``fully_shard`` (over ``dp``) calls ``torch.distributed.all_gather_single`` and
  ``reduce_scatter_single``;
- the tensor-parallel ``DTensor``\\ s and ``loss_parallel`` (over ``tp``) call the functional
  collectives of ``torch.distributed._functional_collectives``;
- the pipeline schedule (over ``pp``) sends activations and their gradients to the
  neighbouring stage in batches of ``isend``/``irecv`` (``pipelining.schedules._batch_p2p``)
  and later waits for them (``_wait_batch_p2p``).

A collective is timed to its completion (the wrapper waits for it); a pipeline transfer
from its posting through the schedule's wait for it. Each is charged to the mesh
dimension whose process group it ran on. Bytes are the collective's ring volume
(``helpers.comm.collectives.ring_bytes``) or, for the pipeline, the bytes of the
tensors sent. Time in a collective includes waiting for the slowest rank of the group to
arrive, and time in a pipeline receive includes waiting for the neighbour to finish its
micro-batch: the bubble shows up as pipeline communication.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from helpers.comm.collectives import ring_bytes
from helpers.runs.llama_3d.measure import nbytes as _nbytes

# torch.distributed's one-tensor collectives: (the collective, which argument holds S)
_DIST = {"all_gather_single": ("all_gather", 0), "all_gather_into_tensor": ("all_gather", 0),
         "reduce_scatter_single": ("reduce_scatter", 1),
         "reduce_scatter_tensor": ("reduce_scatter", 1), "all_reduce": ("all_reduce", 0)}
# the functional collectives DTensor calls: (the collective, the group's argument index);
# their first argument is this rank's input (the whole tensor, except for an all-gather)
_FUNCOL = {"all_gather_single": ("all_gather", 2), "reduce_scatter_single": ("reduce_scatter", 3),
           "all_reduce": ("all_reduce", 2)}
OTHER = "other"


@dataclass
class MeshComms:
    """Bytes sent and seconds spent inside the ``with``, per mesh dimension.

    ``groups`` maps a dimension's name to its process group (``mesh[name].get_group()``);
    a call on any other group is charged to ``"other"``.
    """

    groups: dict[str, dist.ProcessGroup]
    synchronize: bool = False  # on a GPU, wait for the device before and after each call
    sent: Counter = field(default_factory=Counter)
    seconds: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        # by the ranks a group spans: two groups over the same ranks (a mesh built twice)
        # are the same dimension's
        self._names = {frozenset(dist.get_process_group_ranks(g)): name
                       for name, g in self.groups.items()}
        self._saved: list[tuple[object, str, object]] = []

    def _sync(self) -> None:
        if self.synchronize:
            torch.cuda.synchronize()

    def _charge(self, group: dist.ProcessGroup, nbytes: float, seconds: float) -> None:
        dim = self._names.get(frozenset(dist.get_process_group_ranks(group)), OTHER)
        self.sent[dim] += nbytes
        self.seconds[dim] += seconds

    def _dist_call(self, call, kind: str, which: int):
        signature = inspect.signature(call)
        full_name = list(signature.parameters)[which]

        @functools.wraps(call)
        def wrapped(*args, **kwargs):
            bound = signature.bind(*args, **kwargs).arguments
            group = bound.get("group") or dist.group.WORLD
            self._sync()
            start = time.perf_counter()
            work = call(*args, **kwargs)
            if work is not None and hasattr(work, "wait"):
                work.wait()
            self._sync()
            n = dist.get_world_size(group)
            self._charge(group, ring_bytes(kind, n, _nbytes(bound[full_name])),
                         time.perf_counter() - start)
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
            full = _nbytes(args[0]) * (n if kind == "all_gather" else 1)
            self._charge(group, ring_bytes(kind, n, full), time.perf_counter() - start)
            return out
        return wrapped

    def _p2p_call(self, call):
        @functools.wraps(call)
        def wrapped(p2p_ops, *args, **kwargs):
            start = time.perf_counter()
            works = call(p2p_ops, *args, **kwargs)  # posted, not waited for: the schedule
            sent = sum(_nbytes(p.tensor) for p in p2p_ops if p.op is dist.isend)  # waits
            if p2p_ops:
                self._charge(p2p_ops[0].group, sent, time.perf_counter() - start)
            return works
        return wrapped

    def _p2p_wait(self, call):
        pp = self.groups.get("pp")

        @functools.wraps(call)
        def wrapped(works, *args, **kwargs):
            self._sync()
            start = time.perf_counter()
            out = call(works, *args, **kwargs)
            self._sync()
            dim = "pp" if pp is not None else OTHER
            self.seconds[dim] += time.perf_counter() - start
            return out
        return wrapped

    def _patch(self, owner: object, name: str, wrapper) -> None:
        original = getattr(owner, name, None)
        if original is None:  # an older torch: not there, not counted
            return
        self._saved.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    def __enter__(self) -> MeshComms:
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
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
