"""The final lesson's task: a fixed random Markov chain, learnable in a few dozen steps."""

import pytest
import torch
import torch.nn.functional as F

from helpers.composed.data import MarkovTask
from helpers.models.llama import LMConfig, build_lm


def test_batches_depend_on_the_step_only_and_follow_the_chain():
    task = MarkovTask(vocab=50, seed=3)
    ids, targets = task.batch(4, 12, step=7)
    again, _ = MarkovTask(vocab=50, seed=3).batch(4, 12, step=7)
    assert torch.equal(ids, again) and not torch.equal(ids, task.batch(4, 12, step=8)[0])
    assert torch.equal(ids[:, 1:], targets[:, :-1])
    assert bool((task.transitions[ids, targets] > 0).all())  # every step is a transition
    assert torch.allclose(task.transitions.sum(dim=1), torch.ones(50))


def test_entropy_is_below_the_uniform_loss_and_the_loss_falls_towards_it():
    task = MarkovTask(vocab=64, seed=0)
    assert 0 < task.entropy() < task.uniform_loss() / 2
    torch.manual_seed(0)
    model = build_lm(LMConfig(vocab=64, hidden=32, blocks=1, ffn=64, heads=2)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(30):
        ids, targets = task.batch(8, 16, step)
        loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0 and losses[-1] > task.entropy() - 0.2


@pytest.mark.parametrize(("kwargs", "named"), [({"vocab": 0}, "vocab=0"),
                                                ({"vocab": 4, "branching": 5}, "branching=5")])
def test_bad_sizes_are_refused(kwargs, named):
    with pytest.raises(ValueError, match=named):
        MarkovTask(**kwargs)
    with pytest.raises(ValueError, match="step=-1"):
        MarkovTask(vocab=4).batch(1, 1, step=-1)
