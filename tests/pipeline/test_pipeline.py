import copy

import pytest
import torch
from torch import nn

from helpers.core.checks import compare_steps, training_step
from helpers.model_parallel.resnet import resnet50, resnet_layers
from helpers.model_parallel.stages import StagedModel
from helpers.pipeline.schedule import (
    MicroBatchPipeline,
    accumulated_step,
    gpipe_timeline,
    ideal_speedup,
    validate_microbatches,
)
from helpers.pipeline.stage_cuts import balanced_cut_names, balanced_split_points, layer_flops
from helpers.runs.contract import launch
from helpers.runs.pipeline.config import PipelineConfig
from helpers.runs.pipeline.results import PipelineResult

CPU = torch.device("cpu")


def test_ideal_speedup_follows_the_bubble_model():
    assert ideal_speedup(2, 1) == 1.0
    assert ideal_speedup(2, 4) == pytest.approx(1.6)
    assert ideal_speedup(4, 8) == pytest.approx(32 / 11)
    with pytest.raises(ValueError, match="valid: integers >= 1"):
        ideal_speedup(0, 4)


def test_timeline_shows_the_bubble():
    text = gpipe_timeline(2, 4)
    assert "stage 1:   ..  F0  F1  F2  F3  B0  B1  B2  B3  .." in text
    assert "idle (the bubble): 20%" in text


@pytest.mark.parametrize(
    ("costs", "stages", "expected"),
    [
        ([1, 1, 1, 1], 2, [2]),
        ([4, 1, 1, 1, 1], 2, [1]),
        ([1, 2, 3, 4, 5, 6], 3, [3, 5]),
        ([5], 1, []),
    ],
)
def test_balanced_split_minimises_the_costliest_stage(costs, stages, expected):
    assert balanced_split_points(costs, stages) == expected


def test_balanced_split_rejects_too_many_stages():
    with pytest.raises(ValueError, match="stages=4 for 3 layers; valid: 1..3"):
        balanced_split_points([1, 1, 1], 4)


def test_microbatches_must_divide_the_batch():
    assert validate_microbatches(12, 4) == 3
    with pytest.raises(
        ValueError,
        match=r"microbatches=5 does not divide the batch of 12; valid: one of \[1, 2, 3, 4, 6, 12\]",
    ):
        validate_microbatches(12, 5)
    with pytest.raises(ValueError, match="microbatches=0"):
        validate_microbatches(12, 0)


def _layers():
    torch.manual_seed(0)
    return [
        ("a", nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU())),
        ("b", nn.Sequential(nn.Linear(16, 16), nn.ReLU())),
        ("c", nn.Linear(16, 3)),
    ]


def test_in_process_pipeline_equals_accumulated_reference():
    layers = _layers()
    reference = nn.Sequential(*[copy.deepcopy(m) for _, m in layers])
    micro = MicroBatchPipeline(StagedModel(layers, [1, 2], [CPU] * 3), 4)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    comparison = compare_steps(accumulated_step(reference, x, y, 4), training_step(micro, x, y))
    assert max(comparison.output, comparison.loss, comparison.grads, comparison.weights) <= 1e-6


def test_micro_batching_changes_batchnorm_so_the_reference_must_accumulate():
    layers = _layers()
    full = nn.Sequential(*[copy.deepcopy(m) for _, m in layers])
    reference = nn.Sequential(*[copy.deepcopy(m) for _, m in layers])
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    assert (
        compare_steps(training_step(full, x, y), accumulated_step(reference, x, y, 4)).weights
        > 1e-4
    )


def test_layer_flops_counts_a_linear_layer():
    assert layer_flops([("l", nn.Linear(10, 4))], torch.randn(3, 10)) == [2 * 3 * 10 * 4]


def test_balanced_resnet_cut_is_the_best_block_boundary():
    """No other cut between blocks makes the costlier of the two stages cheaper."""
    (cut,) = balanced_cut_names(2, 64)
    layers = resnet_layers(resnet50(), blocks=True)
    flops = layer_flops(layers, torch.randn(1, 3, 64, 64))
    names = [n for n, _ in layers]

    def worst(i):
        return max(sum(flops[:i]), sum(flops[i:]))

    assert cut.startswith("layer") and worst(names.index(cut)) == min(
        map(worst, range(1, len(names)))
    )


