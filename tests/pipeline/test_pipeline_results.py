"""Lesson 03's and 04's launch results: their verdicts, and the baselines' warm-up."""

import pytest
import torch
from torch import nn

from helpers.runs.pipeline.config import PipelineConfig
from helpers.runs.pipeline.results import PipelineResult

CPU = torch.device("cpu")


def test_the_activation_verdict_is_the_rule_within_its_named_tolerance():
    """1F1B / GPipe per rank, the batch tensor taken out, against min(K - k, M) / M; one
    micro-batch more in flight on any rank fails it."""
    from helpers.runs.pipeline.results import RATIO_TOLERANCE, StageProof

    config = PipelineConfig(8, 32, (("gpipe", 4), ("1f1b", 4)), ("layer3_1",), num_classes=10)
    first, last = 8 * 3 * 32 * 32 * 4, 8 * 10 * 4  # input and target batches, float32
    act = 1000  # bytes one micro-batch keeps on a stage

    def result(held: list[int]) -> PipelineResult:
        proofs = [StageProof(s, 4, 1.0, 1.0, 0, 0, 0, 0, "", "", [first + n * act, last + m * act])
                  for s, (n, m) in (("gpipe", (4, 4)), ("1f1b", held))]
        return PipelineResult(config, "gloo", proofs, [])

    right = result([2, 1])
    assert right.ratios_ok(4) and "FAILED" not in right.ratio_table(4)
    assert [r.expected for r in right.activation_ratios(4)] == [0.5, 0.25]
    assert right.activation_ratios(4)[0].measured > 0.5  # the whole input batch, kept
    for held in ([3, 1], [2, 2], [1, 1]):
        assert not result(held).ratios_ok(4) and "FAILED" in result(held).ratio_table(4)
    assert 0 < RATIO_TOLERANCE < 1 / 4  # tighter than one micro-batch of four


def test_each_baseline_warms_up_before_it_is_timed(one_rank_group, monkeypatch):
    """The one-thread and the K-thread steps each get config.warmup untimed steps."""
    from helpers.runs.pipeline import worker
    from helpers.torchrun.ranks import Rank

    threads_seen: list[int] = []
    monkeypatch.setattr(worker, "training_step_fn", lambda *a: lambda: threads_seen.append(
        torch.get_num_threads()))
    config = PipelineConfig(8, 32, (("gpipe", 4),), ("layer3_1",), steps=3, warmup=2)
    rank = Rank(rank=0, world_size=2, local_rank=0, device=CPU, backend="gloo", reason="test")
    times = worker.time_baselines(nn.Linear(1, 1), rank, None, None, config)
    assert {k: len(v) for k, v in times.items()} == {"single": 3, "single_threads": 3}
    assert threads_seen == [1] * 5 + [2] * 5  # warm-up + timed steps, per thread count


def test_the_proofs_read_as_one_verdict_and_the_broken_run_fails():
    from helpers.runs.pipeline.results import StageProof

    config = PipelineConfig(8, 32, (("gpipe", 4), ("1f1b", 4)), ("layer3_1",), num_classes=10)
    good = [StageProof(s, 4, 1.0, 1.0, 0.0, 7e-9, 1e-7, 0.0, "", "", []) for s in ("gpipe", "1f1b")]
    broken = StageProof("GPipe without 1/M", 4, 1.0, 1.0, 0.0, 0.0, 0.3, 0.003, "fc", "fc", [])
    result = PipelineResult(config, "gloo", good, [], broken=broken)
    assert result.verdict().ok and len(result.verdict().proofs) == 8
    assert result.verdict().line().startswith("✓ gpipe and 1f1b take one process's step")
    line = result.broken_verdict().line()
    assert not result.broken_verdict().ok and line.startswith("✗ GPipe without 1/M equals")
    assert "(2 of 4 checks failed; gradients: 3.0e-01 > 1.0e-05 allowed)" in line
    assert PipelineResult.from_dict(result.to_dict()) == result
    with pytest.raises(ValueError, match="break_it"):
        PipelineResult(config, "gloo", good, []).broken_verdict()


def _schedules_result(orders: dict[str, list[dict]]):
    from helpers.runs.schedules.config import SchedulesConfig
    from helpers.runs.schedules.results import ScheduleRun, SchedulesResult, StepProof

    config = SchedulesConfig(4, 32, width=8, blocks=4, schedules=tuple(orders))
    runs = {name: ScheduleRun(name, 2, 4, StepProof(0.0, 0.0, 0.0), [1.0], actions, 0, 10,
                              [1000, 1000], [], 0, 128, [], None)
            for name, actions in orders.items()}
    return SchedulesResult(config, "gloo", runs)


def test_the_orders_the_ranks_ran_are_checked_against_the_drawn_ones():
    from helpers.pipeline.diagrams import schedule_order, warmup_order

    names = ("gpipe", "1f1b", "interleaved_1f1b")
    result = _schedules_result({n: schedule_order(n, 2, 4) for n in names})
    assert result.order_verdict().ok and result.replay_verdict().ok and result.verdict().ok
    assert len(result.order_verdict().proofs) == 6
    early = _schedules_result({"1f1b": warmup_order(2, 4, [1, 1])})  # not what 1F1B runs
    assert not early.order_verdict().ok and not early.replay_verdict().ok
    assert "1f1b rank 0" in early.order_verdict().line()
