"""What crossed between the ranks in one step of a schedule: the tensors it sent, planned
and counted, and the bytes that left each rank's sockets.

Three views of one step, per rank:

- planned (:func:`planned_sends`): chunk c lives on rank c mod K, and every cut between two
  chunks carries each micro-batch's activation forward and its gradient back, one message
  each; a cut between chunks on two ranks is a send from one to the other;
- counted (:func:`count_transfers`): every ``isend`` and ``irecv`` the schedule posts
  (``torch.distributed.pipelining.schedules._batch_p2p``, a private function: the
  context manager fails loudly if a torch upgrade removes it), with its tensor's bytes;
- on the wire: the bytes this rank's process wrote to its TCP sockets during the step
  (:class:`helpers.comm.wire.WireMeter`, the rendezvous store apart). With gloo they are
  the tensors plus gloo's headers; with NCCL the tensors go GPU to GPU and none of them
  passes through the sockets, so the wire is not read.

gloo's headers (:mod:`helpers.comm.headers`): a rank that posts s sends and r receives
writes its tensors plus ``HEADERS_PER_SEND`` s + ``HEADERS_PER_RECEIVE`` r bytes (96 and
48: a send is announced, then sent, each message with its 48-byte preamble; a receive is
announced): the allowance the verdict names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch.distributed as dist
import torch.distributed.pipelining.schedules as schedules_module

from helpers.comm.headers import PER_RECEIVE, PER_SEND, wire_within
from helpers.runs.contract import Record

HEADERS_PER_SEND = PER_SEND  # NOTIFY_SEND_READY, then the tensor's own preamble
HEADERS_PER_RECEIVE = PER_RECEIVE  # NOTIFY_RECV_READY


@dataclass
class Counted:
    """The sends and receives posted inside :func:`count_transfers`, with the bytes sent."""

    sends: int = 0
    receives: int = 0
    sent_bytes: int = 0


@contextlib.contextmanager
def count_transfers() -> Iterator[Counted]:
    """Count every send and receive a pipeline schedule posts inside the ``with``."""
    original = getattr(schedules_module, "_batch_p2p", None)
    if not callable(original):
        raise RuntimeError("torch.distributed.pipelining changed: schedules._batch_p2p not "
                           "found; helpers.runs.schedules.transfers must be updated")
    counted = Counted()

    def counting(p2p_ops, *args, **kwargs):
        for op in p2p_ops:
            if op.op is dist.isend:
                counted.sends += 1
                counted.sent_bytes += op.tensor.numel() * op.tensor.element_size()
            else:
                counted.receives += 1
        return original(p2p_ops, *args, **kwargs)

    schedules_module._batch_p2p = counting
    try:
        yield counted
    finally:
        schedules_module._batch_p2p = original


def planned_sends(rank: int, ranks: int, chunks_per_rank: int, microbatches: int) -> int:
    """Messages ``rank`` sends in one step: per cut whose chunks sit on two ranks, each
    micro-batch's activation from the earlier chunk's rank, its gradient from the later's.
    It receives as many: the other end of each."""
    chunks = ranks * chunks_per_rank
    owner = [c % ranks for c in range(chunks)]
    cuts = [(owner[c], owner[c + 1]) for c in range(chunks - 1) if owner[c] != owner[c + 1]]
    return microbatches * sum((a == rank) + (b == rank) for a, b in cuts)


@dataclass(frozen=True)
class RankTransfers(Record):
    """One rank's step: what it posted, and what its sockets sent (None: not read)."""

    sends: int
    receives: int
    sent_bytes: int
    wire_sent: int | None

    @property
    def headers(self) -> int:
        """gloo's header bytes for these messages: the most the wire may exceed the tensors."""
        return HEADERS_PER_SEND * self.sends + HEADERS_PER_RECEIVE * self.receives

    def ok(self, planned: int, message_bytes: int) -> bool:
        """Sends, receives and bytes as planned; the wire (when read) within [tensors,
        tensors + headers]."""
        as_planned = (self.sends == self.receives == planned
                      and self.sent_bytes == planned * message_bytes)
        return as_planned and wire_within(self.wire_sent, self.sent_bytes,
                                          self.headers) is not False
