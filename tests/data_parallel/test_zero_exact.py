"""Lesson 06's hand ZeRO stages to the letter: on two thread ranks each stage's step equals
one process's Adam step on the whole batch (weights and the mean gradient's slices), and
each stage holds and frees, byte for byte, what it says it does; every refusal's words."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.data_parallel import zero
from helpers.data_parallel.zero import HandZero, check_divisible, validate_stage
from helpers.torchrun.in_notebook import run_ranks

LR = 0.1
# 30 float32 parameters (120 B): 0.weight 16, 0.bias 4, 2.weight 8, 2.bias 2
PARAMS = 30 * 4
HALF = PARAMS // 2
ADAM = 2 * HALF + 4 * 4  # both moments of the slices, and one 4-byte step per parameter


def _model() -> nn.Sequential:
    """The same weights every call (no global seed: thread ranks build theirs at once)."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.linspace(-1, 1, p.numel()).view(p.shape).roll(i) * (1 + i / 4))
    return model


def _units(model: nn.Sequential) -> dict[str, list[nn.Module]]:
    return {"first": [model[0]], "rest": [model[1], model[2]]}


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 4, generator=g), torch.randn(4, 2, generator=g)


def _reference() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One process, the whole batch: the mean gradient and the weights after one step."""
    model = _model()
    x, y = _batch()
    opt = torch.optim.Adam(model.parameters(), lr=LR, foreach=False)
    nn.functional.mse_loss(model(x), y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def _run(stage: int, param_dtype: torch.dtype | None = None) -> list:
    x, y = (t.to(param_dtype or torch.float32) for t in _batch())

    def work(rank, group):
        model = _model()
        hz = HandZero(model, _units(model), stage, lr=LR, group=group,
                      param_dtype=param_dtype)
        rows = slice(2 * rank, 2 * rank + 2)
        out = hz.step(x[rows], y[rows], nn.functional.mse_loss)
        after = {"held": hz.held(), "peak": dict(hz.peak),
                 "storage": [p.untyped_storage().nbytes() for p in model.parameters()],
                 "grads": [None if p.grad is None else p.grad.clone()
                           for p in model.parameters()],
                 "dtypes": {p.dtype for p in model.parameters()}}
        whole = dict(hz.full_weights())
        return hz, out, after, whole, dict(hz.grad_slices())

    return run_ranks(2, work, timeout=30, raise_errors=True)


def test_stage_3_frees_every_full_weight_after_its_step():
    for _hz, _out, after, _whole, _slices in _run(3):
        assert after["storage"] == [0] * 4 and after["held"]["weights"] == HALF


def test_a_second_step_holds_no_more_than_the_first():
    """Stage 1 drops the last step's gradient before the next backward."""
    x, y = _batch()

    def work(rank, group):
        model = _model()
        hz = HandZero(model, _units(model), 1, lr=LR, group=group)
        for _ in range(2):
            hz.step(x[2 * rank:2 * rank + 2], y[2 * rank:2 * rank + 2], nn.functional.mse_loss)
        return hz.peak

    assert run_ranks(2, work, timeout=30, raise_errors=True) == [
        {"weights": PARAMS, "grads": PARAMS, "optimizer_state": ADAM}] * 2


