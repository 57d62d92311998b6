"""The small Llama composed over a (pp, dp, tp) mesh (groundwork of the final lesson).

Tolerance on the losses: 4 float32 epsilons of the first loss (about 2e-6). With the same
weights and gradients the loss differs only by the order of its float32 sums (a few units
in the last place), and after a few AdamW steps it stays there when the gradients agree.
A gradient scaled by 1/2 (micro-batch losses divided by their number while the schedule
also divides the gradients) moved it by 8e-6 after two steps: AdamW hides most of a
gradient's scale, but not its epsilon.
"""

import json
import shutil

import pytest

from helpers.composed.checkpoint import check, step_folder
from helpers.composed.layout import Layout
from helpers.composed.trainer import WORKER, TrainerConfig
from helpers.core.errors import FolderError
from helpers.distributed.launcher import launch

TOLERANCE = 4 * 2.0**-23 * 4.35  # 4 float32 epsilons of the first loss, 4.35


@pytest.mark.parametrize(
    ("change", "world", "named"),
    [
        ({"dp": 2, "tp": 2}, 2, ["= 4", "world size is 2"]),
        ({"pp": 3}, 3, ["pp=3", "valid pp: [1, 2, 4]"]),
        ({"pp": 8}, 8, ["pp=8", "4 blocks"]),
        ({"tp": 3}, 3, ["tp=3", "heads=4"]),
        ({"dp": 3}, 3, ["batch=8", "dp=3"]),
        ({"dp": 2, "microbatches": 3}, 2, ["microbatches=3", "4 sequences"]),
        ({"pp": 2, "microbatches": 1}, 2, ["microbatches=1 < pp=2"]),
        ({"steps": 0}, 1, ["--steps 0"]),
    ],
)
def test_bad_layouts_are_refused_with_the_valid_choices(change, world, named):
    with pytest.raises(ValueError) as error:
        TrainerConfig(**change).validate(world)
    assert all(part in str(error.value) for part in named), str(error.value)


def test_layout_names_and_flags_round_trip():
    assert str(Layout(2, 2, 2)) == "dp=2 x tp=2 x pp=2" and str(Layout()) == "one device"
    config = TrainerConfig(dp=2, pp=2, reference=True)
    assert TrainerConfig.from_args(config.args()) == config


@pytest.mark.torchrun
@pytest.mark.slow
def test_a_checkpoint_saved_under_one_layout_resumes_under_another(tmp_path):
    """pp=2 x tp=2 trains 2 steps and saves after each; dp=2 resumes and finishes 4 steps:
    all 4 losses (the first 2 from pipeline x tensor parallelism, read back from the
    checkpoint) are the one-process run's."""
    first = TrainerConfig(pp=2, tp=2, steps=2, checkpoint_dir=str(tmp_path)).validate(4)
    launch(WORKER, first.args(), nproc=4, timeout=240)
    assert json.loads((step_folder(tmp_path, 1) / "manifest.json").read_text())["step"] == 1
    second = TrainerConfig(dp=2, steps=4, checkpoint_dir=str(tmp_path), resume=True,
                           reference=True).validate(2)
    result = launch(WORKER, second.args(), nproc=2, timeout=240)
    diffs = [abs(a - b) for a, b in zip(result["losses"], result["reference_losses"],
                                        strict=True)]
    assert len(diffs) == 4 and max(diffs) <= TOLERANCE, diffs
    assert result["losses"][-1] < result["losses"][0] - 0.3  # it learns
    with pytest.raises(FolderError, match="hidden=64 in the checkpoint, 32 here"):
        check(step_folder(tmp_path, 1), TrainerConfig(hidden=32))
    broken = tmp_path / "broken"
    shutil.copytree(step_folder(tmp_path, 1), broken)
    (broken / ".metadata").unlink()
    with pytest.raises(FolderError, match="missing"):
        check(broken, second)
