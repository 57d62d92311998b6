"""The bytes a process has put on the wire, read from the kernel: :class:`WireMeter`.

The ring formulas (:func:`~helpers.comm.collectives.ring_bytes`) say what an algorithm
ought to send; this says what was sent. On Linux the kernel keeps, for every TCP socket,
the bytes the process has written to it and the bytes that arrived on it (``TCP_INFO``,
the counters ``ss -ti`` prints). Reading them for every socket this process holds before
and after a block gives the bytes the block sent, whoever sent them: our code, DDP's C++
reducer, FSDP2, gloo's own threads.

Three things share these sockets and are told apart or named:

- the rendezvous store (``torchrun``'s TCPStore, at ``MASTER_PORT``): its sockets are
  counted apart, as ``store_sent``/``store_received``;
- gloo's message headers: each message carries a 48-byte preamble (gloo's
  ``transport/tcp/pair.h``, ``Op::preamble``: six 8-byte fields), each send is announced
  to the receiver with a 48-byte message of its own and each receive to the sender
  (``NOTIFY_SEND_READY``, ``NOTIFY_RECV_READY``): counted by :mod:`helpers.comm.headers`;
- other ranks hosted by the same process: when ranks are threads of one process
  (:func:`helpers.torchrun.in_notebook.run_ranks`), the counters are the sum of theirs;
  ``WireMeter(within_process=True)`` then counts only the sockets whose other end is in
  this process too, leaving out a notebook kernel's own sockets to its front end.

Where the counters cannot be read (not Linux, a kernel older than 4.19), ``available`` is
False and ``reason`` says why: a lesson then shows the formula alone.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from dataclasses import dataclass

# offsets in the kernel's struct tcp_info (include/uapi/linux/tcp.h)
_RECEIVED, _NOTSENT, _SENT, _RETRANS = 128, 144, 200, 208
_TCP_INFO_LEN = 216  # up to tcpi_bytes_retrans (Linux 4.19)
_FDS = "/proc/self/fd"


@dataclass(frozen=True)
class SocketBytes:
    """One TCP socket's counters: bytes written to it (sent, or queued to be) and received."""

    local_port: int
    peer_port: int | None  # None: a listening socket
    written: int
    received: int


def wire_unavailable() -> str | None:
    """Why this machine's per-socket counters cannot be read, or None if they can."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "TCP_INFO"):
        return f"the per-socket counters are read from Linux's TCP_INFO; this is {sys.platform}"
    if not os.path.isdir(_FDS):
        return f"{_FDS} is not readable here"
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        length = len(probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256))
    finally:
        probe.close()
    if length < _TCP_INFO_LEN:
        return (f"this kernel's tcp_info has {length} bytes; tcpi_bytes_sent needs "
                f"{_TCP_INFO_LEN} (Linux 4.19 or later)")
    return None


def _one_socket(fd: int) -> SocketBytes | None:
    """The counters of the TCP socket open as ``fd``, or None if ``fd`` is not one."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET,
                                                                   socket.AF_INET6):
            return None
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        local = sock.getsockname()[1]
        try:
            peer = sock.getpeername()[1]
        except OSError:
            peer = None
    except OSError:  # closed meanwhile, or not a socket after all
        return None
    finally:
        sock.close()  # the duplicate only: the process's own socket stays open
    if len(raw) < _TCP_INFO_LEN:
        return None
    (received,) = struct.unpack_from("=Q", raw, _RECEIVED)
    (notsent,) = struct.unpack_from("=I", raw, _NOTSENT)
    sent, retransmitted = struct.unpack_from("=QQ", raw, _SENT)
    # sent counts retransmissions again; notsent is written but still queued
    return SocketBytes(local, peer, sent - retransmitted + notsent, received)


def read_sockets() -> dict[str, SocketBytes]:
    """Every TCP socket this process holds, by its kernel name (``socket:[inode]``)."""
    found = {}
    for name in os.listdir(_FDS):
        try:
            target = os.readlink(f"{_FDS}/{name}")
        except OSError:  # closed between the listing and the read
            continue
        if target.startswith("socket:") and target not in found:
            counts = _one_socket(int(name))
            if counts is not None:
                found[target] = counts
    return found


def _store_ports() -> frozenset[int]:
    port = os.environ.get("MASTER_PORT", "")
    return frozenset({int(port)}) if port.isdigit() else frozenset()


class WireMeter:
    """Bytes this process sent and received on its TCP sockets inside ``with`` blocks.

    Each ``with`` adds to the totals, so one meter can watch several steps. A socket opened
    inside a block counts from zero; one closed inside it is lost (none is, once a process
    group is built).
    """

    def __init__(self, store_ports: frozenset[int] | None = None, *,
                 within_process: bool = False) -> None:
        self.store_ports = _store_ports() if store_ports is None else frozenset(store_ports)
        self.within_process = within_process  # only sockets whose peer is in this process
        self.reason = wire_unavailable()
        self.sent = self.received = self.store_sent = self.store_received = 0
        self.windows = 0
        self._before: dict[str, SocketBytes] = {}

    @property
    def available(self) -> bool:
        """Whether the counters could be read (else ``reason`` says why)."""
        return self.reason is None

    def _is_store(self, counts: SocketBytes) -> bool:
        return counts.local_port in self.store_ports or counts.peer_port in self.store_ports

    def __enter__(self) -> WireMeter:
        if self.available:
            self._before = read_sockets()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.available:
            return None
        zero = SocketBytes(0, None, 0, 0)
        now = read_sockets()
        ours = {counts.local_port for counts in now.values()}
        for name, after in now.items():
            if self.within_process and after.peer_port not in ours:
                continue
            before = self._before.get(name, zero)
            sent, received = after.written - before.written, after.received - before.received
            if self._is_store(after):
                self.store_sent += sent
                self.store_received += received
            else:
                self.sent += sent
                self.received += received
        self.windows += 1
        return None
