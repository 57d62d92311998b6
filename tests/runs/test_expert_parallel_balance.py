"""Training the MoE small Llama three ways: the recorded counts are every (token, slot)
choice, the seed fixes the run, the auxiliary loss and DeepSeek-V3's bias update both end
less imbalanced than no balancing (on a seed where it is clearly imbalanced), all three
learn the task, and the chart is saved with its axes labelled.

The three 40-step runs are lesson 11's own (the small profile's sizes, seed 3, the default
settings), which nbval runs in ``make test``: the tests reading them are twins (``make
test-twins``). The counts and the chart are read from 4-step runs of the same model."""

from __future__ import annotations

import struct
import time

import pytest
import torch

from helpers.composed.data import MarkovTask
from helpers.expert_parallel.balance import imbalance
from helpers.expert_parallel.moe import MoEShape
from helpers.profiles import get_profile
from helpers.runs.expert_parallel import balance_runs as training
from helpers.runs.expert_parallel.balance_runs import MODES, balance_chart, balance_run

SIZES = get_profile("small").expert_parallel  # lesson 11's, as nbval runs it
LM = SIZES.model
SHAPE = MoEShape(SIZES.model.hidden, SIZES.moe_ffn, SIZES.experts, SIZES.top_k)
STEPS, SEED, SHORT = SIZES.balance_steps, 3, 4
SETTINGS = {"batch": SIZES.batch, "seq": SIZES.seq}  # aux_weight, bias_rate, lr: the defaults


@pytest.fixture(scope="module")
def runs():
    """The three modes on one seed, timed together: lesson 11's balance runs."""
    start = time.perf_counter()
    done = {mode: balance_run(LM, SHAPE, steps=STEPS, mode=mode, seed=SEED, **SETTINGS)
            for mode in MODES}
    return done, time.perf_counter() - start


@pytest.fixture(scope="module")
def short_runs():
    """The three modes for a few steps: what each run records does not need 40 of them."""
    return {mode: balance_run(LM, SHAPE, steps=SHORT, mode=mode, seed=SEED, **SETTINGS)
            for mode in MODES}


def test_the_counts_are_every_token_and_slot_of_every_block(short_runs):
    for run in short_runs.values():
        assert run.counts.shape == (SHORT, LM.blocks, SHAPE.experts)
        assert (run.counts.sum(-1) == run.tokens * SHAPE.top_k).all()
        assert run.tokens == SETTINGS["batch"] * SETTINGS["seq"]
        assert run.imbalances[3, 1].item() == imbalance(run.counts[3, 1])
        assert len(run.losses) == run.steps == SHORT


@pytest.mark.twin
def test_both_balancers_end_less_imbalanced_than_none(runs):
    # the last 10 steps' mean on seed 3: without balancing 2.14, with the auxiliary loss
    # 1.35, with the bias update 1.38
    final = {mode: run.final_imbalance(last=10) for mode, run in runs[0].items()}
    assert final["none"] > 1.8, final  # this seed is clearly imbalanced without balancing
    for mode in ("aux", "bias"):
        assert final[mode] < 1.5 and final[mode] < final["none"] - 0.3, final


@pytest.mark.twin
def test_every_mode_learns_the_task(runs):
    task = MarkovTask(vocab=LM.vocab, seed=SEED)
    for run in runs[0].values():
        first, last = sum(run.losses[:3]) / 3, sum(run.losses[-3:]) / 3
        assert first > task.uniform_loss() - 0.3 and last < first - 0.5, (run.mode, first, last)


@pytest.mark.twin
def test_three_modes_run_within_class_time(runs):
    assert runs[1] < 20, runs[1]  # about 10 s on two busy cores; the bound leaves room


def test_the_same_seed_gives_the_same_run(short_runs):
    a, b = short_runs["bias"], balance_run(LM, SHAPE, steps=SHORT, mode="bias", seed=SEED,
                                           **SETTINGS)
    assert torch.equal(a.counts, b.counts) and a.losses == b.losses
    c = balance_run(LM, SHAPE, steps=SHORT, mode="bias", seed=SEED + 1, **SETTINGS)
    assert not torch.equal(a.counts, c.counts)


@pytest.mark.parametrize("options, match", [
    ({"mode": "switch"}, "mode='switch'; valid: 'none', 'aux', 'bias'"),
    ({"mode": "aux", "steps": 0}, "steps=0; valid: an integer >= 1"),
    ({"mode": "aux", "steps": 2, "aux_weight": -1.0}, "aux_weight=-1.0"),
])
def test_bad_settings_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        balance_run(LM, SHAPE, **{"steps": 2, **options})


def test_the_chart_labels_its_axes_and_fits_the_page(short_runs, tmp_path, monkeypatch):
    seen = {}

    def save(fig, path):
        seen["axes"] = [(ax.get_xlabel(), ax.get_ylabel(), len(ax.get_lines()))
                        for ax in fig.axes]
        return real(fig, path)

    real = training.save_figure
    monkeypatch.setattr(training, "save_figure", save)
    path = balance_chart(list(short_runs.values()), tmp_path / "balance.png",
                         "the bias update balances the experts without a loss term")
    assert seen["axes"] == [("training step", "imbalance (max / mean tokens per expert)", 4),
                            ("training step", "language-model loss (nats/token)", 3)]
    width = struct.unpack(">I", path.read_bytes()[16:20])[0]
    assert 400 < width <= 950
    with pytest.raises(ValueError, match="runs is empty"):
        balance_chart([], tmp_path / "none.png", "title")
