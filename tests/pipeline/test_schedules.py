"""The pipeline-schedules lesson's pieces: event collection, idle arithmetic, replay, bad input."""

import json

import pytest
import torch
import torch.distributed.pipelining.schedules as schedules_module
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from helpers.models.mlp_stack import build_stack, chunk_of
from helpers.pipeline.events import (
    Action,
    bubble_theory,
    idle_fractions,
    record_actions,
    validate_instrumentable,
)
from helpers.pipeline.runtime import rank_chunks
from helpers.runs.contract import launch
from helpers.runs.schedules.config import SchedulesConfig, validate_plan
from helpers.runs.schedules.report import ideal_timeline
from helpers.runs.schedules.results import SchedulesResult


def test_the_pipelining_internals_we_wrap_still_exist():
    """Fails loudly when a torch upgrade renames what helpers.pipeline.events wraps."""
    validate_instrumentable()
    assert all(callable(getattr(PipelineStage, m)) for m in
               ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"))


@pytest.mark.parametrize("name", ["_wait_batch_p2p", "_batch_p2p"])
def test_a_missing_internal_is_reported(monkeypatch, name):
    monkeypatch.delattr(schedules_module, name)
    with pytest.raises(RuntimeError, match=name):
        validate_instrumentable()


def test_counting_transfers_without_the_internal_fails_loudly(monkeypatch):
    from helpers.runs.schedules.transfers import count_transfers

    monkeypatch.delattr(schedules_module, "_batch_p2p")
    with pytest.raises(RuntimeError, match="_batch_p2p"), count_transfers():
        pass


def test_events_of_a_one_rank_gpipe_step(one_rank_group):
    model = build_stack(16, 2)
    stage = PipelineStage(model, 0, 1, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, 4, loss_fn=nn.MSELoss())
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    schedule.step(x, target=y)  # the first step also infers shapes
    ticks = iter(range(0, 10**6, 10))
    with record_actions(0, [stage], clock=lambda: next(ticks)) as actions:
        schedule.step(x, target=y)
    compute = [(a.kind, a.microbatch) for a in actions if a.kind != "wait"]
    assert compute == [("F", m) for m in range(4)] + [("B", m) for m in range(4)]
    assert all(a.end_ns > a.start_ns and a.stage == 0 and a.rank == 0 for a in actions)
    assert stage.forward_one_chunk.__func__ is PipelineStage.forward_one_chunk  # unwrapped


def synthetic(rank, kind, start, end, stage=0, mb=0):
    return Action(rank, kind, stage, mb, start, end).as_dict()


def test_idle_fraction_arithmetic_on_a_synthetic_timeline():
    actions = [synthetic(0, "F", 0, 30), synthetic(0, "wait", 30, 60), synthetic(0, "B", 60, 100),
               synthetic(1, "F", 40, 50), synthetic(1, "W", 50, 70)]
    assert idle_fractions(actions, 2, 0, 100) == pytest.approx([0.3, 0.7])
    with pytest.raises(ValueError, match="end after start"):
        idle_fractions(actions, 2, 100, 100)


def gpipe_order(stages, m):
    """A GPipe step's actions in the order each rank runs them (1 ns apart, any times)."""
    out, t = [], 0
    for s in range(stages):
        for kind in ("F", "B"):
            for mb in range(m):
                out.append(synthetic(s, kind, t, t + 1, stage=s, mb=mb))
                t += 2
    return out


@pytest.mark.parametrize("stages, m", [(2, 4), (4, 8), (3, 1)])
def test_the_ideal_replay_of_gpipe_has_the_textbook_bubble(stages, m):
    ideal = ideal_timeline(gpipe_order(stages, m), stages, 1)
    span = max(a["end"] for a in ideal)
    idle = 1 - sum(a["end"] - a["start"] for a in ideal) / (span * stages)
    assert idle == pytest.approx(bubble_theory("gpipe", stages, m))
    assert span == pytest.approx(3 * (m + stages - 1))  # forward 1 tick, backward 2


def test_bubble_formulas():
    assert bubble_theory("1f1b", 2, 4) == pytest.approx(1 / 5)
    assert bubble_theory("interleaved_1f1b", 2, 4, 2) == pytest.approx(1 / 9)
    assert bubble_theory("zero_bubble", 2, 4, 2) == pytest.approx(1 / 25)
    with pytest.raises(ValueError, match="dualpipe"):
        bubble_theory("dualpipe", 2, 4)


def test_chunks_are_placed_round_robin_and_cover_the_model():
    model = build_stack(8, 8)
    assert rank_chunks("interleaved_1f1b", 1, 2) == [1, 3]
    assert rank_chunks("gpipe", 1, 2) == [1]
    pieces = [chunk_of(model, 4, i) for i in range(4)]
    assert [len(p) for p in pieces] == [2] * 4 and pieces[3][1] is model[7]


@pytest.mark.parametrize(
    "args, words",
    [
        (("looped_bfs", 2, 4, 8, 64), "unknown schedule 'looped_bfs'"),
        (("interleaved_1f1b", 2, 3, 8, 48), "multiple of the ranks"),
        (("zero_bubble", 4, 4, 6, 64), "8 chunks"),
        (("gpipe", 2, 5, 8, 64), "divisor of 64"),
    ],
)
def test_bad_choices_are_refused_before_any_launch(args, words, monkeypatch):
    with pytest.raises(ValueError, match=words):
        validate_plan(*args)
    monkeypatch.setattr("helpers.torchrun.launcher.run_module",
                        lambda *a, **k: pytest.fail("launched despite a bad choice"))
    name, ranks, m, blocks, batch = args
    config = SchedulesConfig(m, batch, width=8, blocks=blocks, steps=1, processes=ranks,
                             schedules=(name,))
    with pytest.raises(ValueError, match=words):
        launch(config)


def test_a_launch_on_another_number_of_ranks_is_refused(monkeypatch):
    monkeypatch.setattr("helpers.torchrun.launcher.run_module",
                        lambda *a, **k: pytest.fail("launched despite a bad choice"))
    config = SchedulesConfig(microbatches=4, batch=32, width=8, blocks=4)
    assert config.ranks() == 2 and config.validate(2) is config
    with pytest.raises(ValueError, match=r"processes=2 but 4 ranks were started or asked for; "
                       "valid: 2"):  # fmt: skip
        launch(config, nproc=4)


@pytest.mark.twin
@pytest.mark.torchrun
@pytest.mark.slow
def test_every_schedule_is_proven_and_timed_on_two_ranks():
    config = SchedulesConfig(microbatches=4, batch=32, width=32, blocks=4, warmup=1, steps=2)
    result = launch(config, timeout=300)
    assert isinstance(result, SchedulesResult) and result.config == config
    assert list(result.runs) == ["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"]
    assert result.proofs_ok and result.replays_match_formulas, result.proof_table()
    split = result.cost_split_report()
    for name, run in result.runs.items():
        kinds = {a["kind"] for a in run.actions}
        assert kinds >= ({"F", "I", "W"} if name == "zero_bubble" else {"F", "B"}), name
        assert run.ideal_idle_fraction == pytest.approx(run.bubble_theory), name
        assert len(run.times_s) == config.steps, name
        # the timed steps carry no memory meter; the metered step, untimed, does
        assert all(a["live_bytes"] == 0 for a in run.actions), name
        assert max(a["live_bytes"] for a in run.memory_actions) > 0, name
        assert {a["kind"] for a in run.memory_actions} <= {"F", "B", "I", "W"}, name
    table = result.table()
    assert "±" in table and "after 1 untimed warm-up step(s)" in table, table
    assert all(len(line) <= 100 for report in (table, result.transfers_table(), split)
               for line in report.splitlines())
    batch_bytes = 32 * 32 * 4  # the input batch, held whole on the first rank
    gpipe, one_f = (peak[0] - batch_bytes for peak in result.peaks("gpipe", "1f1b"))
    assert one_f / gpipe == pytest.approx(2 / 4, rel=0.02)
    assert "zero_bubble, rank 0: I/F = " in split and "zero_bubble, rank 1: I/F = " in split
    assert "with I = W = F (formula and replay)" in split
    assert result.transfers_ok, result.transfers_table()
    one_f, interleaved = (result.runs[n] for n in ("1f1b", "interleaved_1f1b"))
    for r in range(2):  # vK - 1 = 3 cuts between ranks instead of K - 1 = 1
        assert interleaved.transfers[r].sent_bytes == 3 * one_f.transfers[r].sent_bytes
        assert one_f.transfers[r].sent_bytes == 32 * 32 * 4  # the batch, one way each
    numbers = result.numbers()
    assert numbers["backend"] == "gloo" and numbers["sizes"]["microbatches"] == 4
    assert numbers["gpipe"]["proof_ok"] and "seconds_by_kind" in numbers["zero_bubble"]
    assert SchedulesResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_the_planned_sends_follow_the_chunks_placement():
    from helpers.runs.schedules.transfers import planned_sends

    # one chunk per rank: rank 0 sends the activations, rank 1 the gradients, M each
    assert [planned_sends(r, 2, 1, 4) for r in range(2)] == [4, 4]
    # two chunks per rank: 3 cuts between ranks, each way: 3M messages per rank
    assert [planned_sends(r, 2, 2, 4) for r in range(2)] == [12, 12]
    # four ranks, one chunk each: the ends take part in one cut, the middle ranks in two
    assert [planned_sends(r, 4, 1, 8) for r in range(4)] == [8, 16, 16, 8]
    assert planned_sends(0, 1, 1, 4) == 0  # one rank: nothing crosses


def test_the_transfers_verdict_allows_exactly_gloos_headers():
    from helpers.runs.schedules.transfers import RankTransfers

    tensors = 4 * 1000
    exact = RankTransfers(4, 4, tensors, tensors + 96 * 4 + 48 * 4)
    assert exact.headers == 576 and exact.ok(4, 1000)
    assert RankTransfers(4, 4, tensors, None).ok(4, 1000)  # wire not read: the counts alone
    assert not RankTransfers(4, 4, tensors, tensors + 577).ok(4, 1000)  # more than headers
    assert not RankTransfers(4, 4, tensors, tensors - 1).ok(4, 1000)  # less than the tensors
    assert not RankTransfers(3, 4, 3000, 3000).ok(4, 1000)  # a send missing
    assert not RankTransfers(4, 4, 4004, 4004 + 576).ok(4, 1000)  # wrong sizes


def test_the_config_round_trips_through_the_workers_command_line():
    config = SchedulesConfig(8, 64, width=16, blocks=4, warmup=1, steps=2, processes=2,
                             schedules=("gpipe", "zero_bubble"), lr=0.5)
    assert SchedulesConfig.from_args(config.args()) == config
    assert SchedulesConfig.from_dict(config.to_dict()) == config


def test_the_lesson_config_follows_the_profile():
    from helpers.profiles import PROFILES

    profile = PROFILES["small"]
    s = profile.schedules
    config = SchedulesConfig.for_profile(profile, processes=2)
    assert (config.microbatches, config.batch, config.width, config.blocks) == (
        s.microbatches, s.batch, s.width, s.blocks)
    assert config.steps == profile.repeats and config.warmup == profile.warmup
    assert config.ranks() == 2


@pytest.mark.parametrize("changes", [{"warmup": -1}, {"steps": 0}])
def test_a_negative_warm_up_or_no_timed_step_is_refused(changes):
    config = SchedulesConfig(microbatches=4, batch=32, width=8, blocks=4, **changes)
    with pytest.raises(ValueError, match="valid: warmup >= 0 and steps >= 1"):
        config.validate(2)


# started without torchrun: tests/torchrun/test_launch.py::test_every_worker_started_without_torchrun_...


def test_resnet_split_tolerance_is_tight_on_the_cpu_only():
    import torch

    from helpers.model_parallel.resnet import split_tolerance

    assert split_tolerance(torch.device("cpu")) == 1e-6
    assert split_tolerance(torch.device("cuda", 0)) == 1e-3
