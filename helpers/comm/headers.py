"""The bytes gloo writes beside a collective's payload: its message headers, counted.

Every gloo message starts with a 48-byte preamble (``Op::preamble`` in gloo's
``transport/tcp/pair.h``: six 8-byte fields). ``Pair::send`` (``pair.cc``) announces each
send to its peer with a message of its own (``NOTIFY_SEND_READY``) and then sends the data
as a second message; ``Pair::recv`` announces each receive (``NOTIFY_RECV_READY``). So a
rank writes :data:`PER_SEND` bytes of headers per piece it sends and :data:`PER_RECEIVE`
per piece it receives. How many pieces each collective moves:

- all-reduce (gloo's ``allreduce.cc``, its ring): the tensor is cut into ``k N`` segments,
  ``k`` at least 2 and each segment at most :data:`MAX_SEGMENT`; the reduce-scatter pass
  and then the all-gather pass each send ``(N - 1) k`` of them, skipping a segment that
  lies past the end of the tensor;
- reduce-scatter: on gloo an all-reduce of the whole tensor, then a slice (torch's
  ``ProcessGroupGloo``), so the all-reduce's pieces;
- all-gather (``allgather.cc``): each rank's chunk in two halves, ``2 (N - 1)`` pieces
  sent and as many received;
- broadcast (``broadcast.cc``, a binomial tree): one piece to each child, one from the parent;
- a pipeline's send or receive: one piece.
"""

from __future__ import annotations

from helpers.comm.collectives import validate_collective

HEADER = 48  # bytes of one gloo message header (Op::preamble)
PER_SEND = 2 * HEADER  # NOTIFY_SEND_READY, then the data's own preamble
PER_RECEIVE = HEADER  # NOTIFY_RECV_READY
MAX_SEGMENT = 2**20  # bytes: gloo's AllreduceOptions::kMaxSegmentSize


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def allreduce_pieces(n: int, nbytes: int, rank: int, element_size: int = 4) -> tuple[int, int]:
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


def broadcast_pieces(n: int, rank: int, root: int = 0) -> tuple[int, int]:
    """(pieces sent, pieces received) by rank ``rank`` in gloo's binomial-tree broadcast."""
    virtual = (rank - root) % n
    children = sum(1 for i in range(max(n - 1, 0).bit_length())
                   if virtual < 2 ** i and virtual + 2 ** i < n)
    return children, int(virtual != 0)


def gloo_header_bytes(collective: str, n: int, nbytes: int, rank: int = 0,
                      element_size: int = 4, root: int = 0) -> int:
    """Header bytes rank ``rank`` writes for ``collective`` of a full tensor of ``nbytes``
    over ``n`` gloo ranks: :data:`PER_SEND` per piece it sends, :data:`PER_RECEIVE` per
    piece it receives (the module's docstring counts the pieces)."""
    validate_collective(collective)
    if n == 1:
        return 0
    if collective == "all_gather":
        sent = received = 2 * (n - 1)
    elif collective == "broadcast":
        sent, received = broadcast_pieces(n, rank, root)
    else:  # all_reduce, and reduce_scatter (an all-reduce on gloo)
        sent, received = allreduce_pieces(n, int(nbytes), rank, element_size)
    return PER_SEND * sent + PER_RECEIVE * received


def p2p_header_bytes(sends: int, receives: int) -> int:
    """Header bytes of ``sends`` point-to-point sends and ``receives`` receives."""
    return PER_SEND * sends + PER_RECEIVE * receives


def wire_within(wire: float | None, payload: float, headers: float) -> bool | None:
    """Whether the bytes read from the sockets lie between gloo's payload and that plus its
    headers (the verdict every lesson applies to the wire); None where it was not read."""
    if wire is None:
        return None
    return payload <= wire <= payload + headers
