"""The small Llama composed over a (pp, dp, tp) mesh (groundwork of the final lesson).

Tolerance on the losses: 1e-4, a hundredth of the learning rate. AdamW's first steps move a
weight by about lr whatever its gradient's size, so float32 sums in another order (the
ranks' partial sums, the micro-batches') can move the weights of near-zero gradients by up
to lr, and the loss by far less than lr; a wrong shard or a lost micro-batch moves it by
the size of the loss's fall per step (about 0.1 to 0.5 here).
"""

import pytest

from helpers.composed.layout import Layout
from helpers.composed.trainer import WORKER, TrainerConfig
from helpers.distributed.launcher import launch

TOLERANCE = 1e-4


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
def test_pipeline_with_tensor_and_sequence_parallelism_trains_as_one_process():
    config = TrainerConfig(pp=2, tp=2, reference=True).validate(4)
    result = launch(WORKER, config.args(), nproc=4, timeout=240)
    assert len(result["losses"]) == config.steps
    assert result["losses"][-1] < result["losses"][0] - 0.3  # it learns
    diffs = [abs(a - b) for a, b in zip(result["losses"], result["reference_losses"],
                                        strict=True)]
    assert max(diffs) <= TOLERANCE, diffs
