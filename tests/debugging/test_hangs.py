"""The drills' diagnosis: the first collective on which the ranks disagree names the rank
out of step; the checks' errors name it too; every bad choice is refused by name."""

from __future__ import annotations

import pickle

import pytest

from helpers.debugging.hangs import (
    Call,
    FlightRecordError,
    blamed_by_checks,
    diagnose,
    expected_finding,
    read_dump,
    repaired_for_analyzer,
    validate_drills,
)
from helpers.runs.debugging.config import DrillConfig
from helpers.runs.debugging.drills import run_drills
from helpers.runs.debugging.results import DrillOutcome


def calls(*ops: str, group: str = "1") -> list[Call]:
    return [Call(group, i + 1, False, op, ((8,),), "train.py:3") for i, op in enumerate(ops)]


def test_the_odd_rank_out_is_named_at_the_first_disagreement():
    dumps = {0: calls("all_reduce", "all_reduce"), 1: calls("all_reduce", "broadcast"),
             2: calls("all_reduce", "all_reduce")}
    found = diagnose(dumps, "1")
    assert (found.kind, found.seq, found.culprits, found.op, found.waiting_in) == (
        "mismatch", 2, (1,), "broadcast", "all_reduce")
    assert "rank 1 called broadcast at train.py:3 as collective #2" in found.line()


def test_a_rank_that_never_called_the_collective_is_missing():
    dumps = {0: calls("all_reduce", "all_reduce"), 1: calls("all_reduce"),
             2: calls("all_reduce", "all_reduce")}
    found = diagnose(dumps, "1")
    assert (found.kind, found.seq, found.culprits, found.waiting_in) == (
        "missing", 2, (1,), "all_reduce")
    same = diagnose({r: calls("all_reduce") for r in range(3)}, "1")
    assert same.kind == "none" and "no disagreement" in same.line()


def test_sizes_count_as_a_disagreement_and_other_groups_are_ignored():
    odd = [Call("1", 1, False, "all_reduce", ((4,),), "x.py:1")]
    dumps = {0: calls("all_reduce") + calls("barrier", group="2"), 1: odd,
             2: calls("all_reduce")}
    assert diagnose(dumps, "1").culprits == (1,)
    with pytest.raises(FlightRecordError, match=r"no calls on group '9'; groups in the dumps"):
        diagnose(dumps, "9")
    with pytest.raises(FlightRecordError, match="no dumps"):
        diagnose({}, "1")


def test_a_dump_is_read_by_its_rank_and_checked(tmp_path):
    entry = {"process_group": ("3", "undefined"), "collective_seq_id": 1, "p2p_seq_id": 0,
             "is_p2p": False, "profiling_name": "gloo:all_reduce", "input_sizes": [[8]],
             "frames": [{"filename": "/x/torch/distributed/c10d.py", "line": 1, "name": "f"},
                        {"filename": "/work/train.py", "line": 7, "name": "step"}]}
    good = {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
            "entries": [entry]}
    (tmp_path / "fr_1").write_bytes(pickle.dumps(good))
    rank, found = read_dump(tmp_path / "fr_1")
    assert rank == 1 and found == [Call("3", 1, False, "all_reduce", ((8,),), "train.py:7 (step)")]
    assert repaired_for_analyzer(good, 2)["pg_config"] == {
        "3": {"name": "3", "desc": "undefined", "ranks": "[0, 1]"}}
    (tmp_path / "fr_2").write_bytes(b"not a pickle")
    with pytest.raises(FlightRecordError, match="not a readable Flight Recorder dump"):
        read_dump(tmp_path / "fr_2")
    (tmp_path / "fr_3").write_bytes(pickle.dumps({"entries": []}))
    with pytest.raises(FlightRecordError, match="no 'version' and 'entries'"):
        read_dump(tmp_path / "fr_3")
    with pytest.raises(FlightRecordError, match="must end in _<rank>"):
        read_dump(tmp_path / "fr_x")


