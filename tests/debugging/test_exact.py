"""Lesson 12's helpers to the letter: each drill's calls in order, the merged trace's every
field, the GPU branch of a rank's activity, the peak's benchmark and every refusal's words.
(The tests that kill the mutants the looser tests let through: `make mutants PART=debugging`.)"""

from __future__ import annotations

import json

import pytest
import torch

from helpers.core.paths import display_path
from helpers.debugging import flops, hangs
from helpers.debugging.hangs import Finding, expected_finding
from helpers.debugging.trace import (
    TraceError,
    is_communication,
    merge_traces,
    rank_activity,
    read_trace,
)


class FakeDist:
    """Records each collective call of a drill, by rank, instead of communicating."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def all_reduce(self, tensor, group=None):
        self.calls.append(("all_reduce", tuple(tensor.shape), float(tensor[0]), group))

    def broadcast(self, tensor, src, group=None):
        self.calls.append(("broadcast", tuple(tensor.shape), src, group))

    def barrier(self, group=None):
        self.calls.append(("barrier", group))

    def recv(self, tensor, src, group=None):
        self.calls.append(("recv", tuple(tensor.shape), src, group))

    def send(self, tensor, dst, group=None):
        self.calls.append(("send", tuple(tensor.shape), float(tensor[0]), dst, group))

    def monitored_barrier(self, group=None, timeout=None, wait_all_ranks=False):
        self.calls.append(("monitored_barrier", group, timeout.total_seconds(), wait_all_ranks))


@pytest.fixture
def fake(monkeypatch):
    recorder = FakeDist()
    monkeypatch.setattr(hangs, "dist", recorder)
    slept = []
    monkeypatch.setattr(hangs.time, "sleep", slept.append)
    recorder.slept = slept
    return recorder


def calls_of(fake, drill, rank, *args, **kwargs):
    fake.calls.clear()
    drill(rank, "G", *args, **kwargs)
    return list(fake.calls)


def test_each_drill_makes_the_calls_it_plants(fake):
    n = (hangs.GRADIENT,)
    both = [("all_reduce", n, 1.0, "G"), ("all_reduce", n, 1.0, "G")]
    assert calls_of(fake, hangs.skip, 0, 2) == [*both, ("barrier", "G")]
    assert calls_of(fake, hangs.skip, 2, 2) == [both[0], ("barrier", "G")]
    assert calls_of(fake, hangs.mismatch, 1, 2) == both
    assert calls_of(fake, hangs.mismatch, 2, 2) == [both[0], ("broadcast", n, 0, "G")]
    assert calls_of(fake, hangs.wrong_order, 0, 2) == [
        ("recv", n, 1, "G"), ("send", n, 0.0, 1, "G"), ("barrier", "G")]
    assert calls_of(fake, hangs.wrong_order, 1, 2) == [
        ("recv", n, 0, "G"), ("send", n, 1.0, 0, "G"), ("barrier", "G")]
    assert calls_of(fake, hangs.wrong_order, 2, 2) == [("barrier", "G")]
    assert calls_of(fake, hangs.straggler, 1, 2) == both and fake.slept == []
    assert calls_of(fake, hangs.straggler, 2, 2) == both and fake.slept == [3600.0]
    assert calls_of(fake, hangs.straggler, 2, 2, seconds=5, check_seconds=1.5) == [
        both[0], ("monitored_barrier", "G", 1.5, True), both[1]]
    assert fake.slept[-1] == 5


def test_expected_findings_and_finding_lines_word_for_word():
    assert [expected_finding(d, 2) for d in hangs.DRILLS] == [
        ("mismatch", (2,), "all_reduce", "barrier"),
        ("mismatch", (2,), "all_reduce", "broadcast"),
        ("missing", (0, 1), "barrier", "recv"),
        ("missing", (2,), "all_reduce", "slow_batch")]
    assert Finding("1", "mismatch", 2, (2,), "barrier", "all_reduce", "x.py:3").line() == (
        "rank 2 called barrier at x.py:3 as collective #2, where the other ranks called "
        "all_reduce")
    assert Finding("1", "mismatch", 2, (2,), "barrier", "all_reduce", "?").line() == (
        "rank 2 called barrier as collective #2, where the other ranks called all_reduce")
    assert Finding("1", "missing", 1, (0, 1), "", "barrier", "").line() == (
        "ranks 0, 1 never called collective #1 (barrier), which the other ranks wait in")
    assert Finding("1", "missing", 2, (2,), "", "all_reduce", "").line() == (
        "rank 2 never called collective #2 (all_reduce), which the other ranks wait in")
    assert Finding("1", "none", 3, (), "", "", "").line() == (
        "every rank called the same collectives: no disagreement recorded")
    with pytest.raises(ValueError, match="unknown drill 'x'"):
        expected_finding("x", 2)


def rank_file(path, rank: int, base_ns: int, events: list[dict]) -> str:
    path.write_text(json.dumps({"distributedInfo": {"rank": rank}, "baseTimeNanoseconds": base_ns,
                                "traceEvents": events}))
    return str(path)


def test_the_merged_file_field_by_field(tmp_path):
    a = rank_file(tmp_path / "a.json", 1, 5_000, [
        {"ph": "M", "name": "process_name", "pid": 9, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 9, "tid": 4, "args": {"name": "main"}},
        {"ph": "X", "name": "mm", "pid": 9, "tid": 4, "ts": 3.0, "dur": 2.0, "cat": "cpu_op"},
        {"ph": "X", "name": "add", "pid": 9, "tid": 4, "ts": 1.0, "dur": 1.0, "cat": "cpu_op"}])
    b = rank_file(tmp_path / "b.json", 0, 7_000, [
        {"ph": "X", "name": "mm", "pid": 3, "tid": 8, "ts": 0.5, "dur": 1.0, "cat": "cpu_op"}])
    merged = merge_traces([a, b], tmp_path / "m.json")
    assert (merged.ranks, merged.events_per_rank, merged.origin_ns) == ((0, 1), (1, 2), 6_000)
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["displayTimeUnit"] == "ms" and data["otherData"] == {"ranks": [0, 1],
                                                                     "origin_ns": 6_000}
    assert data["traceEvents"] == [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "rank 0"}},
        {"ph": "M", "name": "process_sort_index", "pid": 0, "tid": 0, "args": {"sort_index": 0}},
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "rank 1"}},
        {"ph": "M", "name": "process_sort_index", "pid": 1, "tid": 0, "args": {"sort_index": 1}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 4, "args": {"name": "main"}},
        {"ph": "X", "name": "add", "pid": 1, "tid": 4, "ts": 0.0, "dur": 1.0, "cat": "cpu_op"},
        {"ph": "X", "name": "mm", "pid": 0, "tid": 8, "ts": 1.5, "dur": 1.0, "cat": "cpu_op"},
        {"ph": "X", "name": "mm", "pid": 1, "tid": 4, "ts": 2.0, "dur": 2.0, "cat": "cpu_op"}]


def test_every_refusal_of_a_trace_file_word_for_word(tmp_path):
    def refused(text: str) -> str:
        path = tmp_path / "t.json"
        path.write_text(text)
        with pytest.raises(TraceError) as info:
            read_trace(path)
        return str(info.value)

    where = display_path(tmp_path / "t.json")
    assert refused("[1]") == (
        f"{where} is not a Chrome trace: no 'traceEvents' list (found list); valid: a file "
        "written by torch.profiler's export_chrome_trace")
    assert refused('{"b": 1, "a": 2}') == (
        f"{where} is not a Chrome trace: no 'traceEvents' list (found ['a', 'b']); valid: a "
        "file written by torch.profiler's export_chrome_trace")
    assert refused('{"traceEvents": [], "distributedInfo": {"rank": "0"}}') == (
        f"{where} names no rank ('distributedInfo'); valid: a trace recorded on a rank of an "
        "initialised process group")
    assert refused('{"traceEvents": [{"ph": "X", "name": "mm", "ts": 1}], '
                   '"distributedInfo": {"rank": 0}}') == (
        f"{where}: event 'mm' has no numeric ts and dur; valid: complete events ('ph': 'X') "
        "with both")
    assert refused('{"traceEvents": [').startswith(f"{where} is not complete JSON (")
    assert refused('{"traceEvents": [').endswith(
        "); a trace cut short (a rank killed while writing) cannot be read: write it again "
        "with export_chrome_trace")
    ok = read_trace(rank_file(tmp_path / "ok.json", 3, 0, [
        {"ph": "X", "name": "mm", "ts": 1, "dur": 2, "tid": 1},
        {"ph": "i", "name": "mark", "ts": "late"}]))  # only complete events need numbers
    assert ok.rank == 3 and ok.base_ns == 0 and len(ok.events) == 2


def test_a_gpu_rank_is_its_kernels_and_nccl_is_communication(tmp_path):
    events = [{"ph": "X", "name": "ncclDevKernel_AllReduce", "cat": "kernel", "ts": 10, "dur": 5,
               "tid": 7},
              {"ph": "X", "name": "ampere_sgemm", "cat": "kernel", "ts": 0, "dur": 12, "tid": 7},
              {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 0, "dur": 30, "tid": 1}]
    trace = read_trace(rank_file(tmp_path / "g.json", 0, 0, events))
    act = rank_activity(trace, gpu=True)
    assert (act.rank, act.computing, act.communicating) == (0, ((0, 12),), ((10, 15),))
    assert is_communication({"name": "nccl:all_reduce"}) and is_communication(
        {"name": "gloo:recv"}) and not is_communication({"name": "c10d::allreduce_"})
    assert not is_communication({"name": "gemm", "cat": "kernel"})
    with pytest.raises(TraceError, match="has no operator events"):
        rank_activity(trace.__class__(0, 0, (events[0],), "x"))


def test_the_peak_benchmark_as_configured(monkeypatch):
    seen = {}

    class FakeTimer:
        def __init__(self, stmt, globals, num_threads):  # noqa: A002 - Timer's own name
            seen.update(stmt=stmt, a=globals["a"], b=globals["b"], threads=num_threads)
            self.runs = []

        def timeit(self, number):
            self.runs.append(number)
            return type("M", (), {"mean": 0.5 * len(self.runs)})()

    monkeypatch.setattr("torch.utils.benchmark.Timer", FakeTimer)
    peak = flops.measure_peak()
    assert (peak.size, peak.threads, peak.dtype) == (512, 1, "float32")
    assert peak.seconds == [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]  # 7 blocks after one warm-up
    assert peak.flops_per_s == 2 * 512**3 / 1.0
    assert seen["stmt"] == "a @ b" and seen["threads"] == 1
    g = torch.Generator().manual_seed(0)
    assert torch.equal(seen["a"], torch.randn(512, 512, generator=g))
    assert torch.equal(seen["b"], torch.randn(512, 512, generator=g))
    half = flops.measure_peak(64, threads=2, dtype=torch.float64, repeats=1, number=5)
    assert (half.threads, half.dtype, len(half.seconds)) == (2, "float64", 1)
    assert seen["a"].dtype == torch.float64 and seen["threads"] == 2
    for bad in ({"repeats": 0}, {"number": 0}, {"repeats": 1.5}, {"number": "3"}):
        with pytest.raises(ValueError) as info:
            flops.measure_peak(64, **bad)
        assert str(info.value).endswith("; valid: integers >= 1")
    assert flops.measure_peak(64, repeats=1, number=1).seconds == [1.0]


def test_interval_edges_touching_and_empty():
    from helpers.debugging.intervals import intersect, subtract, union

    assert union([(0, 0), (1, 2)]) == [(1.0, 2.0)]  # an empty interval is skipped, not the end
    with pytest.raises(ValueError) as info:
        union([(2, 1)])
    assert str(info.value) == "interval (2.0, 1.0) ends before it starts; valid: start <= end"
    assert intersect([(0, 5)], [(5, 9)]) == []  # touching is not overlapping
    assert intersect([(0, 10)], [(1, 2), (3, 4), (5, 6)]) == [(1, 2), (3, 4), (5, 6)]
    assert subtract([(0, 10)], [(0, 3)]) == [(3, 10)]
    assert subtract([(0, 10)], [(5, 10)]) == [(0, 5)]
    assert subtract([(0, 10)], [(-5, 0), (10, 12)]) == [(0, 10)]


def test_the_shares_of_a_window_by_name():
    from helpers.debugging.overlap import Breakdown, breakdown

    parts = breakdown([(0, 2)], [(1, 3)], window=(0, 4))
    assert parts.shares() == {"computing only": 0.25, "communicating only": 0.25,
                              "both": 0.25, "idle": 0.25}
    empty = Breakdown(0.0, 0.0, 0.0, 0.0, 0.0)
    assert empty.shares() == {"computing only": 0.0, "communicating only": 0.0, "both": 0.0,
                              "idle": 0.0}
    assert (empty.computing_share, empty.idle_share, empty.overlap_share) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"window \(3, 1\) ends before it starts"):
        breakdown([(0, 1)], [], window=(3, 1))


def test_every_finding_field_by_field():
    from helpers.debugging.hangs import Call, FlightRecordError, diagnose

    def calls(*ops):
        return [Call("7", i + 1, False, op, ((4,),), "t.py:9") for i, op in enumerate(ops)]

    assert diagnose({0: calls("a", "b"), 1: calls("a", "c"), 2: calls("a", "b")}, "7") == (
        Finding("7", "mismatch", 2, (1,), "c", "b", "t.py:9"))
    assert diagnose({0: calls("a", "b"), 1: calls("a"), 2: calls("a", "b")}, "7") == (
        Finding("7", "missing", 2, (1,), "", "b", ""))
    assert diagnose({0: calls("a", "b"), 1: calls("a", "b")}, "7") == (
        Finding("7", "none", 2, (), "", "", ""))
    with pytest.raises(FlightRecordError) as info:
        diagnose({}, "7")
    assert str(info.value) == "no dumps to diagnose; valid: one dump per rank of the group"
    with pytest.raises(FlightRecordError) as info:
        diagnose({0: calls("a")}, "8")
    assert str(info.value) == "no calls on group '8'; groups in the dumps: ['7']"


def test_a_dump_entry_read_field_by_field(tmp_path):
    import pickle

    from helpers.debugging.hangs import Call, FlightRecordError, read_dump

    def entry(**changes):
        return {"process_group": ("5", "tp"), "collective_seq_id": 4, "p2p_seq_id": 2,
                "is_p2p": False, "profiling_name": "nccl:all_gather", "input_sizes": [[2, 3]],
                **changes}

    dump = {"version": "2.10", "entries": [
        entry(), entry(is_p2p=True, profiling_name="gloo:send", frames=[
            {"filename": "/x/torch/a.py", "line": 1, "name": "f"}])]}
    (tmp_path / "x_fr_12").write_bytes(pickle.dumps(dump))
    rank, found = read_dump(tmp_path / "x_fr_12")
    assert rank == 12 and found == [Call("5", 4, False, "all_gather", ((2, 3),), "?"),
                                    Call("5", 2, True, "send", ((2, 3),), "?")]
    (tmp_path / "fr_1").write_bytes(pickle.dumps({"version": "2.10", "entries": [],
                                                  "pg_config": {}}))
    assert read_dump(tmp_path / "fr_1") == (1, [])
    (tmp_path / "fr_2").write_bytes(pickle.dumps({"entries": [], "pg_config": {}}))
    with pytest.raises(FlightRecordError) as info:
        read_dump(tmp_path / "fr_2")
    assert str(info.value).endswith(
        "has no 'version' and 'entries': not a dump of "
        "torch._C._distributed_c10d._dump_fr_trace()")
    with pytest.raises(FlightRecordError) as info:
        read_dump(tmp_path / "fr")
    assert str(info.value).endswith(": the name must end in _<rank>, e.g. fr_0")


def test_merging_keeps_metadata_first_and_drops_each_ranks_process_records(tmp_path):
    a = rank_file(tmp_path / "a.json", 0, 0, [
        {"ph": "M", "name": "process_labels", "pid": 9, "tid": 0, "ts": 1.0, "args": {}},
        {"ph": "M", "name": "process_sort_index", "pid": 9, "tid": 0, "ts": 1.0, "args": {}},
        {"ph": "X", "name": "mm", "pid": 9, "tid": 4, "ts": 2.0, "dur": 1.0},
        {"ph": "M", "name": "thread_name", "pid": 9, "tid": 4, "ts": 9.0, "args": {"name": "t"}},
        {"ph": "X", "name": "early", "pid": 9, "tid": 4, "ts": 1.0, "dur": 0.5}])
    merge_traces([a], tmp_path / "m.json")
    events = json.loads((tmp_path / "m.json").read_text())["traceEvents"]
    assert [(e["ph"], e["name"], e.get("ts")) for e in events] == [
        ("M", "process_name", None), ("M", "process_sort_index", None),
        ("M", "thread_name", 8.0), ("X", "early", 0.0), ("X", "mm", 1.0)]


def test_a_merged_file_read_back_and_its_refusals(tmp_path):
    from helpers.debugging.trace import RankTrace, merged_problems, read_merged

    merged = merge_traces([rank_file(tmp_path / "a.json", 2, 0, [
        {"ph": "X", "name": "mm", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0}])],
        tmp_path / "m.json")
    (back,) = read_merged(merged.path)
    assert isinstance(back, RankTrace) and (back.rank, back.base_ns, back.path) == (
        2, 0, merged.path) and len(back.events) == 3
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(TraceError) as info:
        read_merged(tmp_path / "bad.json")
    assert str(info.value).startswith(
        f"{display_path(tmp_path / 'bad.json')} is not a readable merged trace (")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(TraceError) as info:
        read_merged(tmp_path / "list.json")
    assert str(info.value) == (f"{display_path(tmp_path / 'list.json')} is not a merged trace "
                               "(no otherData.ranks); valid: a file written by merge_traces")
    (tmp_path / "e.json").write_text(json.dumps({"otherData": {"ranks": [0]}, "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0}]}))
    assert merged_problems(tmp_path / "e.json") == [
        "rank 0 has no process named 'rank 0'", "rank 0 has no events"]


def test_a_missing_mark_and_a_trace_without_operators_are_named_exactly(tmp_path):
    trace = read_trace(rank_file(tmp_path / "a.json", 0, 0, [
        {"ph": "X", "name": "step", "cat": "user_annotation", "ts": 0, "dur": 1, "tid": 1},
        {"ph": "X", "name": "gloo:all_reduce", "cat": "user_annotation", "ts": 0, "dur": 1,
         "tid": 2},
        {"ph": "X", "name": "mm", "cat": "cpu_op", "ts": 0, "dur": 1, "tid": 1}]))
    with pytest.raises(TraceError) as info:
        trace.span("other")
    assert str(info.value) == (f"{display_path(tmp_path / 'a.json')} has no event 'other'; "
                               "its marks: ['gloo:all_reduce', 'step']")
    bare = read_trace(rank_file(tmp_path / "b.json", 0, 0, []))
    with pytest.raises(TraceError) as info:
        bare.main_thread()
    assert str(info.value) == (f"{display_path(tmp_path / 'b.json')} has no operator events "
                               "(cat 'cpu_op'); record with torch.profiler's CPU activity")


def test_the_per_block_keys_name_the_model():
    from helpers.debugging.plan_counts import predicted_per_block

    assert list(predicted_per_block(1, False)) == ["TinyLM.blocks.0 (forward)",
                                                   "TinyLM.blocks.0 (backward)"]


def test_utilisation_divides_by_the_seconds_and_the_peak():
    """6 GFLOP in 2 s on a 1 GFLOP/s peak: 3 GFLOP/s, three times the peak."""
    assert flops.utilisation(6e9, 2.0, 1e9) == 3.0


def test_a_window_that_does_not_start_at_zero():
    """Window (10, 30): computing 12-20, communicating 15-25; by hand 3 + 5 + 5 + 7 = 20."""
    from helpers.debugging.overlap import breakdown

    b = breakdown([(12.0, 20.0)], [(15.0, 25.0)], window=(10.0, 30.0))
    assert (b.window, b.computing_only, b.communicating_only, b.both, b.idle) == (
        20.0, 3.0, 5.0, 5.0, 7.0)


def test_the_analytic_counts_are_integers_and_keep_the_tokens():
    """``N`` is a count of weights (an int); the step keeps its ``batch x seq`` tokens."""
    from helpers.debugging.flops import matmul_weights, step_flops
    from helpers.models.llama import LMConfig

    config = LMConfig(vocab=32, hidden=16, blocks=2, ffn=24, heads=4, kv_heads=2)
    assert type(matmul_weights(config)) is int
    # by hand: head_dim 4; attention 2*16*4*4 + 2*16*2*4 = 768; MLP 3*16*24 = 1152;
    # 2 blocks of 1920, plus the head 16*32 = 512
    assert matmul_weights(config) == 2 * 1920 + 512
    assert step_flops(config, 3, 5).tokens == 15


@pytest.mark.parametrize("name, want", [("h100", "H100 SXM"), ("NVIDIA H200", "H200 SXM"),
                                        ("a100-sxm4-80gb", "A100 SXM 80GB")])
def test_a_peak_is_found_whatever_the_case(name, want):
    """Device names come in any case (torch.cuda.get_device_name prints 'NVIDIA H100 ...')."""
    assert flops.gpu_peak(name).name == want


def test_the_flop_and_window_refusals_word_for_word():
    """What a learner reads on bad input, exactly."""
    from helpers.debugging.intervals import union
    from helpers.debugging.overlap import breakdown

    with pytest.raises(ValueError) as info:
        flops.utilisation(1.0, 0.0, 2.0)
    assert str(info.value) == "seconds=0.0, peak=2.0; valid: both > 0"
    with pytest.raises(ValueError) as info:
        flops.gpu_peak("TPU")
    assert str(info.value) == ("no published peak for 'TPU'; valid: A100 SXM 80GB, H100 SXM, "
                               "H200 SXM")
    with pytest.raises(ValueError) as info:
        breakdown([], [])
    assert str(info.value) == ("no events and no window: valid: at least one interval, or a "
                               "window")
    with pytest.raises(ValueError) as info:
        breakdown([(0.0, 1.0)], [], window=(2.0, 1.0))
    assert str(info.value) == "window (2.0, 1.0) ends before it starts; valid: start <= end"
    with pytest.raises(ValueError) as info:
        union([(3.0, 1.0)])
    assert str(info.value) == "interval (3.0, 1.0) ends before it starts; valid: start <= end"
    with pytest.raises(ValueError) as info:
        flops.measure_peak(size=32)
    assert str(info.value) == "size=32; valid: an integer >= 64"
    with pytest.raises(ValueError) as info:
        flops.measure_peak(repeats=0)
    assert str(info.value) == "repeats=0, number=3; valid: integers >= 1"
