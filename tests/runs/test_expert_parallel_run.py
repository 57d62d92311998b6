"""The expert-parallel run: its refusals before any launch, its verdicts, and two launches
under torchrun (routing as drawn, then with capacity dropping), each proven equal to one
process with its bytes as the routing predicts."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest

from helpers.core.checks import Proof
from helpers.core.flags import flag
from helpers.runs.contract import launch
from helpers.runs.expert_parallel.config import EPLayerConfig
from helpers.runs.expert_parallel.results import EPLayerResult, RankSide
from helpers.runs.llama_3d.processes import survivors
from helpers.torchrun.launcher import rank_logs


@pytest.mark.parametrize("config, world, match", [
    (EPLayerConfig(experts=6), 4,
     r"--experts 6 is not divisible by ep=4; valid ep: \[1, 2, 3, 6\]"),
    (EPLayerConfig(ep=4), 2, "--ep 4 but the world size is 2; valid: --ep 2"),
    (EPLayerConfig(ep=0), 2, "--ep 0; valid: an integer >= 1"),
    (EPLayerConfig(top_k=0), 2, "--top-k 0; valid: an integer from 1 to --experts 4"),
    (EPLayerConfig(top_k=5), 2, "--top-k 5; valid: an integer from 1 to --experts 4"),
    (EPLayerConfig(capacity_factor=0.0), 2, "--capacity-factor 0.0; valid: a number > 0, or none"),
    (EPLayerConfig(capacity_factor=-1.5), 2, "--capacity-factor -1.5; valid: a number > 0"),
    (EPLayerConfig(hidden=0), 2, "--hidden 0; valid: an integer >= 1"),
    (EPLayerConfig(ffn=-1), 2, "--ffn -1; valid: an integer >= 1"),
    (EPLayerConfig(tokens=0), 2, "--tokens 0; valid: an integer >= 1"),
    (EPLayerConfig(experts=0), 2, "--experts 0; valid: an integer >= 1"),
    (EPLayerConfig(repeats=0), 2, "--repeats 0; valid: an integer >= 1"),
    (EPLayerConfig(aux_weight=-0.1), 2, "--aux-weight -0.1; valid: a number >= 0"),
    (EPLayerConfig(device="tpu"), 2, "--device 'tpu'; valid choices: auto, cpu, cuda"),
    (EPLayerConfig(a2a_repeats=0), 2, "--a2a-repeats 0; valid: an integer >= 1"),
    (EPLayerConfig(a2a_sizes=(4096,)), 2, "--a2a-sizes 4096; valid: two or more different"),
    (EPLayerConfig(a2a_sizes=(4096, 4096)), 2, "--a2a-sizes 4096,4096; valid: two or more"),
    (EPLayerConfig(a2a_sizes=(0, 4096)), 2, "--a2a-sizes 0,4096; valid: .* each an integer >= 1"),
    (EPLayerConfig(a2a_sizes=(8, 12)), 2,
     "--a2a-sizes 8,12 all send 8 B per rank on 2 ranks .*valid: two or more sizes that differ"),
])
def test_bad_input_is_refused_naming_the_value_and_the_choices(config, world, match):
    with pytest.raises(ValueError, match=match):
        config.validate(world)


def test_a_bad_launch_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="--ep 4 but the world size is 2"):
        launch(EPLayerConfig(ep=4), nproc=2)


def test_help_lists_every_flag_and_the_flags_round_trip():
    text = EPLayerConfig.parser().format_help()
    for f in fields(EPLayerConfig):
        assert flag(f.name) in text, f.name
    config = EPLayerConfig(ep=2, experts=8, top_k=1, capacity_factor=1.25, shared=True)
    assert EPLayerConfig.from_args(config.args()) == config


def _side(rank: int, a2a_forward: float = 24, a2a_backward: float = 16) -> RankSide:
    """A rank of ep=2, two experts, hidden 1: one row to each expert from each rank."""
    return RankSide(rank, [rank], [1, 1], [1, 1], [1, 1], [2], [2],
                    {"all_to_all": a2a_forward, "all_reduce": 16.0},
                    {"all_to_all": a2a_backward}, {"all_reduce": 16.0}, 40.0, None, [0.001],
                    [[1e-4], [2e-4]], [1e-4], [1e-4])


def test_the_verdicts_are_decided_by_the_result():
    """Counts 8 B, dispatch and combine 8 B each forward, both again backward; the counts'
    all-reduce and the router's 16 B gradient by the ring formula: 16 B each on 2 ranks."""
    good = EPLayerResult(2, 2, 1, 1, 2, None, [Proof("output", 1e-16, 1e-13)],
                         {"output": 0.001}, [_side(0), _side(1)], [16], 0, [1000, 2000])
    assert good.verdicts == {"proven": True, "elementwise": True, "bytes_as_predicted": True,
                             "drops_as_one_device": True}
    assert good.tokens_per_expert == [2, 2] and good.imbalance == 1.0
    assert not replace(good, ranks=[_side(0), _side(1, a2a_backward=17)]).bytes_as_predicted
    assert not replace(good, proofs=[Proof("output", 1e-12, 1e-13)]).proven.ok
    assert not replace(good, ratios={"output": 1.5}).elementwise
    assert not replace(good, reference_dropped=1).drops_as_one_device


ALPHA, BETA = 50e-6, 1e-9  # seconds, seconds per byte: 1 GB/s


