"""Four ways a distributed job hangs, and how a Flight Recorder dump names the culprit.

Every collective must be called by every rank of its group, in the same order, with
matching tensors; a send needs its receive. Break that and the ranks that did call wait
for the ones that did not, until a timeout. The four drills below are the shapes it takes
in real jobs (each reported in PyTorch's, torchtitan's or Megatron-LM's issues):

- ``skip``: one rank skips a collective the others call (its batch was empty, say), and
  moves on to the next one;
- ``mismatch``: one rank calls a different collective (a code path only it takes);
- ``wrong_order``: two ranks exchange tensors and both receive first: each waits for a
  send the other never reaches;
- ``straggler``: one rank is much slower than the rest (a slow disk, a stuck loader):
  the others wait in the collective it has not reached.

The Flight Recorder keeps each rank's last collectives in a ring buffer
(``TORCH_FR_BUFFER_SIZE`` entries; gloo records into it in torch 2.14), and
``torch._C._distributed_c10d._dump_fr_trace()`` writes it out. :func:`diagnose` reads all
ranks' dumps and finds the first collective on which they disagree, as PyTorch's own
analyzer (``python -m torch.distributed.flight_recorder.fr_trace``) does.
"""

from __future__ import annotations

import pickle
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from helpers.core.errors import TutorialError
from helpers.core.paths import display_path

GRADIENT = 1024  # elements of the drills' "gradient"


def skip(rank: int, group: dist.ProcessGroup, culprit: int) -> None:
    """The culprit skips the second gradient all-reduce, then waits at the step's barrier."""
    grad = torch.ones(GRADIENT)
    dist.all_reduce(grad, group=group)
    if rank != culprit:  # its batch was empty: "nothing to reduce"
        dist.all_reduce(grad, group=group)
    dist.barrier(group=group)


def mismatch(rank: int, group: dist.ProcessGroup, culprit: int) -> None:
    """The culprit broadcasts where every other rank all-reduces."""
    grad = torch.ones(GRADIENT)
    dist.all_reduce(grad, group=group)
    if rank == culprit:  # a branch only this rank takes
        dist.broadcast(grad, src=0, group=group)
    else:
        dist.all_reduce(grad, group=group)


def wrong_order(rank: int, group: dist.ProcessGroup, culprit: int) -> None:
    """Ranks 0 and 1 swap activations and both receive first; the others wait at a barrier."""
    mine, theirs = torch.full((GRADIENT,), float(rank)), torch.empty(GRADIENT)
    if rank in (0, 1):
        peer = 1 - rank
        dist.recv(theirs, src=peer, group=group)  # the fix: one of them sends first
        dist.send(mine, dst=peer, group=group)
    dist.barrier(group=group)


def slow_batch(seconds: float) -> None:
    """A batch that takes ``seconds`` to load (a slow disk, a stuck data loader)."""
    time.sleep(seconds)


def straggler(rank: int, group: dist.ProcessGroup, culprit: int, seconds: float = 3600.0,
              check_seconds: float | None = None) -> None:
    """The culprit takes ``seconds`` over its batch before the gradient all-reduce. With
    ``check_seconds``, every rank first passes a ``monitored_barrier`` that waits that long
    and names each rank that did not arrive."""
    grad = torch.ones(GRADIENT)
    dist.all_reduce(grad, group=group)
    if rank == culprit:
        slow_batch(seconds)
    if check_seconds is not None:
        dist.monitored_barrier(group=group, timeout=timedelta(seconds=check_seconds),
                               wait_all_ranks=True)
    dist.all_reduce(grad, group=group)


DRILLS: dict[str, Callable[..., None]] = {"skip": skip, "mismatch": mismatch,
                                          "wrong_order": wrong_order, "straggler": straggler}


