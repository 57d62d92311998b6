"""helpers.memory: the measured ledger is exact where it can be, the estimate matches it."""

import pytest
import torch
from torch import nn

from helpers.memory import (
    LLAMA_7B_SHAPE,
    LLAMA_70B_SHAPE,
    OPTIMIZERS,
    HasTransformerShape,
    LayerChain,
    SavedTensorMeter,
    TransformerShape,
    estimate_layers,
    estimate_training_memory,
    estimate_transformer,
    layers_of,
    measure_training_memory,
    parameter_memory,
)
from helpers.memory.fits import ClusterLayout, fits_table, split_blocks
from helpers.memory.ledger import KINDS, compare_ledgers
from helpers.model_parallel.resnet import one_hot_labels, resnet50, resnet_layers, split_points_at
from helpers.model_parallel.stages import StagedModel
from helpers.models.llama import LMConfig, build_lm
from helpers.models.toy import ToyModel
from helpers.tensor_parallel.ffn import FeedForward, cut_shard

ACTIVATION_TOLERANCE = 0.10  # the estimate's stated tolerance for activations (relative)


def toy(batch=8):
    torch.manual_seed(0)
    model = ToyModel("cpu", "cpu", 300, 10, 5)
    return model, torch.rand(batch, 300), torch.randn(batch, 5)


def toy_parts(model):
    return {"net1": model.net1, "net2": model.net2}


def param_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_weights_grads_and_optimizer_state_are_exact(optimizer):
    model, x, y = toy()
    row = measure_training_memory(model, x, y, optimizer=optimizer)["cpu"]
    n = param_bytes(model)
    expected_state = {"sgd": 0, "sgd_momentum": n, "adam": 2 * n + 4 * 4}[optimizer]
    assert (row.weights, row.grads, row.optimizer_state) == (n, n, expected_state)
    # input 8x300, ReLU output 8x10, MSE keeps output and target 8x5 each (float32)
    assert row.activations == 4 * (8 * 300 + 8 * 10 + 2 * 8 * 5)
    assert row.peak_allocated is None


@pytest.mark.parametrize("build", ["toy", "resnet"])
def test_activations_grow_linearly_with_the_batch(build):
    def measured(batch):
        if build == "toy":
            model, x, y = toy(batch)
        else:
            model = resnet50(10)
            x, y = torch.randn(batch, 3, 32, 32), one_hot_labels(torch.arange(batch) % 10, 10)
        return measure_training_memory(model, x, y)["cpu"].activations

    small, large = measured(2), measured(4)
    assert large / small == pytest.approx(2.0, rel=0.05)


def test_a_split_model_adds_up_to_the_unsplit_one():
    model, x, y = toy()
    whole = measure_training_memory(model, x, y, optimizer="adam")["cpu"]
    split = measure_training_memory(model, x, y, optimizer="adam", parts=toy_parts(model))
    total = split.sum()
    for kind in ("weights", "grads", "optimizer_state"):
        assert getattr(total, kind) == getattr(whole, kind), kind
    # the cut activation (8x10) is kept by both parts, as two real devices would
    assert total.activations == whole.activations + 4 * 8 * 10


def test_measuring_changes_nothing_in_the_model():
    model = resnet50(10).eval()
    model.fc.weight.grad = torch.ones_like(model.fc.weight)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(2, 3, 32, 32), one_hot_labels(torch.tensor([1, 2]), 10)
    measure_training_memory(model, x, y, optimizer="adam", lr=0.5)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not model.training and torch.equal(
        model.fc.weight.grad, torch.ones_like(model.fc.weight)
    )
    assert model.conv1.weight.grad is None


def assert_estimate_matches(measured, estimated, activation_tolerance=ACTIVATION_TOLERANCE):
    for row in compare_ledgers(measured, estimated):
        if row["kind"] == "activations":
            assert row["ratio"] == pytest.approx(1.0, rel=activation_tolerance), row
        else:
            assert row["estimated"] == row["measured"], row


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_estimate_equals_measurement_for_the_toy_model(optimizer):
    model, x, y = toy()
    measured = measure_training_memory(model, x, y, optimizer=optimizer, parts=toy_parts(model))
    estimated = estimate_training_memory(
        model, batch=8, sample_shape=(300,), optimizer=optimizer, names=["net1", "net2"]
    )
    assert_estimate_matches(measured, estimated)
    # the same layers as one list, unsplit: one part, the one-device measurement
    layers = [model.net1, model.relu, model.net2]
    by_rule = estimate_training_memory(layers, batch=8, sample_shape=(300,), optimizer=optimizer)
    assert (
        by_rule["part 0"].total
        == measure_training_memory(model, x, y, optimizer=optimizer)["cpu"].total
    )


