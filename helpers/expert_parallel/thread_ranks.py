"""DTensor on ranks that are threads of this process, and what they sent.

:func:`helpers.torchrun.in_notebook.run_ranks` runs ranks as threads, each with a real gloo
group. DTensor's ``DeviceMesh`` asks the default process group for its rank, which threads
of one process do not have: :func:`thread_mesh` builds a 1-D mesh over a thread's own group
and tells it its rank (private arguments of torch 2.14's ``DeviceMesh``); the collectives
are gloo's own, over loopback sockets, as between processes. The ranks' sockets are one
process's: :func:`counted_sockets` reads the ones the ranks opened, once for all ranks,
between barriers, and :class:`WireCheck` holds them against the formula's payload and
gloo's headers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from helpers.comm.collectives import gloo_bytes
from helpers.comm.headers import gloo_header_bytes, p2p_header_bytes, wire_within
from helpers.comm.meter import ALL_TO_ALL
from helpers.comm.wire import SocketBytes, read_sockets, wire_unavailable
from helpers.torchrun.in_notebook import registered, run_ranks

# what CommDebugMode calls a collective -> the course's name for it
COLLECTIVE = {"all_gather_into_tensor": "all_gather", "all_to_all_single": ALL_TO_ALL,
              "alltoall_base_": ALL_TO_ALL, "shard_dim_alltoall": ALL_TO_ALL,
              "_allgather_base_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather"}


@contextlib.contextmanager
def thread_mesh(group: dist.ProcessGroup, rank: int) -> Iterator[object]:
    """A 1-D ``DeviceMesh`` named ``ep`` over this thread's gloo ``group``, for the block.

    ``DeviceMesh`` takes its rank from the default process group, which threads do not
    have; this one is given ``rank`` (private ``_rank``/``_init_backend`` arguments of
    torch 2.14) and answers ``get_local_rank`` with it. The group is registered under a
    name of its own, by which the functional collectives find it, and unregistered after.
    """
    from torch._C._distributed_c10d import _register_process_group, _unregister_process_group
    from torch.distributed.device_mesh import DeviceMesh

    class ThreadMesh(DeviceMesh):
        def get_local_rank(self, mesh_dim: int | str | None = None) -> int:  # noqa: D102
            return self._rank  # a 1-D mesh over ranks 0..n-1: the group rank

    name = f"ep-thread-{uuid.uuid4().hex[:8]}-{rank}"
    group._set_group_name(name)
    _register_process_group(name, group)
    try:
        with registered(group):
            mesh = ThreadMesh("cpu", torch.arange(group.size()), mesh_dim_names=("ep",),
                              _init_backend=False, _rank=rank)
            mesh._dim_group_names = [name]
            mesh._pg_registry[name] = group
            yield mesh
    finally:
        _unregister_process_group(name)


def sockets_now() -> frozenset[str] | None:
    """The TCP sockets this process holds now (None where they cannot be read): a run's
    ranks count only the sockets they open after it."""
    return None if wire_unavailable() else frozenset(read_sockets())


def _ours(existing: frozenset[str], want: frozenset[str] = frozenset()) -> dict[str, SocketBytes]:
    """The sockets not in ``existing``; a RuntimeError if one of ``want`` has closed (what
    it sent would be lost)."""
    found = {k: v for k, v in read_sockets().items() if k not in existing}
    if not want <= found.keys():
        raise RuntimeError(f"sockets {sorted(want - found.keys())} closed while counted")
    return found


@dataclass
class SocketCount:
    """Bytes this run's ranks wrote to their sockets in a window (None: not read)."""

    sent: int | None = None