def validate_drills(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``names`` if each is a drill, else a ValueError naming the bad one and the valid."""
    for name in names:
        if name not in DRILLS:
            raise ValueError(f"unknown drill {name!r}; valid choices: {', '.join(DRILLS)}")
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"drills {list(names)}: valid: one or more different drills out of "
                         f"{', '.join(DRILLS)}")
    return tuple(names)


class FlightRecordError(TutorialError):
    """A file that is not a Flight Recorder dump, or dumps that do not fit together."""


@dataclass(frozen=True)
class Call:
    """One call a rank's Flight Recorder kept: which group, its number there, what."""

    group: str  # the process group's name
    seq: int  # collective_seq_id (collectives) or p2p_seq_id (send/recv) in that group
    p2p: bool
    op: str  # "all_reduce", "broadcast", "recv", ... (the backend prefix dropped)
    sizes: tuple[tuple[int, ...], ...]
    where: str  # the caller's file:line (innermost frame outside torch); "?" when the dump
    # was written without stacks

    def same_as(self, other: Call) -> bool:
        return (self.op, self.sizes) == (other.op, other.sizes)


def _where(frames: list[dict]) -> str:
    for frame in frames:
        name = frame.get("filename", "")
        if "/torch/" not in name:
            return f"{Path(name).name}:{frame.get('line')} ({frame.get('name')})"
    return "?"


def read_dump(path: str | Path) -> tuple[int, list[Call]]:
    """(the rank, its recorded calls) of one Flight Recorder dump named ``..._<rank>``."""
    path = Path(path)
    try:
        rank = int(path.name.rsplit("_", 1)[-1])
    except ValueError:
        raise FlightRecordError(f"{display_path(path)}: the name must end in _<rank>, e.g. "
                                "fr_0") from None
    try:
        with open(path, "rb") as f:
            data = pickle.load(f)  # noqa: S301 - the Flight Recorder's own format, our ranks'
    except (OSError, pickle.UnpicklingError, EOFError) as error:
        raise FlightRecordError(f"{display_path(path)} is not a readable Flight Recorder "
                                f"dump ({error})") from None
    if not isinstance(data, dict) or not {"version", "entries"} <= set(data):
        raise FlightRecordError(f"{display_path(path)} has no 'version' and 'entries': not "
                                "a dump of torch._C._distributed_c10d._dump_fr_trace()")
    calls = [Call(e["process_group"][0], e["p2p_seq_id"] if e["is_p2p"] else
                  e["collective_seq_id"], bool(e["is_p2p"]),
                  e["profiling_name"].split(":", 1)[-1],
                  tuple(tuple(s) for s in e["input_sizes"]), _where(e.get("frames", [])))
             for e in data["entries"]]
    return rank, calls


@dataclass(frozen=True)
class Finding:
    """Where the ranks of one group stopped agreeing, and who is out of step."""

    group: str
    kind: str  # "mismatch", "missing" or "none"
    seq: int  # the collective (or send/recv) number where it happened
    culprits: tuple[int, ...]
    op: str  # what the culprits called ("" when they called nothing)
    waiting_in: str  # what the other ranks wait in
    where: str  # the culprits' call site, from their dump

    def line(self) -> str:
        ranks = ", ".join(map(str, self.culprits))
        if self.kind == "mismatch":
            at = f" at {self.where}" if self.where not in ("", "?") else ""
            return (f"rank {ranks} called {self.op}{at} as collective #{self.seq}, where the "
                    f"other ranks called {self.waiting_in}")
        if self.kind == "missing":
            who = f"rank {ranks}" if len(self.culprits) == 1 else f"ranks {ranks}"
            return (f"{who} never called collective #{self.seq} ({self.waiting_in}), "
                    "which the other ranks wait in")
        return "every rank called the same collectives: no disagreement recorded"


def _majority(calls: Mapping[int, Call | None]) -> Call | None:
    seen = Counter((c.op, c.sizes) for c in calls.values() if c is not None)
    if not seen:
        return None
    (op, sizes), _ = seen.most_common(1)[0]
    return next(c for c in calls.values() if c is not None and (c.op, c.sizes) == (op, sizes))


def diagnose(dumps: Mapping[int, list[Call]], group: str) -> Finding:
    """The first collective of ``group`` on which the ranks disagree: a rank that called
    another one (mismatch), or a rank that never called it (missing). The majority is
    taken as right, so with three ranks or more the odd one out is named. Sends and
    receives are left out: gloo's recorder does not keep them (NCCL's does)."""
    if not dumps:
        raise FlightRecordError("no dumps to diagnose; valid: one dump per rank of the group")
    mine = {r: [c for c in calls if c.group == group] for r, calls in dumps.items()}
    if not any(mine.values()):
        known = sorted({c.group for calls in dumps.values() for c in calls})
        raise FlightRecordError(f"no calls on group {group!r}; groups in the dumps: {known}")
    colls = {r: {c.seq: c for c in calls if not c.p2p} for r, calls in mine.items()}
    last = max((max(c) for c in colls.values() if c), default=0)
    for seq in range(1, last + 1):
        at = {r: c.get(seq) for r, c in colls.items()}
        expected = _majority(at)
        absent = tuple(r for r, c in at.items() if c is None)
        odd = tuple(r for r, c in at.items() if c is not None and not c.same_as(expected))
        if odd:
            call = at[odd[0]]
            return Finding(group, "mismatch", seq, odd, call.op, expected.op, call.where)
        if absent:
            return Finding(group, "missing", seq, absent, "", expected.op, "")
    return Finding(group, "none", last, (), "", "", "")


def repaired_for_analyzer(dump: dict, world_size: int) -> dict:
    """A gloo dump as ``fr_trace`` expects it: torch 2.14's gloo records its groups in
    ``pg_config`` under an empty name, while the entries name them ("1", "2", ...), and
    the analyzer looks them up by the entries' names (a KeyError otherwise)."""
    names = {e["process_group"] for e in dump["entries"]}
    config = {name: {"name": name, "desc": desc, "ranks": str(list(range(world_size)))}
              for name, desc in names}
    return {**dump, "pg_config": config}


def expected_finding(drill: str, culprit: int) -> tuple[str, tuple[int, ...], str, str]:
    """What a right diagnosis of ``drill`` says: (the kind of disagreement in the Flight
    Recorder, the ranks it blames, the collective the others wait in, and where the
    blamed ranks' stacks show them: the call or function they are in)."""
    validate_drills([drill])
    return {"skip": ("mismatch", (culprit,), "all_reduce", "barrier"),
            "mismatch": ("mismatch", (culprit,), "all_reduce", "broadcast"),
            "wrong_order": ("missing", (0, 1), "barrier", "recv"),
            "straggler": ("missing", (culprit,), "all_reduce", "slow_batch")}[drill]


_RUNNING = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\("
                      r"SequenceNumber=\d+,?\s*OpType=(\w+)")
_NOT_PASSED = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


def blamed_by_checks(errors: Mapping[int, str]) -> tuple[tuple[int, ...], str]:
    """(the ranks, the operation) that ``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s collective
    checks or a ``monitored_barrier`` blame in the ranks' errors: the rank whose own
    fingerprint (``Rank r is running collective: ... OpType=...``, r its own rank) differs
    from the majority's, or the ranks that did not pass the barrier. ((), "") when no
    error names one, as for a hang in send/recv, which neither checks."""
    own = {}
    for rank, text in errors.items():
        m = _RUNNING.search(text)
        if m and int(m.group(1)) == rank:
            own[rank] = m.group(2).lower()
    if own:
        common, _ = Counter(own.values()).most_common(1)[0]
        odd = tuple(sorted(r for r, op in own.items() if op != common))
        if odd:
            return odd, own[odd[0]]
    for text in errors.values():
        m = _NOT_PASSED.search(text)
        if m:
            return tuple(int(r) for r in m.group(1).replace(" ", "").split(",") if r), \
                "monitored_barrier"
    return (), ""


def fingerprints(text: str) -> list[tuple[int, int, str]]:
    """(rank, sequence number, operation) of each collective a DETAIL mismatch error names:
    ``Rank r is running collective: CollectiveFingerPrint(SequenceNumber=n, OpType=OP``.
    DETAIL numbers a group's collectives from 0; the Flight Recorder from 1."""
    found = re.finditer(r"Rank (\d+) is running collective: CollectiveFingerPrint\("
                        r"SequenceNumber=(\d+),?\s*OpType=(\w+)", text)
    return [(int(m.group(1)), int(m.group(2)), m.group(3).lower()) for m in found]