@pytest.mark.slow
def test_estimate_equals_measurement_for_resnet50_in_two_stages():
    layers = resnet_layers(resnet50(10))
    model = StagedModel(layers, split_points_at(layers, ["layer3"]), ["cpu", "cpu"])
    parts = {f"stage {k}": s for k, s in enumerate(model.stages)}
    x, y = torch.randn(2, 3, 64, 64), one_hot_labels(torch.tensor([3, 4]), 10)
    measured = measure_training_memory(model, x, y, optimizer="sgd_momentum", parts=parts)
    estimated = estimate_training_memory(
        model, batch=2, sample_shape=(3, 64, 64), optimizer="sgd_momentum", names=list(parts)
    )
    assert_estimate_matches(measured, estimated, activation_tolerance=0.0)


@pytest.mark.parametrize("activation", ["none", "gelu"])
@pytest.mark.parametrize("world_size", [1, 4])
def test_estimate_equals_measurement_for_the_ffn_and_a_shard(activation, world_size):
    torch.manual_seed(1)
    full = FeedForward(32, 128, activation)
    model = cut_shard(full, world_size, 0, activation) if world_size > 1 else full
    x, y = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    measured = measure_training_memory(model, x, y)
    estimated = estimate_training_memory(model, batch=2, sample_shape=(5, 32), names=["cpu"])
    assert_estimate_matches(measured, estimated, activation_tolerance=0.0)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_estimate_equals_measurement_for_the_small_llama(optimizer):
    config = LMConfig(vocab=50, hidden=32, blocks=2, ffn=96, heads=2)
    model = build_lm(config)
    ids, labels = torch.randint(0, 50, (3, 8)), torch.randint(0, 50, (3, 8))
    measured = measure_training_memory(model, ids, labels, optimizer=optimizer)
    estimated = estimate_training_memory(model, batch=3, seq=8, optimizer=optimizer, names=["cpu"])
    assert_estimate_matches(measured, estimated)


class TwoLayers(nn.Module):
    """A model from no lesson: the estimator reads it only through ``layer_chain()``."""

    def __init__(self):
        super().__init__()
        self.first, self.act, self.second = nn.Linear(300, 16), nn.ReLU(), nn.Linear(16, 5)

    def forward(self, x):
        return self.second(self.act(self.first(x)))

    def layer_chain(self):
        return [self.first, self.act, self.second], [2]


def test_a_model_that_gives_its_layer_chain_is_estimated():
    torch.manual_seed(0)
    model, x, y = TwoLayers(), torch.rand(8, 300), torch.randn(8, 5)
    assert isinstance(model, LayerChain) and not isinstance(nn.Linear(2, 2), LayerChain)
    parts = {"first": model.first, "second": model.second}
    measured = measure_training_memory(model, x, y, optimizer="adam", parts=parts)
    estimated = estimate_training_memory(
        model, batch=8, sample_shape=(300,), optimizer="adam", names=list(parts)
    )
    assert_estimate_matches(measured, estimated, activation_tolerance=0.0)
    by_hand = estimate_layers(
        [model.first, model.act, model.second],
        (300,),
        batch=8,
        split_points=[2],
        optimizer="adam",
        names=list(parts),
    )
    assert estimated.as_dict() == by_hand.as_dict()