@contextlib.contextmanager
def counted_sockets(rank: int, barrier: threading.Barrier,
                    existing: frozenset[str] | None) -> Iterator[SocketCount]:
    """What every rank sent inside the block, all ranks together, on the sockets opened
    since ``existing`` (:func:`sockets_now`; None: not read): the ranks' gloo groups, both
    ends of each pair in this process. Rank 0 reads them, between barriers: one before the
    first read, so every rank has finished what came before (a rank may still be sending to
    another after rank 0's part of a collective is done), one after it, so no rank sends
    before it, one before the second read, so all have sent, and one after it, so no rank
    moves on before it (a rank whose thread ends closes its group's sockets)."""
    count, read = SocketCount(), rank == 0 and existing is not None
    barrier.wait()
    before = _ours(existing) if read else {}
    barrier.wait()
    try:
        yield count
    except BaseException:
        barrier.abort()  # the other ranks stop waiting for this one
        raise
    barrier.wait()
    try:
        if read:
            after = _ours(existing, frozenset(before))
            count.sent = sum(s.written - (before[k].written if k in before else 0)
                             for k, s in after.items())
    finally:
        barrier.wait()


# torch's log lines that a call below triggers, each said in this module's results instead:
# DTensor's "CPU process group does not support alltoall yet, falling back with allgather +
# chunk!" (:func:`fallback_source` shows the code) and the fake-tensor trace behind a refused
# grouped_mm (its error is recorded by :func:`attempt`)
QUIETED = ("torch.distributed.tensor._collective_utils", "torch._subclasses.fake_tensor")


@contextlib.contextmanager
def quiet(names: tuple[str, ...] = QUIETED) -> Iterator[None]:
    """The loggers ``names`` silenced for the block, as they were after it."""
    loggers = [logging.getLogger(n) for n in names]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, before, strict=True):
            lg.disabled = was


def on_ranks(ep: int, work: Callable[[int, dist.ProcessGroup], object],
             timeout: float = 60.0) -> list:
    """``work(rank, group)`` on ``ep`` gloo ranks (threads), torch's log lines quieted;
    the first rank's exception raised, else every rank's result."""
    with quiet():
        results = run_ranks(ep, work, timeout=timeout)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def comm_counts(mode: object) -> dict[str, int]:
    """``CommDebugMode``'s count of each collective, by its operator's short name."""
    return {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}


@dataclass(frozen=True)
class WireCheck:
    """All ranks' sockets against the payload the formula says and gloo's headers."""

    payload: float  # bytes, all ranks together
    headers: int  # gloo's message headers allowed, all ranks together
    wire: int | None  # what the sockets sent (None: not readable here)

    @property
    def ok(self) -> bool | None:
        """payload <= wire <= payload + headers; None where the wire was not read."""
        return wire_within(self.wire, self.payload, self.headers)

    def line(self) -> str:
        if self.wire is None:
            return f"payload {self.payload:,.0f} B (sockets not readable here)"
        return (f"sockets {self.wire:,} B = payload {self.payload:,.0f} + headers "
                f"{self.wire - self.payload:,.0f} (allowed {self.headers:,}): {self.ok}")


def wire_check(sockets: SocketCount, payload: float, headers: int) -> WireCheck:
    """What ``sockets`` read, against ``payload`` and ``headers`` (all ranks)."""
    return WireCheck(payload, headers, sockets.sent)


def headers(collective: str, ep: int, full: int) -> int:
    """gloo's headers for one call, all ranks together: an all-gather's by its pieces; an
    all-to-all's, one piece to and one from each other rank (an empty block too: measured
    on this gloo, where a zero-row block still costs its headers)."""
    if collective == ALL_TO_ALL:
        return ep * p2p_header_bytes(ep - 1, ep - 1)
    return sum(gloo_header_bytes(collective, ep, full, r) for r in range(ep))


def payload(collective: str, ep: int, local: int) -> float:
    """Bytes one rank sends for one call on a ``local``-byte shard: an all-gather of the
    whole (``ep x local``) by gloo's ring, an all-to-all all blocks but its own."""
    if collective == ALL_TO_ALL:
        return local * (ep - 1) / ep
    return gloo_bytes(collective, ep, ep * local)