def test_the_checks_errors_name_the_odd_rank_or_the_ranks_that_did_not_arrive():
    own = ("RuntimeError: Detected mismatch between collectives on ranks. Rank {r} is running "
           "collective: CollectiveFingerPrint(SequenceNumber=1, OpType={op}, TensorShape=[8]")
    errors = {0: own.format(r=0, op="ALLREDUCE"), 1: own.format(r=1, op="ALLREDUCE"),
              2: own.format(r=2, op="BROADCAST")}
    assert blamed_by_checks(errors) == ((2,), "broadcast")
    barrier = {0: "RuntimeError: [Rank 0]: Ranks 1, 2 failed to pass monitoredBarrier in 2000 ms"}
    assert blamed_by_checks(barrier) == ((1, 2), "monitored_barrier")
    assert blamed_by_checks({0: "RuntimeError: Timed out waiting 2000ms for recv"}) == ((), "")


def test_a_drill_is_named_only_when_ranks_kind_and_stacks_all_match():
    found = diagnose({0: calls("all_reduce", "all_reduce"), 1: calls("all_reduce", "all_reduce"),
                      2: calls("all_reduce")}, "1")
    stacks = {2: ["drill.py:50 in run_drill", "hangs.py:80 in straggler",
                  "hangs.py:70 in slow_batch"]}
    right = DrillOutcome("straggler", 2, found, stacks, {})
    assert right.named and right.site(2) == "hangs.py:70 in slow_batch"
    assert not DrillOutcome("straggler", 1, found, stacks, {}).named
    assert not DrillOutcome("straggler", 2, found, {2: ["x.py:1 in barrier"]}, {}).named
    assert not DrillOutcome("skip", 2, found, stacks, {}).named
    assert expected_finding("wrong_order", 2) == ("missing", (0, 1), "barrier", "recv")


def test_bad_drill_choices_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="unknown drill 'deadlock'; valid choices: skip"):
        validate_drills(["deadlock"])
    with pytest.raises(ValueError, match="one or more different drills"):
        validate_drills(["skip", "skip"])
    config = DrillConfig(out=str(tmp_path))
    with pytest.raises(ValueError, match="--culprit 5: no such rank; valid: 0 .. 2"):
        DrillConfig(out=str(tmp_path), culprit=5).validate(3)
    with pytest.raises(ValueError, match="ranks 0 and 1 are wrong_order's pair"):
        DrillConfig(out=str(tmp_path), culprit=1).validate(3)
    with pytest.raises(ValueError, match="valid: 3 ranks or more"):
        config.validate(2)
    with pytest.raises(ValueError, match="--hang-seconds 900"):
        DrillConfig(out=str(tmp_path), hang_seconds=900).validate(3)
    with pytest.raises(ValueError, match=r"timeout=3 s leaves the ranks too little time"):
        run_drills(config, timeout=3)


@pytest.mark.twin
@pytest.mark.torchrun
def test_every_drill_hangs_is_named_and_leaves_nothing_running(tmp_path):
    run = run_drills(DrillConfig(out=str(tmp_path / "drills"), hang_seconds=1.5), timeout=120)
    assert run.clean and "watchdogs took them down" in run.how_it_ended
    assert [o.drill for o in run.outcomes if o.named] == ["skip", "mismatch", "wrong_order",
                                                           "straggler"]
    assert run.outcome("wrong_order").doing(0) == "recv"
    with pytest.raises(ValueError, match="drill 'other' was not run"):
        run.outcome("other")


def test_a_detail_error_is_read_as_each_ranks_fingerprint():
    from helpers.debugging.hangs import fingerprints

    text = ("Detected mismatch between collectives on ranks. Rank 0 is running collective: "
            "CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[8]), but "
            "Rank 2 is running collective: CollectiveFingerPrint(SequenceNumber=1OpType=BARRIER)")
    assert fingerprints(text) == [(0, 1, "allreduce"), (2, 1, "barrier")]
    assert fingerprints("Timed out waiting 2000ms for recv") == []