def test_one_float64_rank_steps_as_plain_adam():
    """N = 1: the whole model is the slice; float64 weights stay float64, gathered whole."""
    x, y = (t.double() for t in _batch())
    ref = _model().double()
    opt = torch.optim.Adam(ref.parameters(), lr=LR, foreach=False)
    nn.functional.mse_loss(ref(x), y).backward()
    opt.step()

    def work(rank, group):
        model = _model().double()
        hz = HandZero(model, _units(model), 2, lr=LR, group=group)
        hz.step(x, y, nn.functional.mse_loss)
        return hz.full_weights()

    (whole,) = run_ranks(1, work, timeout=30, raise_errors=True)
    for (name, got), (ref_name, want) in zip(whole, ref.named_parameters(), strict=True):
        assert name == ref_name and got.dtype == torch.float64
        torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_each_stage_steps_as_one_process_does(stage):
    grads, weights = _reference()
    x, _ = _batch()
    for rank, (hz, out, _after, whole, slices) in enumerate(_run(stage)):
        assert (hz.rank, hz.n, hz.stage) == (rank, 2, stage)
        assert list(whole) == list(weights)
        for name, w in weights.items():
            assert whole[name].shape == w.shape and whole[name].dtype == torch.float32
            torch.testing.assert_close(whole[name], w, rtol=0, atol=1e-6)
            k = w.numel() // 2
            mine = grads[name].view(-1)[rank * k:(rank + 1) * k]  # slice r of the mean
            torch.testing.assert_close(slices[name], mine, rtol=1e-6, atol=1e-7)
        assert out.shape == (2, 2) and not out.requires_grad
        if stage < 3:  # the model itself holds the updated weights, whole
            for name, p in hz.model.named_parameters():
                torch.testing.assert_close(p.detach(), weights[name], rtol=0, atol=1e-6)
        before = _model()(x[2 * rank:2 * rank + 2]).detach()
        torch.testing.assert_close(out, before, rtol=0, atol=0)  # the step's forward


def test_what_each_stage_holds_after_its_step_and_at_its_peak():
    """Stage 1 keeps every weight and gradient whole; stage 2 keeps a gradient whole only
    until its unit's backward ends; stage 3 frees the weights too, gathering one unit."""
    first = 20 * 4  # bytes of the larger unit's weights (and gradients)
    expected = {
        1: ({"weights": PARAMS, "grads": PARAMS, "optimizer_state": ADAM},
            {"weights": PARAMS, "grads": PARAMS, "optimizer_state": ADAM}),
        2: ({"weights": PARAMS, "grads": HALF, "optimizer_state": ADAM},
            {"weights": PARAMS, "grads": HALF + first, "optimizer_state": ADAM}),
        3: ({"weights": HALF, "grads": HALF, "optimizer_state": ADAM},
            {"weights": HALF + first, "grads": HALF + first, "optimizer_state": ADAM}),
    }
    for stage, (held, peak) in expected.items():
        for rank, (_hz, _out, after, _whole, _slices) in enumerate(_run(stage)):
            assert after["held"] == held, (stage, rank)
            assert after["peak"] == peak, (stage, rank)
            if stage == 1:  # the full gradient stays; slice r of it holds the mean
                assert all(g is not None and g.numel() in (16, 4, 8, 2)
                           for g in after["grads"])
            else:
                assert after["grads"] == [None] * 4
            assert after["storage"] == ([0] * 4 if stage == 3 else [64, 16, 32, 8])


def test_stage_1_keeps_the_mean_in_its_slice_of_the_full_gradient():
    grads, _ = _reference()
    for rank, (_hz, _out, after, _whole, _slices) in enumerate(_run(1)):
        for got, want in zip(after["grads"], grads.values(), strict=True):
            k = want.numel() // 2
            torch.testing.assert_close(got.view(-1)[rank * k:(rank + 1) * k],
                                       want.view(-1)[rank * k:(rank + 1) * k],
                                       rtol=1e-6, atol=1e-7)


def test_stage_3_gathers_in_16_bits_and_updates_float32_slices():
    grads, weights = _reference()
    for hz, _out, after, whole, _slices in _run(3, torch.bfloat16):
        assert after["dtypes"] == {torch.bfloat16} and after["storage"] == [0] * 4
        assert {s.dtype for s in hz.shard.values()} == {torch.float32}
        assert after["held"]["weights"] == HALF  # the float32 slices only, between steps
        for name, w in weights.items():  # Adam's first step: lr x the gradient's sign
            torch.testing.assert_close(whole[name], w, rtol=0, atol=0.02)


