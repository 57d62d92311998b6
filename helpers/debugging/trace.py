"""Each rank's ``torch.profiler`` trace, read, checked, and merged into one timeline.

``prof.export_chrome_trace(path)`` writes one JSON file per rank in the Chrome trace
format: a ``traceEvents`` list of complete events (``"ph": "X"``, a start ``ts`` and a
``dur`` in microseconds) on threads (``tid``) of one process (``pid``). Its
``baseTimeNanoseconds`` turns ``ts`` into wall-clock time, and ``distributedInfo``
names the rank. :func:`merge_traces` makes every rank one process of a single trace (the
process is named ``rank N``), on one clock, so Perfetto (ui.perfetto.dev, a file dropped
on the page, nothing uploaded) or ``chrome://tracing`` shows all ranks one above the
other.

:func:`rank_activity` sorts a rank's events into computing and communicating:
on a CPU the computing is the operators (``cpu_op``) on the rank's main thread, the
communicating is the backend's own record of each collective: gloo runs a collective on
threads of its own (``gloo:all_reduce``), while a ``gloo:send`` or ``gloo:recv`` sits on
the calling thread and lasts until the transfer completes; on a GPU, NCCL's kernels
against the others.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from helpers.core.errors import TutorialError
from helpers.core.files import atomic_write_text
from helpers.core.paths import display_path
from helpers.debugging.intervals import Interval, subtract

COMM_PREFIXES = ("gloo:", "nccl:")  # the backend's record of a collective (CPU side)
NOT_COMPUTING = ("c10d::", "record_param_comms", "ProfilerStep", "gloo:", "nccl:")


class TraceError(TutorialError):
    """A file that is not a complete ``torch.profiler`` Chrome trace of one rank."""


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace: its events, with ``ts`` in microseconds from ``base_ns``."""

    rank: int
    base_ns: int
    events: tuple[dict, ...]
    path: str

    def complete(self) -> list[dict]:
        """Its complete events (``"ph": "X"``), each with a start and a duration."""
        return [e for e in self.events if e.get("ph") == "X"]

    def main_thread(self) -> int:
        """The thread that ran most operators: the rank's Python thread."""
        ops = Counter(e["tid"] for e in self.complete() if e.get("cat") == "cpu_op")
        if not ops:
            raise TraceError(f"{display_path(self.path)} has no operator events (cat "
                             "'cpu_op'); record with torch.profiler's CPU activity")
        return ops.most_common(1)[0][0]

    def span(self, name: str) -> Interval:
        """The first complete event called ``name`` (a ``record_function`` mark), as an
        interval; a TraceError naming the marks it has if there is none."""
        for e in self.complete():
            if e.get("name") == name:
                return (e["ts"], e["ts"] + e["dur"])
        marks = sorted({e["name"] for e in self.complete() if e.get("cat") == "user_annotation"})
        raise TraceError(f"{display_path(self.path)} has no event {name!r}; its marks: {marks}")


def read_trace(path: str | Path) -> RankTrace:
    """One rank's Chrome trace, checked; a TraceError says what is wrong with the file."""
    path = Path(path)
    where = display_path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TraceError(f"{where}: no such trace file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TraceError(f"{where} is not complete JSON ({error}); a trace cut short "
                         "(a rank killed while writing) cannot be read: write it again "
                         "with export_chrome_trace") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        found = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise TraceError(f"{where} is not a Chrome trace: no 'traceEvents' list (found "
                         f"{found}); valid: a file written by torch.profiler's "
                         "export_chrome_trace")
    info = data.get("distributedInfo")
    if not isinstance(info, dict) or not isinstance(info.get("rank"), int):
        raise TraceError(f"{where} names no rank ('distributedInfo'); valid: a trace "
                         "recorded on a rank of an initialised process group")
    for event in data["traceEvents"]:
        if event.get("ph") == "X" and not (isinstance(event.get("ts"), (int, float))
                                           and isinstance(event.get("dur"), (int, float))):
            raise TraceError(f"{where}: event {event.get('name')!r} has no numeric ts and "
                             "dur; valid: complete events ('ph': 'X') with both")
    return RankTrace(info["rank"], int(data.get("baseTimeNanoseconds", 0)),
                     tuple(data["traceEvents"]), str(path))


@dataclass(frozen=True)
class MergedTrace:
    """The merged file and what went into it."""

    path: str
    ranks: tuple[int, ...]
    events_per_rank: tuple[int, ...]
    origin_ns: int  # wall-clock time of ts = 0 in the merged file


def _absolute_ns(trace: RankTrace, ts: float) -> float:
    return trace.base_ns + ts * 1e3


