"""The tensor-parallel plan's collectives, predicted: per block, the totals add the
embedding's, the head's, the loss's and (with sequence parallelism) the norms'; the traced
launch's CommDebugMode counts equal them, and its traces merge (a twin of lesson 12's)."""

from __future__ import annotations

import pytest

from helpers.debugging import plan_counts
from helpers.debugging.overlap import breakdown
from helpers.debugging.trace import merge_traces, merged_problems, rank_activity, read_merged
from helpers.profiles import get_profile
from helpers.runs.contract import launch
from helpers.runs.debugging.config import TraceConfig


@pytest.mark.parametrize("sp", [False, True])
def test_the_totals_are_the_blocks_plus_embedding_head_loss_and_norms(sp):
    blocks = 3
    per_block = plan_counts.predicted_per_block(blocks, sp)
    assert len(per_block) == 2 * blocks
    summed: dict[str, int] = {}
    for counts in per_block.values():
        for op, n in counts.items():
            summed[op] = summed.get(op, 0) + n
    totals = plan_counts.predicted_totals(blocks, sp)
    if sp:  # embedding and head: one of each; loss 3 and two reads of 2L + 1 norm gradients
        assert totals == {op: summed[op] + 2 for op in summed} | {
            "all_reduce": 3 + 2 * (2 * blocks + 1)}
    else:  # embedding forward, head backward, loss 3
        assert totals == {"all_reduce": summed["all_reduce"] + 1 + 1 + 3}


def test_a_bad_trace_launch_is_refused_by_name(tmp_path):
    good = TraceConfig(trace_dir=str(tmp_path))
    with pytest.raises(ValueError, match="--pipe-blocks 3 does not split over 2 ranks"):
        TraceConfig(trace_dir=str(tmp_path), pipe_blocks=3).validate(2)
    with pytest.raises(ValueError, match="--bucket-cap-mb 0"):
        TraceConfig(trace_dir=str(tmp_path), bucket_cap_mb=0).validate(2)
    with pytest.raises(ValueError, match="--trace-dir is empty"):
        TraceConfig(trace_dir="").validate(2)
    assert good.validate(2) is good and good.ranks() == 2


@pytest.mark.twin
@pytest.mark.torchrun
def test_the_traced_launch_counts_as_predicted_and_its_traces_merge(tmp_path):
    config = TraceConfig.for_profile(get_profile("smoke"), trace_dir=str(tmp_path))
    result = launch(config, timeout=300)
    for plan in result.plans:
        sp = plan.sequence_parallel
        assert plan.total == plan_counts.predicted_totals(config.model.blocks, sp)
        per_block = plan_counts.predicted_per_block(config.model.blocks, sp)
        assert {m: plan.per_module.get(m) for m in per_block} == per_block
    merged = merge_traces([t.path for t in result.ddp_overlap], tmp_path / "m.json")
    assert merged_problems(merged.path) == []
    for trace, run in zip(read_merged(merged.path), result.ddp_overlap, strict=True):
        act = rank_activity(trace)
        assert len(act.communicating) == len(run.buckets) > 1
        assert 0 <= breakdown(act.computing, act.communicating,
                              trace.span("ddp step")).overlap_share <= 1