def test_the_hooks_come_off_and_the_world_is_the_default_group(monkeypatch):
    class World:
        @staticmethod
        def get_rank() -> int:
            return 1

        @staticmethod
        def get_world_size() -> int:
            return 2

    monkeypatch.setattr(zero, "dist", World)
    model = _model()
    hz = HandZero(model, _units(model), 3, lr=LR)
    assert (hz.rank, hz.n) == (1, 2)
    assert hz.held()["weights"] == HALF and hz.peak["weights"] == HALF
    assert [len(model[0]._forward_pre_hooks), len(model[2]._forward_hooks),
            len(model[2]._backward_pre_hooks)] == [1, 1, 1]
    hz.remove()
    assert [len(model[0]._forward_pre_hooks), len(model[2]._forward_hooks),
            len(model[2]._backward_pre_hooks)] == [0, 0, 0]
    two = _model()
    one = HandZero(two, _units(two), 1, lr=LR)  # stage 1: a slice is a view of the weight
    shard = one.shard[two[0].bias]
    assert shard.untyped_storage().data_ptr() == two[0].bias.untyped_storage().data_ptr()
    assert shard.tolist() == two[0].bias.detach()[2:].tolist()  # rank 1's half
    assert one.peak == {"weights": PARAMS, "grads": 0, "optimizer_state": 0}


def test_refusals_name_what_is_valid():
    assert validate_stage(2) == 2 and type(validate_stage(3)) is int
    for bad in (0, 4, True, None):
        with pytest.raises(ValueError, match=rf"^unknown ZeRO stage {bad!r}; valid choices: "
                                             r"1, 2, 3 \(0 is plain data parallelism: DDP\)$"):
            validate_stage(bad)
    with pytest.raises(ValueError, match=r"^parameter '0.weight' has 16 elements, which do "
                                         r"not divide by 3 ranks; valid: a world size dividing "
                                         r"every parameter's size \(FSDP2's fully_shard pads "
                                         r"such a parameter instead\)$"):
        check_divisible(_model(), 3)
    check_divisible(_model(), 2)  # every size even: accepted

    class Rank:
        def rank(self) -> int:
            return 0

        def size(self) -> int:
            return 2

    model = _model()
    with pytest.raises(ValueError, match=r"^units \['first'\] do not cover every parameter "
                                         r"of the model exactly once; valid: units that "
                                         r"partition its modules$"):
        HandZero(model, {"first": [model[0]]}, 2, lr=LR, group=Rank())
    with pytest.raises(ValueError, match=r"^param_dtype=torch.bfloat16 with stage 1; valid: "
                                         r"stage 3 \(stages 1-2 keep the float32 weights "
                                         r"whole\)$"):
        HandZero(model, _units(model), 1, lr=LR, group=Rank(), param_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="do not divide by 3 ranks"):
        HandZero(model, _units(model), 1, lr=LR, group=type("G", (), {
            "rank": lambda self: 0, "size": lambda self: 3})())


def test_a_backward_outside_step_reduces_each_unit_once_and_keeps_stage_2s_weights():
    """Stage 2, one rank, a backward the learner runs by hand: each unit's hooks count its
    two parameters, its full gradients are dropped, and its weights stay allocated."""
    x, y = _batch()

    def work(rank, group):
        model = _model()
        hz = HandZero(model, _units(model), 2, lr=LR, group=group)
        nn.functional.mse_loss(model(x), y).backward()
        return (dict(hz._done), [p.grad for p in model.parameters()],
                [p.untyped_storage().nbytes() for p in model.parameters()])

    (got,) = run_ranks(1, work, timeout=30, raise_errors=True)
    assert got == ({"first": 2, "rest": 2}, [None] * 4, [64, 16, 32, 8])


def test_a_model_of_empty_parameters_holds_nothing_at_its_peak(monkeypatch):
    """Zero-element weights: every byte count, the peak's included, is 0."""
    class World:
        @staticmethod
        def get_rank() -> int:
            return 0

        @staticmethod
        def get_world_size() -> int:
            return 2

    monkeypatch.setattr(zero, "dist", World)
    empty = nn.Module()
    empty.register_parameter("weight", nn.Parameter(torch.empty(0, 3)))
    hz = HandZero(empty, {"all": [empty]}, 1, lr=LR)
    assert hz.peak == hz.held() == {"weights": 0, "grads": 0, "optimizer_state": 0}