@pytest.mark.twin
@pytest.mark.torchrun
def test_two_process_pipeline_equals_one_process():
    """torch.distributed.pipelining with gloo: same loss, gradients and weights; 1F1B keeps
    at most K micro-batches' activations on the first stage, GPipe all M."""
    config = PipelineConfig(8, 32, (("gpipe", 4), ("1f1b", 4)), ("layer3_1",), steps=2,
                            warmup=0, num_classes=10, timed=(("gpipe", 4),), baselines=True,
                            time_image_size=48)
    piped = launch(config, timeout=300)  # one process per stage: config.ranks()
    assert isinstance(piped, PipelineResult) and piped.config == config
    assert [(p.schedule, p.microbatches) for p in piped.proofs] == [("gpipe", 4), ("1f1b", 4)]
    assert piped.proofs_ok, piped.proof_table()  # every timed schedule is proven first
    # the first stage also keeps the whole input batch, the last the whole target (the
    # micro-batches are views of them): without those, stage k holds K - k of M micro-batches
    first, last = piped.activation_ratios(4)
    assert (first.batch_bytes, last.batch_bytes) == (8 * 3 * 32 * 32 * 4, 8 * 10 * 4)
    assert (first.expected, last.expected) == (2 / 4, 1 / 4)
    assert piped.ratios_ok(4), piped.ratio_table(4)
    # only the runs asked for are timed, each as many times as asked, and the baselines too
    assert set(piped.timings()) == {("gpipe", 4)} and len(piped.timings()["gpipe", 4].times) == 2
    assert len(piped.single.times) == 2 and len(piped.single_threads.times) == 2
    assert min(piped.single.times + piped.single_threads.times) > 0
    assert piped.backend == "gloo"


def test_more_processes_than_stages_is_a_clear_error():
    """Checked on every rank before any step (lesson 03 launches it for real: 3 for 2)."""
    config = PipelineConfig(8, 32, (("gpipe", 4),), ("layer3_1",))
    assert config.ranks() == 2 and config.validate(2) is config
    with pytest.raises(ValueError, match="--split gives 2 stages but 3 processes were started "
                       r"or asked for; valid: one process per stage"):  # fmt: skip
        config.validate(3)


def test_a_launch_with_the_wrong_process_count_is_refused_before_it_starts(monkeypatch):
    """launch checks nproc against the cut before torchrun runs at all."""
    import helpers.torchrun.launcher as launcher

    monkeypatch.setattr(launcher, "run_module", lambda *a, **k: pytest.fail("launched"))
    config = PipelineConfig(8, 32, (("gpipe", 4),), ("layer3_1",))
    with pytest.raises(ValueError, match="2 stages but 3 processes"):
        launch(config, nproc=3)


def test_the_pipeline_config_round_trips_and_refuses_bad_runs(capsys):
    config = PipelineConfig(16, 64, (("gpipe", 4), ("1f1b", 2)), ("layer2_0", "layer3_1"),
                            steps=2, warmup=1, num_classes=10, threads=2, seed=3, lr=0.5)
    assert PipelineConfig.from_args(config.args()) == config and config.stages == 3
    assert "gpipe:4,1f1b:2" in config.args()
    assert config.timed_runs == config.runs and config.timing_size == 64
    timed = PipelineConfig(16, 64, (("gpipe", 4), ("1f1b", 4)), ("layer3_1",),
                           timed=(("gpipe", 4),), baselines=True, time_image_size=96)
    assert PipelineConfig.from_args(timed.args()) == timed and timed.timing_size == 96
    assert PipelineConfig.from_dict(timed.to_dict()) == timed
    with pytest.raises(ValueError, match=r"timed run\(s\) \[\('gpipe', 2\)\] are not among"):
        PipelineConfig(16, 64, (("gpipe", 4),), ("layer3_1",), timed=(("gpipe", 2),)).validate(2)
    with pytest.raises(ValueError, match=r"unknown schedule\(s\) \['zb'\]; valid"):
        PipelineConfig(16, 64, (("zb", 4),), ("layer3_1",)).validate(2)
    with pytest.raises(ValueError, match="microbatches=3 does not divide the batch of 16"):
        PipelineConfig(16, 64, (("gpipe", 3),), ("layer3_1",)).validate(2)
    with pytest.raises(SystemExit):
        PipelineConfig.from_args(["--batch", "16", "--image-size", "64", "--runs", "gpipe",
                                  "--split", "layer3_1"])
    assert "'gpipe'; valid: items of the form str:int" in capsys.readouterr().err


def test_the_lesson_config_follows_the_profile():
    from helpers.profiles import PROFILES

    profile = PROFILES["small"]
    p, m = profile.pipeline, profile.pipeline.microbatches
    config = PipelineConfig.for_profile(profile, split=("layer3_1",))
    assert (config.batch, config.image_size, config.timing_size) == (
        p.batch, p.proof_image_size, p.image_size)
    assert config.runs == (("gpipe", m), ("1f1b", m)) and config.timed == (("gpipe", m),)
    assert config.baselines and config.steps == profile.repeats and config.ranks() == 2