def test_the_course_models_give_their_chains():
    toy_model = toy()[0]
    assert layers_of(toy_model) == ([toy_model.net1, toy_model.relu, toy_model.net2], [2])
    layers = resnet_layers(resnet50(10))
    staged = StagedModel(layers, [3, 8], ["cpu"] * 3)
    chain, points = layers_of(staged)
    assert points == [3, 8] and [id(m) for m in chain] == [id(m) for _, m in layers]
    ffn = FeedForward(8, 16, "gelu")
    assert layers_of(ffn) == ([ffn.fc1, ffn.act, ffn.fc2], [])
    shard = cut_shard(ffn, 2, 1, "gelu")
    assert layers_of(shard) == ([shard.fc1, shard.act, shard.fc2], [])
    assert layers_of(layers) == ([m for _, m in layers], [])  # a list of (name, module) pairs
    lm = build_lm(LMConfig(vocab=50, hidden=32, blocks=2, ffn=96, heads=2))
    assert isinstance(lm, HasTransformerShape) and not isinstance(lm, LayerChain)
    assert lm.transformer_shape() == TransformerShape(
        hidden=32, blocks=2, heads=2, ffn=96, vocab=50
    )


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda: resnet50(10), "ResNet"),  # not ours: pass resnet_layers(model)
        (lambda: nn.Linear(3, 3), "Linear"),
        (lambda: "toy", "str"),
        (lambda: [], "list"),
    ],
)
def test_a_model_that_does_not_say_what_it_is_is_refused(build, name):
    with pytest.raises(ValueError, match=rf"cannot estimate a {name}: .*layer_chain\(\).*list"):
        estimate_training_memory(build(), batch=2, sample_shape=(3, 32, 32))


def test_the_meter_releases_bytes_after_backward_and_sees_two_micro_batches():
    model, x, _ = toy()
    with SavedTensorMeter(model) as meter:
        outs = [model(x[:4]).sum(), model(x[4:]).sum()]  # two forwards before any backward
        two = meter.live["cpu"]
        for out in outs:
            out.backward()
    one = 4 * (4 * 300 + 4 * 10)
    assert two == meter.peak["cpu"] == 2 * one
    assert meter.live["cpu"] == 0


def test_mixed_precision_adam_is_sixteen_bytes_per_parameter():
    row = parameter_memory(1000, 1, optimizer="adam", precision="mixed")
    assert row.weights + row.grads + row.optimizer_state == 16 * 1000 + 4


def test_llama_7b_has_its_published_parameter_count():
    assert LLAMA_7B_SHAPE.parameters() == 6_738_415_616


def test_pipeline_schedules_hold_m_or_k_micro_batches():
    assert ClusterLayout("g", pp=4, schedule="gpipe").in_flight(8) == [8, 8, 8, 8]
    assert ClusterLayout("1", pp=4).in_flight(8) == [4, 3, 2, 1]
    assert ClusterLayout("1", pp=4).in_flight(2) == [2, 2, 2, 1]
    assert split_blocks(10, 4) == [3, 3, 2, 2]
    rows = fits_table({"7B": LLAMA_7B_SHAPE}, gpu_bytes=80 * 2**30, seq=4096)
    by = {r.layout: r for r in rows}
    assert not by["data parallel"].fits and by["PP 8, 1F1B"].fits
    gpipe, one_f = by["PP 8, GPipe"].memory, by["PP 8, 1F1B"].memory
    assert gpipe.activations > 3 * one_f.activations  # 32 micro-batches held vs at most 8


def test_tensor_parallel_splits_weights_and_the_mlp_activations():
    one = estimate_transformer(LLAMA_7B_SHAPE, batch=1, seq=256, tp=1)["stage 0"]
    eight = estimate_transformer(LLAMA_7B_SHAPE, batch=1, seq=256, tp=8)["stage 0"]
    assert eight.weights == one.weights // 8
    assert one.activations / 8 < eight.activations < one.activations / 2  # replicated parts


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda m, x, y: measure_training_memory(m, x, y, optimizer="lamb"), "lamb"),
        (lambda m, x, y: measure_training_memory(nn.ReLU(), x, y), "no parameters"),
        (lambda m, x, y: measure_training_memory(m, x.to("meta"), y), "meta"),
        (
            lambda m, x, y: estimate_training_memory([nn.LSTM(3, 3)], batch=1, sample_shape=(3,)),
            "LSTM",
        ),
        (lambda m, x, y: estimate_training_memory(m, batch=0, sample_shape=(300,)), "batch=0"),
        (
            lambda m, x, y: estimate_training_memory(m, batch=2, sample_shape=(300,), loss="hinge"),
            "hinge",
        ),
        (
            lambda m, x, y: estimate_training_memory(
                m, batch=2, sample_shape=(300,), precision="mixed"
            ),
            "transformer",
        ),
        (lambda m, x, y: TransformerShape(hidden=10, blocks=1, heads=3, ffn=4, vocab=5), "heads"),
        (lambda m, x, y: estimate_training_memory(LLAMA_7B_SHAPE, batch=1), "seq="),
        (lambda m, x, y: split_blocks(4, 8), "at most 4"),
        (lambda m, x, y: ClusterLayout("x", schedule="zb"), "zb"),
        (lambda m, x, y: estimate_transformer(LLAMA_7B_SHAPE, batch=1, seq=8, zero=4),
         r"zero=4; valid choices: 0, 1, 2, 3"),
        (lambda m, x, y: estimate_transformer(LLAMA_7B_SHAPE, batch=1, seq=8, zero="1"),
         r"zero='1'; valid choices: 0, 1, 2, 3"),
        (lambda m, x, y: estimate_transformer(LLAMA_7B_SHAPE, batch=1, seq=8, dp=0),
         r"dp=0; valid: an integer >= 1"),
        (lambda m, x, y: estimate_training_memory(LLAMA_7B_SHAPE, batch=1, seq=8, dp=2.0),
         r"dp=2.0; valid: an integer >= 1"),
        (lambda m, x, y: estimate_transformer(LLAMA_7B_SHAPE, batch=1, seq=8, recompute="yes"),
         r"recompute='yes'; valid choices: True, False"),
        (lambda m, x, y: ClusterLayout("x", dp=8, zero=5), r"zero=5; valid choices: 0, 1, 2, 3"),
    ],
)
def test_bad_input_names_the_value_and_the_choices(call, words):
    model, x, y = toy()
    with pytest.raises(ValueError, match=words):
        call(model, x, y)


