"""Training the MoE small Llama three ways: the recorded counts are every (token, slot)
choice, the seed fixes the run, the auxiliary loss and DeepSeek-V3's bias update both end
less imbalanced than no balancing (on a seed where it is clearly imbalanced), all three
learn the task, and the chart is saved with its axes labelled."""

from __future__ import annotations

import struct
import time

import pytest
import torch

from helpers.composed.data import MarkovTask
from helpers.expert_parallel.balance import imbalance
from helpers.expert_parallel.moe import MoEShape
from helpers.models.llama import LMConfig
from helpers.runs.expert_parallel import balance_runs as training
from helpers.runs.expert_parallel.balance_runs import MODES, balance_chart, balance_run

LM = LMConfig(vocab=64, hidden=32, blocks=2, ffn=64, heads=2)
SHAPE = MoEShape(hidden=32, ffn=32, experts=16, top_k=2)
STEPS, SEED = 40, 3
SETTINGS = {"aux_weight": 0.1, "bias_rate": 0.005, "batch": 32, "seq": 32, "lr": 1e-2}


@pytest.fixture(scope="module")
def runs():
    """The three modes on one seed, timed together."""
    start = time.perf_counter()
    done = {mode: balance_run(LM, SHAPE, steps=STEPS, mode=mode, seed=SEED, **SETTINGS)
            for mode in MODES}
    return done, time.perf_counter() - start


def test_the_counts_are_every_token_and_slot_of_every_block(runs):
    for run in runs[0].values():
        assert run.counts.shape == (STEPS, LM.blocks, SHAPE.experts)
        assert (run.counts.sum(-1) == run.tokens * SHAPE.top_k).all()
        assert run.tokens == SETTINGS["batch"] * SETTINGS["seq"]
        assert run.imbalances[3, 1].item() == imbalance(run.counts[3, 1])
        assert len(run.losses) == run.steps == STEPS


def test_both_balancers_end_less_imbalanced_than_none(runs):
    # the last 10 steps' mean, seeds 0 to 7: without balancing 1.61 to 2.20, with the
    # auxiliary loss 1.37 to 1.45, with the bias update 1.30 to 1.37; seed 3: 2.06, 1.41, 1.37
    final = {mode: run.final_imbalance(last=10) for mode, run in runs[0].items()}
    assert final["none"] > 1.8, final  # this seed is clearly imbalanced without balancing
    for mode in ("aux", "bias"):
        assert final[mode] < 1.5 and final[mode] < final["none"] - 0.3, final


def test_every_mode_learns_the_task(runs):
    task = MarkovTask(vocab=LM.vocab, seed=SEED)
    for run in runs[0].values():
        first, last = sum(run.losses[:3]) / 3, sum(run.losses[-3:]) / 3
        assert first > task.uniform_loss() - 0.3 and last < first - 0.5, (run.mode, first, last)


def test_three_modes_run_within_class_time(runs):
    assert runs[1] < 20, runs[1]  # about 10 s on two busy cores; the bound leaves room


def test_the_same_seed_gives_the_same_run():
    a, b = (balance_run(LM, SHAPE, steps=4, mode="bias", seed=3, **SETTINGS) for _ in range(2))
    assert torch.equal(a.counts, b.counts) and a.losses == b.losses
    c = balance_run(LM, SHAPE, steps=4, mode="bias", seed=4, **SETTINGS)
    assert not torch.equal(a.counts, c.counts)


@pytest.mark.parametrize("options, match", [
    ({"mode": "switch"}, "mode='switch'; valid: 'none', 'aux', 'bias'"),
    ({"mode": "aux", "steps": 0}, "steps=0; valid: an integer >= 1"),
    ({"mode": "aux", "steps": 2, "aux_weight": -1.0}, "aux_weight=-1.0"),
])
def test_bad_settings_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        balance_run(LM, SHAPE, **{"steps": 2, **options})


def test_the_chart_labels_its_axes_and_fits_the_page(runs, tmp_path, monkeypatch):
    seen = {}

    def save(fig, path):
        seen["axes"] = [(ax.get_xlabel(), ax.get_ylabel(), len(ax.get_lines()))
                        for ax in fig.axes]
        return real(fig, path)

    real = training.save_figure
    monkeypatch.setattr(training, "save_figure", save)
    path = balance_chart(list(runs[0].values()), tmp_path / "balance.png",
                         "the bias update balances the experts without a loss term")
    assert seen["axes"] == [("training step", "imbalance (max / mean tokens per expert)", 4),
                            ("training step", "language-model loss (nats/token)", 3)]
    width = struct.unpack(">I", path.read_bytes()[16:20])[0]
    assert 400 < width <= 950
    with pytest.raises(ValueError, match="runs is empty"):
        balance_chart([], tmp_path / "none.png", "title")
