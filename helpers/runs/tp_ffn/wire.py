"""What a rank's collectives put on its TCP sockets under gloo, predicted and measured.

The payload is what gloo's algorithms send (:func:`helpers.comm.collectives.gloo_bytes`).
On top of it gloo writes headers of 48 bytes (``Op::preamble`` in gloo's
``transport/tcp/pair.h``, six 8-byte fields): every send of a piece of a buffer writes a
``NOTIFY_SEND_READY`` message and then the piece behind its preamble, and every receive
writes a ``NOTIFY_RECV_READY`` message to the sender (``Pair::send``, ``Pair::recv`` in
``pair.cc``). In a ring each rank receives one piece per piece it sends (a tensor that
does not divide evenly aside), so a rank writes 3 x 48 = 144 bytes of headers per piece it
sends. How many pieces:

- all-reduce (gloo's ``allreduce.cc``, its ring): the tensor is cut into ``k N`` segments,
  ``k`` at least 2 and each segment at most 1 MiB; the reduce-scatter pass and then the
  all-gather pass each send ``(N - 1) k`` of them, skipping a segment past the end;
- reduce-scatter: on gloo an all-reduce of the whole tensor, then a slice (torch's
  ``ProcessGroupGloo``), so the all-reduce's pieces;
- all-gather (``allgather.cc``): each rank's chunk in two halves, ``2 (N - 1)`` pieces.

The verdict (:attr:`WireCheck.ok`): the bytes read from the sockets lie between gloo's
payload and the payload plus these headers. With NCCL the collectives do not pass through
the process's sockets at all: nothing is measured, and the record says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from helpers.comm.collectives import gloo_bytes, validate_collective
from helpers.comm.wire import SocketBytes, WireMeter, read_sockets
from helpers.runs.contract import Record

HEADER = 48  # bytes of one gloo message header (Op::preamble)
SEND_HEADERS = 2  # a send writes a send-ready notice and the piece's preamble
MAX_SEGMENT = 2**20  # gloo's AllreduceOptions::kMaxSegmentSize
NCCL_REASON = ("nccl: the collectives travel over the GPUs' links (NVLink, PCIe, "
               "InfiniBand), not this process's TCP sockets")


class ThreadRanksWire(WireMeter):
    """A :class:`WireMeter` that counts only the sockets whose other end is in this process
    too: the connections between ranks run as threads of one process
    (``helpers.torchrun.in_notebook.run_ranks``), both ranks together. A notebook kernel's
    own sockets (to its front end: the heartbeat, the output) are left out."""

    def __exit__(self, *exc: object) -> None:
        if not self.available:
            return None
        after = read_sockets()
        ours = {s.local_port for s in after.values()}
        zero = SocketBytes(0, None, 0, 0)
        for name, now in after.items():
            if now.peer_port in ours and not self._is_store(now):
                before = self._before.get(name, zero)
                self.sent += now.written - before.written
                self.received += now.received - before.received
        self.windows += 1
        return None


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def allreduce_pieces(n: int, nbytes: int, rank: int, element_size: int) -> tuple[int, int]:
    """(segments sent, segments received) by rank ``rank`` in gloo's ring all-reduce of
    ``nbytes`` over ``n`` ranks (``allreduce.cc``, ``ring``: both passes; a segment past
    the end of the tensor is neither sent nor received)."""
    if n == 1 or nbytes == 0:
        return 0, 0
    largest = element_size * max(1, MAX_SEGMENT // element_size)
    segments = _round_up(max(-(-nbytes // largest), 2 * n), n)
    segment = _round_up(-(-nbytes // segments), element_size)
    per_rank, span = segments // n, segments * segment

    def pieces(first: int) -> int:
        return sum(min(segment, nbytes - ((first * per_rank + i) * segment) % span) > 0
                   for i in range(segments - per_rank))

    # reduce-scatter: send from segment (rank + 1), receive (rank + 2); all-gather: rank, rank + 1
    return pieces(rank + 1) + pieces(rank), pieces(rank + 2) + pieces(rank + 1)


def gloo_header_bytes(collective: str, n: int, nbytes: int, rank: int = 0,
                      element_size: int = 4) -> int:
    """Header bytes rank ``rank`` writes for ``collective`` of a full tensor of ``nbytes``
    over ``n`` gloo ranks: two per piece it sends, one per piece it receives (the module's
    docstring counts them)."""
    validate_collective(collective)
    if collective == "all_gather":
        sent = received = 2 * (n - 1)
    elif collective in ("all_reduce", "reduce_scatter"):
        sent, received = allreduce_pieces(n, int(nbytes), rank, element_size)
    else:
        raise ValueError(f"collective={collective!r}: its headers are not counted here; "
                         "valid: all_reduce, reduce_scatter, all_gather")
    return HEADER * (SEND_HEADERS * sent + received)


@dataclass(frozen=True)
class WireCheck(Record):
    """One rank's bytes on its sockets in a window, beside what gloo should have sent."""

    rank: int
    sent: int | None  # read from the kernel's counters; None: not measured (``reason``)
    payload: float  # gloo's algorithms (:func:`helpers.comm.collectives.gloo_bytes`)
    headers: int  # gloo's 48-byte headers, counted from its algorithms
    reason: str = ""

    @property
    def ok(self) -> bool:
        """The verdict: payload <= sent <= payload + headers (nothing to judge if None)."""
        return self.sent is None or self.payload <= self.sent <= self.payload + self.headers

    @property
    def beyond_payload(self) -> int | None:
        """Bytes sent beyond gloo's payload: its headers, if all is as predicted."""
        return None if self.sent is None else int(self.sent - self.payload)


def predict(calls: list[tuple[str, int]], n: int, rank: int, element_size: int = 4
            ) -> tuple[float, int]:
    """(payload, headers) rank ``rank`` of ``n`` gloo ranks sends for ``calls``, each a
    (collective, bytes of the full tensor)."""
    payload = sum(gloo_bytes(c, n, s, rank) for c, s in calls)
    headers = sum(gloo_header_bytes(c, n, s, rank, element_size) for c, s in calls)
    return float(payload), headers


def checked(meter: WireMeter, backend: str, rank: int, payload: float, headers: int
            ) -> WireCheck:
    """A rank's window as a :class:`WireCheck` (None with the reason on NCCL, or where the
    kernel's counters cannot be read)."""
    if backend == "nccl":
        return WireCheck(rank, None, payload, headers, NCCL_REASON)
    if not meter.available:
        return WireCheck(rank, None, payload, headers, str(meter.reason))
    return WireCheck(rank, int(meter.sent), payload, headers)


def every_rank(check: WireCheck, group=None) -> tuple[WireCheck, ...]:
    """Every rank's check, in rank order, on every rank of ``group`` (collective)."""
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, check.to_dict(), group=group)
    return tuple(WireCheck.from_dict(c) for c in out)


def wire_line(checks: tuple[WireCheck, ...]) -> str:
    """What the ranks' sockets sent, in words: one number if they all agree."""
    if any(c.sent is None for c in checks):
        return f"not measured ({checks[0].reason})"
    sent = sorted({c.sent for c in checks})
    if len(sent) == 1:
        return f"{sent[0]:,} B on each of {len(checks)} rank(s)"
    return ", ".join(f"rank {c.rank} {c.sent:,} B" for c in checks)
