"""Each rank's Chrome trace is read and checked, the ranks merge into one timeline (every
rank a process, events in time order, one clock), and a rank's events split into computing
and communicating."""

from __future__ import annotations

import json

import pytest

from helpers.debugging.trace import (
    TraceError,
    merge_traces,
    rank_activity,
    read_merged,
    read_trace,
)

MAIN, GLOO = 100, 200


def write_rank(path, rank: int, base_ns: int, events: list[dict]) -> str:
    """A rank's trace as torch.profiler writes one (the fields the course reads)."""
    path.write_text(json.dumps({
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
        "baseTimeNanoseconds": base_ns, "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python"}},
            *[{"ph": "X", "pid": 7, **e} for e in events]]}))
    return str(path)


def op(name: str, ts: float, dur: float, tid: int = MAIN, cat: str = "cpu_op") -> dict:
    return {"name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat}


def step_events() -> list[dict]:
    """A backward whose gradient hook calls the all-reduce from inside an operator."""
    return [op("ddp step", 0, 100, cat="user_annotation"), op("aten::mm", 0, 40),
            op("AccumulateGrad", 40, 30), op("c10d::allreduce_", 50, 10),
            op("aten::mm", 45, 5), op("gloo:all_reduce", 55, 40, GLOO, "user_annotation")]


def test_merged_ranks_are_processes_on_one_clock_in_time_order(tmp_path):
    a = write_rank(tmp_path / "r0.json", 0, 1_000_000, step_events())
    b = write_rank(tmp_path / "r1.json", 1, 1_002_000, step_events())  # 2 us later
    merged = merge_traces([b, a], tmp_path / "merged.json")
    assert merged.ranks == (0, 1) and merged.events_per_rank == (6, 6)
    data = json.loads((tmp_path / "merged.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in data["traceEvents"]
             if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    timed = [e["ts"] for e in data["traceEvents"] if e["ph"] != "M"]
    assert timed == sorted(timed)
    ranks = read_merged(tmp_path / "merged.json")
    assert ranks[1].span("ddp step")[0] - ranks[0].span("ddp step")[0] == pytest.approx(2.0)


def test_computing_leaves_out_the_time_inside_a_collective_call(tmp_path):
    trace = read_trace(write_rank(tmp_path / "r0.json", 0, 0, step_events()))
    act = rank_activity(trace)
    assert act.computing == ((0, 50), (60, 70)) and act.communicating == ((55, 95),)
    from helpers.debugging.overlap import breakdown  # a constructed trace, a known share:
    parts = breakdown(act.computing, act.communicating, trace.span("ddp step"))
    assert parts.overlap_share == 10 / 40 and parts.idle == 10  # 60-70 of 55-95; 50-55, 95-100


@pytest.mark.parametrize("text, message", [
    ('{"traceEvents": [', "not complete JSON"),
    ('{"events": []}', "no 'traceEvents' list"),
    ('[1, 2]', "no 'traceEvents' list"),
    ('{"traceEvents": []}', "names no rank"),
    ('{"distributedInfo": {"rank": 0}, "traceEvents": [{"ph": "X", "name": "mm"}]}',
     "no numeric ts and dur"),
])
def test_a_file_that_is_not_a_rank_trace_is_refused(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_two_traces_of_one_rank_and_a_missing_mark_are_refused(tmp_path):
    a = write_rank(tmp_path / "a.json", 0, 0, step_events())
    b = write_rank(tmp_path / "b.json", 0, 0, step_events())
    with pytest.raises(TraceError, match="two traces of the same rank"):
        merge_traces([a, b], tmp_path / "m.json")
    with pytest.raises(TraceError, match="no event 'pipeline step'; its marks: "):
        read_trace(a).span("pipeline step")
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "missing.json")
    with pytest.raises(TraceError, match="not a merged trace"):
        read_merged(a)


def test_a_merged_trace_out_of_order_or_unnamed_is_reported(tmp_path):
    from helpers.debugging.trace import merged_problems

    a = write_rank(tmp_path / "r0.json", 0, 0, step_events())
    merged = merge_traces([a], tmp_path / "m.json")
    assert merged_problems(merged.path) == []
    data = json.loads((tmp_path / "m.json").read_text())
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("name") != "process_name"]
    data["traceEvents"].reverse()
    (tmp_path / "m.json").write_text(json.dumps(data))
    assert merged_problems(tmp_path / "m.json") == [
        "rank 0 has no process named 'rank 0'", "rank 0's events are not in time order"]