def test_a_pipeline_result_round_trips_through_json():
    import json

    from helpers.runs.pipeline.results import StageProof, TimedRun

    config = PipelineConfig(8, 32, (("gpipe", 4),), ("layer3_1",))
    proof = StageProof("gpipe", 4, 1.0, 1.0, 0.0, 0.0, 2e-5, 0.0, "a", "b", [10, 20])
    result = PipelineResult(config, "gloo", [proof], [TimedRun("gpipe", 4, [1.0, 2.0])],
                            {"single": [3.0]})
    back = PipelineResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back == result and not back.proofs_ok  # 2e-5 is beyond the tolerance
    assert back.timings()[("gpipe", 4)].mean == 1.5 and back.single.mean == 3.0
    assert back.single_threads is None and "FAILED" in back.proof_table()


def test_speedup_is_taken_against_the_same_processes_at_one_microbatch():
    from helpers.core.timing import Timing
    from helpers.runs.pipeline.speedup import speedups

    timed = {("gpipe", 1): Timing("m1", [2.0, 2.0]), ("gpipe", 4): Timing("m4", [1.6, 1.6]),
             ("gpipe", 2): Timing("m2", [1.0, 1.0]), ("1f1b", 4): Timing("x", [1.0])}
    gains = {g.microbatches: g for g in speedups(timed, stages=2)}
    assert set(gains) == {2, 4}  # M=1 is the baseline; other schedules are not mixed in
    assert gains[4].value == pytest.approx(1.25) and gains[4].ideal == pytest.approx(1.6)
    assert not gains[4].above_ideal and "above the ideal" not in gains[4].describe()
    assert gains[2].value == pytest.approx(2.0) and gains[2].above_ideal  # ideal 1.33
    assert "above the ideal" in gains[2].describe()
    with pytest.raises(ValueError, match="no gpipe run at M=1"):
        speedups({("gpipe", 4): Timing("m4", [1.0])}, stages=2)


def test_speedup_over_one_process_names_its_baseline():
    from helpers.core.timing import Timing
    from helpers.runs.pipeline.speedup import speedup_over_one_process

    gain = speedup_over_one_process(Timing("p", [2.0, 2.0]), Timing("s", [3.0, 3.0]), 2, 4)
    assert gain.value == pytest.approx(1.5) and gain.ideal == pytest.approx(1.6)
    assert "over one process (ideal 1.60x" in gain.describe() and not gain.above_ideal


class _Times(nn.Module):
    """x * s with s = 1: a parameter in front of the stage that leaves its input exact."""

    def __init__(self) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s


def test_a_local_proof_compares_its_stage_with_the_matching_slice_of_the_reference(one_rank_group):
    """prove_step_locally: the stage's parameters start at first_param in the whole model's;
    the right offset proves it equal, the wrong one is refused, a changed weight is caught."""
    from helpers.models.mlp_stack import build_stack
    from helpers.pipeline.runtime import build_pipeline, prove_step_locally
    from helpers.pipeline.schedule import PROOF_TOLERANCE

    torch.manual_seed(0)
    stage = build_stack(8, 2)
    whole = nn.Sequential(_Times(), copy.deepcopy(stage))  # one parameter before the stage
    x, y = torch.randn(8, 8), torch.randn(8, 8)

    def prove(reference: nn.Module, first_param: int):
        start = copy.deepcopy(stage.state_dict())
        pipe = build_pipeline({0: stage}, 1, "gpipe", 4, torch.device("cpu"), lr=0.1)
        try:
            return prove_step_locally(pipe, copy.deepcopy(reference), x, y, 4, 0.1, first_param)
        finally:
            stage.load_state_dict(start)

    proof, ref = prove(whole, first_param=1)
    c = proof.comparison
    assert max(c.output, c.loss, c.grads, c.weights) <= PROOF_TOLERANCE
    assert len(ref.grads) == 1 + len(list(stage.parameters()))  # the whole model's step
    with pytest.raises(ValueError, match="parameter"):  # off by one: shapes differ
        prove(whole, first_param=0)
    changed = copy.deepcopy(whole)
    with torch.no_grad():
        changed[1][0].fc1.weight[0, 0] += 1.0
    worse = prove(changed, first_param=1)[0].comparison
    assert worse.output > PROOF_TOLERANCE and worse.weights > PROOF_TOLERANCE
    assert worse.worst_weight.endswith("fc1.weight")