def test_the_ledger_table_lists_every_kind():
    model, x, y = toy()
    text = measure_training_memory(model, x, y, parts=toy_parts(model)).table("toy")
    assert text.splitlines()[0] == "toy" and "net2" in text
    assert len(KINDS) == 4


def test_memory_bars_saves_a_chart_and_refuses_an_unknown_unit(tmp_path):
    from helpers.memory.ledger import DeviceMemory
    from helpers.memory.plots import memory_bars

    bars = {"a": DeviceMemory(2**30, 2**30, 0, 2**31), "b": DeviceMemory(2**20, 0, 0, 0)}
    path = memory_bars(
        {"panel": bars}, tmp_path / "m.png", unit="GiB", limit=("card", 2**30), cap=2.0
    )
    assert path.stat().st_size > 0
    with pytest.raises(ValueError, match="TiB"):
        memory_bars({"panel": bars}, tmp_path / "n.png", unit="TiB")


def test_memory_balanced_cut_minimises_the_fuller_stage():
    from helpers.memory.cuts import memory_balanced_cut, stage_totals_by_cut

    layers = [nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 8)]
    totals = stage_totals_by_cut(layers, (64,), batch=4)
    best = memory_balanced_cut(totals)
    assert set(totals) == {1, 2, 3, 4}
    assert max(totals[best]) == min(max(t) for t in totals.values())
    with pytest.raises(ValueError, match="at least 2 layers"):
        memory_balanced_cut({})


SHAPES = {"7B": LLAMA_7B_SHAPE, "70B": LLAMA_70B_SHAPE}


def mixed_adam(shape, **options):
    """The one-stage row of a mixed-precision Adam estimate (one 4096-token sequence)."""
    return estimate_transformer(
        shape, batch=1, seq=4096, optimizer="adam", precision="mixed", **options
    )["stage 0"]