def merge_traces(paths: Sequence[str | Path], out: str | Path) -> MergedTrace:
    """Every rank's trace in one file, each rank a process named ``rank N`` (sorted by
    rank), events in time order on one clock starting at 0; written atomically."""
    traces = sorted((read_trace(p) for p in paths), key=lambda t: t.rank)
    ranks = [t.rank for t in traces]
    if len(set(ranks)) != len(ranks):
        raise TraceError(f"two traces of the same rank among {[t.path for t in traces]}: "
                         f"ranks {ranks}; valid: one trace per rank")
    origin = min(_absolute_ns(t, e["ts"]) for t in traces for e in t.complete())
    merged, counts = [], []
    for trace in traces:
        r = trace.rank
        merged += [{"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                    "args": {"name": f"rank {r}"}},
                   {"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0,
                    "args": {"sort_index": r}}]
        own = 0
        for event in trace.events:
            if event.get("ph") == "M" and event.get("name") in (
                    "process_name", "process_sort_index", "process_labels"):
                continue
            moved = dict(event, pid=r)
            if "ts" in event and isinstance(event["ts"], (int, float)):
                moved["ts"] = round((_absolute_ns(trace, event["ts"]) - origin) / 1e3, 3)
            merged.append(moved)
            own += event.get("ph") == "X"
        counts.append(own)
    merged.sort(key=lambda e: (e.get("ph") != "M", e.get("ts", 0)))
    atomic_write_text(out, json.dumps({"traceEvents": merged, "displayTimeUnit": "ms",
                                       "otherData": {"ranks": ranks,
                                                     "origin_ns": int(origin)}}))
    return MergedTrace(str(out), tuple(ranks), tuple(counts), int(origin))


def is_communication(event: dict) -> bool:
    """A backend's collective or send/recv: gloo's or NCCL's own record, or an NCCL kernel."""
    name = event.get("name", "")
    if event.get("cat") == "kernel":
        return name.lower().startswith("nccl")
    return name.startswith(COMM_PREFIXES)


@dataclass(frozen=True)
class Activity:
    """One rank's computing and communicating intervals (microseconds, its own clock)."""

    rank: int
    computing: tuple[Interval, ...]
    communicating: tuple[Interval, ...]


def rank_activity(trace: RankTrace, *, gpu: bool = False) -> Activity:
    """What ``trace``'s rank computed and communicated: on a CPU its main thread's
    operators, less the time spent inside a collective call (``c10d::allreduce_``, which
    an operator such as DDP's gradient hook can contain), and the backend's collectives;
    with ``gpu``, the kernels (NCCL's against the others)."""
    events = trace.complete()
    if gpu:
        kernels = [e for e in events if e.get("cat") == "kernel"]
        comm = [e for e in kernels if is_communication(e)]
        compute = [e for e in kernels if not is_communication(e)]
        return Activity(trace.rank, _spans(compute), _spans(comm))
    main = trace.main_thread()
    ops = [e for e in events if e.get("cat") == "cpu_op" and e["tid"] == main]
    calls = [e for e in ops if e.get("name", "").startswith(NOT_COMPUTING)]
    compute = subtract(_spans([e for e in ops if e not in calls]), _spans(calls))
    return Activity(trace.rank, tuple(compute), _spans([e for e in events
                                                        if is_communication(e)]))


def _spans(events: list[dict]) -> tuple[Interval, ...]:
    return tuple((e["ts"], e["ts"] + e["dur"]) for e in events)


def read_merged(path: str | Path) -> list[RankTrace]:
    """The ranks of a merged trace (:func:`merge_traces`), each as a trace of its own on
    the merged clock (``base_ns`` 0, ``ts`` in microseconds from the earliest event)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TraceError(f"{display_path(path)} is not a readable merged trace ({error})") \
            from None
    ranks = data.get("otherData", {}).get("ranks") if isinstance(data, dict) else None
    if not isinstance(ranks, list):
        raise TraceError(f"{display_path(path)} is not a merged trace (no otherData.ranks); "
                         "valid: a file written by merge_traces")
    events = data["traceEvents"]
    return [RankTrace(r, 0, tuple(e for e in events if e.get("pid") == r), str(path))
            for r in ranks]


def merged_problems(path: str | Path) -> list[str]:
    """What is wrong with a merged trace (empty when nothing is): a rank without a process
    named ``rank N``, or without events, or whose events are not in time order."""
    problems = []
    for trace in read_merged(path):
        events = trace.complete()
        named = any(e.get("name") == "process_name" and e.get("args", {}).get("name")
                    == f"rank {trace.rank}" for e in trace.events)
        if not named:
            problems.append(f"rank {trace.rank} has no process named 'rank {trace.rank}'")
        if not events:
            problems.append(f"rank {trace.rank} has no events")
        if any(a["ts"] > b["ts"] for a, b in zip(events, events[1:], strict=False)):
            problems.append(f"rank {trace.rank}'s events are not in time order")
    return problems