def _timed_side(rank: int, counts: list[int], slow: float) -> RankSide:
    """A rank of ep=2, four experts, hidden 8 (64 B a float64 row), whose fit times lie on
    ``ALPHA + BETA x bytes`` exactly (times ``slow``), and whose dispatch and combine took
    what the lines below say."""
    sizes = [1000, 4000, 16000]
    fit = [[(ALPHA + BETA * b) * slow * f for f in (1.0, 0.5, 2.0)] for b in sizes]
    return RankSide(rank, [2 * rank, 2 * rank + 1], counts, [0, 0], [0, 0], [0, 0], [0, 0],
                    {}, {}, {}, 0.0, None, [0.01], fit,
                    [1e-4 * (rank + 1), 3e-4], [2e-4, 2e-4 * (rank + 1)])


def test_the_all_to_all_is_set_against_the_fit_from_the_routing():
    """Rank 0 sends 3 rows to rank 1's experts and receives 5 (192 B out, 320 B in); the
    fit is read at what each rank sends, and at the busiest rank's 320 B for the call;
    the call's time is the slowest rank's, repeat by repeat."""
    ranks = [_timed_side(0, [1, 1, 2, 1], 1.0), _timed_side(1, [3, 2, 0, 4], 1.5)]
    run = EPLayerResult(2, 4, 1, 8, 5, None, [Proof("output", 0.0, 1.0)], {"output": 0.0},
                        ranks, [], 0, [1000, 4000, 16000])
    fit = run.a2a_fit  # per repeat the slower rank (1.5 x the line), median over repeats
    assert fit.alpha_s == pytest.approx(1.5 * ALPHA) and fit.beta_s_per_byte == pytest.approx(1.5 * BETA)
    rows = {(r.call, r.who): r for r in run.a2a_rows()}
    assert [(r.sent, r.received) for r in rows.values()] == [
        (192, 320), (320, 192), (320, 320), (320, 192), (192, 320), (320, 320)]
    assert rows["dispatch", "rank 0"].predicted_s == pytest.approx(fit.predict(192))
    assert rows["dispatch", "slowest rank"].predicted_s == pytest.approx(fit.predict(320))
    assert rows["combine", "slowest rank"].predicted_s == pytest.approx(fit.predict(320))
    assert rows["dispatch", "slowest rank"].seconds == [2e-4, 3e-4]
    assert rows["combine", "slowest rank"].seconds == [2e-4, 4e-4]
    assert rows["dispatch", "rank 1"].mean_ms == pytest.approx(0.25)
    assert rows["combine", "slowest rank"].median_ms == pytest.approx(0.3)
    assert all(r.predicted_ok for r in rows.values())
    table = run.a2a_table()
    assert "alpha = 75 us, 1/beta = 0.67 GB/s" in table and len(table.splitlines()) == 3 + 6 + 1
    assert "the busiest's" in table.splitlines()[5]
    assert max(len(line) for line in table.splitlines()) <= 100
    with pytest.raises(ValueError, match="ep=2: no all-to-all was timed"):
        replace(run, a2a_sent=[]).a2a_table()


def _printed(log_dir) -> dict:
    """The JSON line rank 0 printed."""
    out = next(p for p in rank_logs(log_dir, 0) if p.name.startswith("stdout"))
    return json.loads(next(line for line in out.read_text().splitlines()
                           if line.startswith("{")))


@pytest.mark.twin
@pytest.mark.torchrun
def test_expert_parallel_on_torchrun_is_proven_counted_and_drops_as_one_device(tmp_path):
    """Lesson 11's dropping launch (top-2, a shared expert, capacity factor 1; a twin:
    ``make test`` runs it in the lesson): proven within the bound, every rank's bytes from
    its routing, the same assignments dropped as one process drops, and the JSON line's
    verdicts booleans."""
    run = launch(EPLayerConfig(ep=2, capacity_factor=1.0, top_k=2, shared=True, repeats=3,
                               warmup=2, device="cpu"), nproc=2, timeout=180,
                 log_dir=tmp_path / "logs")
    assert isinstance(run, EPLayerResult) and run.proven.ok, run.proven.table()
    assert run.bytes_as_predicted and run.elementwise
    assert run.dropped > 0 and run.drops_as_one_device, (run.dropped, run.reference_dropped)
    assert run.capacity == 64 and all(k <= 64 for r in run.ranks for k in r.kept)
    assert len(run.proofs) == 3 + 1 + 3 * 4 + 3  # output, aux, input; router; 4 experts; shared
    assert any(p.what.startswith("grad shared.") for p in run.proofs)
    assert sum(run.tokens_per_expert) == 2 * 64 * 2 and run.imbalance >= 1.0
    assert all(r.wire_sent is None or r.wire_sent >= r.gloo_sent for r in run.ranks)
    assert all(len(r.seconds) == 3 and r.mean_ms > 0 for r in run.ranks)
    sizes = EPLayerConfig().a2a_sizes  # each rank sends what was asked, in float64 blocks
    assert run.a2a_sent == [b // 8 * 8 for b in sizes]
    assert all(len(r.a2a_seconds) == len(sizes) and len(r.dispatch_seconds) == 20
               and len(r.combine_seconds) == 20 for r in run.ranks)
    rows = run.a2a_rows()  # timing: no verdict (a fit on busy cores may even give alpha < 0)
    assert len(rows) == 2 * 3 and all(r.mean_ms > 0 for r in rows)
    assert [r.sent for r in rows if r.who != "slowest rank"] == [
        run.predicted(0).dispatch, run.predicted(1).dispatch,
        run.predicted(0).combine, run.predicted(1).combine]
    line = _printed(tmp_path / "logs")
    assert line["ep"] == 2 and line["dropped"] == run.dropped
    assert line["dispatch_fit_ms"] == round(rows[2].predicted_ms, 3)
    verdicts = {k: v for k, v in line.items() if k in run.verdicts}
    assert verdicts == run.verdicts and all(type(v) is bool and v for v in verdicts.values())
    assert survivors() == []