@pytest.mark.parametrize("name", SHAPES)
def test_zero_shards_optimizer_state_then_grads_then_weights(name):
    shape = SHAPES[name]
    one, n = mixed_adam(shape), shape.parameters()
    steps = 4 * (9 * shape.blocks + 3)  # Adam's step counters: one per tensor, never sharded
    unit = 2 * max(shape.unit_parameters())  # the largest unit, in full, 16-bit
    assert mixed_adam(shape, dp=8) == one == mixed_adam(shape, zero=3)  # dp=8 alone; dp=1
    z1, z2, z3 = (mixed_adam(shape, dp=8, zero=z) for z in (1, 2, 3))
    assert (z1.weights, z1.grads, z1.activations) == (one.weights, one.grads, one.activations)
    assert z1.optimizer_state == 12 * -(-n // 8) + steps  # master copy and two moments, / 8
    assert 0 <= (z1.optimizer_state - steps) - (one.optimizer_state - steps) / 8 < 12
    assert (z2.weights, z2.optimizer_state) == (one.weights, z1.optimizer_state)
    assert one.grads / 8 + unit <= z2.grads < one.grads / 8 + unit + 2
    assert (z3.grads, z3.optimizer_state) == (z2.grads, z1.optimizer_state)
    assert one.weights / 8 <= z3.weights <= one.weights / 8 + unit + 2
    assert z3.weights == 2 * -(-n // 8) + unit
    assert z3.activations == one.activations  # batch is per rank


def test_zero_gathers_the_largest_unit_on_each_stage():
    shape = TransformerShape(hidden=64, blocks=4, heads=2, ffn=128, vocab=1000)
    embed, block, head = shape.unit_parameters()
    assert embed > block and head > embed
    ledger = estimate_transformer(shape, batch=1, seq=8, stages=[1, 2, 1], dp=4, zero=3)
    numel = {"stage 0": embed + block, "stage 1": 2 * block, "stage 2": block + head}
    unit = {"stage 0": embed, "stage 1": block, "stage 2": head}
    for name, row in ledger.rows.items():
        assert row.weights == 4 * -(-numel[name] // 4) + 4 * unit[name], name
        assert row.grads == row.weights, name
    assert "dp=4, ZeRO-3" in ledger.note


@pytest.mark.parametrize("name", SHAPES)
def test_recompute_keeps_each_block_input_and_one_block(name):
    shape, tokens, e = SHAPES[name], 4096, 2
    plain, recomputed = mixed_adam(shape), mixed_adam(shape, recompute=True)
    block, kept = shape.block_activation_bytes(tokens, e), tokens * shape.hidden * e
    embed, head = shape.embed_activation_bytes(tokens), shape.head_activation_bytes(tokens, e)
    assert kept == shape.block_input_bytes(tokens, e)
    # the head's activations are freed before the last block is recomputed (its input kept)
    assert recomputed.activations == embed + shape.blocks * kept + block - kept
    assert recomputed.activations <= shape.blocks * kept + block + embed + head
    assert recomputed.activations < plain.activations / 10
    assert (recomputed.weights, recomputed.optimizer_state) == (plain.weights, plain.optimizer_state)
    tp8 = estimate_transformer(shape, batch=1, seq=tokens, precision="mixed", tp=8,
                               recompute=True)["stage 0"]
    assert tp8.activations > shape.blocks * kept  # the kept inputs are replicated over tp


def test_fsdp_fits_llama_7b_on_8_gpus_and_70b_needs_recompute_on_64():
    rows = fits_table(SHAPES, gpu_bytes=80 * 2**30, seq=4096)
    by = {(r.model, r.layout): r for r in rows}
    assert by["7B", "FSDP (ZeRO-3) 8"].fits and by["7B", "ZeRO-1 8"].fits
    assert not by["7B", "data parallel"].fits
    assert not by["70B", "FSDP 64"].fits and by["70B", "FSDP 64 + recompute"].fits
    assert by["70B", "FSDP 64"].gpus == 64 and by["70B", "TP 8 x PP 8, 1F1B"].gpus == 64
    assert ClusterLayout("x", tp=2, pp=4, dp=8).gpus == 64


def test_fits_chart_saves_a_chart_and_refuses_no_rows(tmp_path):
    from helpers.memory.fits import fits_chart

    rows = fits_table({"7B": LLAMA_7B_SHAPE}, gpu_bytes=80 * 2**30, seq=4096)
    path = fits_chart(rows, tmp_path / "fits.png", gpu_bytes=80 * 2**30, cap=300)
    assert path.stat().st_size > 0
    with pytest.raises(ValueError, match="no rows"):
        fits_chart([], tmp_path / "none.png", gpu_bytes=1)


def test_the_agreement_table_marks_each_cell_and_lists_the_predictions_that_differ():
    from helpers.memory.ledger import DeviceMemory, Ledger, agreement_table

    measured = Ledger({"dev0": DeviceMemory(4096, 4096, 0, 2048),
                       "dev1": DeviceMemory(8, 8, 16, 32)})
    same = Ledger({n: DeviceMemory(r.weights, r.grads, r.optimizer_state, r.activations)
                   for n, r in measured.rows.items()})
    table = agreement_table(measured, same, "title")
    assert table.splitlines()[0] == "title" and table.count("✓") == 10 and "✗" not in table
    off = Ledger({**same.rows, "dev1": DeviceMemory(8, 8, 16, 40)})
    lines = agreement_table(measured, off).splitlines()
    assert sum(line.count("✗") for line in lines) == 2  # activations and total
    assert lines[-2:] == ["  dev1 activations: predicted 40 B", "  dev1 total: predicted 72 B"]
    assert max(map(len, lines)) <= 100
