"""What a rank's collectives put on its TCP sockets under gloo, predicted and measured.

The payload is what gloo's algorithms send (:func:`helpers.comm.collectives.gloo_bytes`);
on top of it gloo writes message headers, counted from its algorithms by
:func:`helpers.comm.headers.gloo_header_bytes`.

The verdict (:attr:`WireCheck.ok`): the bytes read from the sockets lie between gloo's
payload and the payload plus these headers. With NCCL the collectives do not pass through
the process's sockets at all: nothing is measured, and the record says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from helpers.comm.collectives import gloo_bytes
from helpers.comm.headers import gloo_header_bytes, wire_within
from helpers.comm.wire import WireMeter
from helpers.runs.contract import Record

NCCL_REASON = ("nccl: within a node the collectives travel over the GPUs' links (NVLink, "
               "PCIe, shared memory), not this process's TCP sockets")


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
        return wire_within(self.sent, self.payload, self.headers) is not False

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
    """What the ranks' sockets sent, in words: "= payload + headers ✓" where every rank sent
    exactly gloo's prediction, else one number if they all agree, else each rank's."""
    if any(c.sent is None for c in checks):
        return f"not measured ({checks[0].reason})"
    if all(c.sent == c.payload + c.headers for c in checks):
        return "= payload + headers ✓"
    sent = sorted({c.sent for c in checks})
    if len(sent) == 1:
        return f"{sent[0]:,} B"
    return ", ".join(f"rank {c.rank} {c.sent:,} B" for c in checks)
