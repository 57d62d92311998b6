"""The expert-parallel run: its refusals before any launch, its verdicts, and two launches
under torchrun (routing as drawn, then with capacity dropping), each proven equal to one
process with its bytes as the routing predicts."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest

from helpers.core.checks import Proof
from helpers.core.flags import flag
from helpers.runs.contract import launch
from helpers.runs.expert_parallel.config import EPLayerConfig
from helpers.runs.expert_parallel.results import EPLayerResult, RankSide
from helpers.runs.llama_3d.processes import survivors
from helpers.torchrun.launcher import rank_logs


@pytest.mark.parametrize("config, world, match", [
    (EPLayerConfig(experts=6), 4,
     r"--experts 6 is not divisible by ep=4; valid ep: \[1, 2, 3, 6\]"),
    (EPLayerConfig(ep=4), 2, "--ep 4 but the world size is 2; valid: --ep 2"),
    (EPLayerConfig(ep=0), 2, "--ep 0; valid: an integer >= 1"),
    (EPLayerConfig(top_k=0), 2, "--top-k 0; valid: an integer from 1 to --experts 4"),
    (EPLayerConfig(top_k=5), 2, "--top-k 5; valid: an integer from 1 to --experts 4"),
    (EPLayerConfig(capacity_factor=0.0), 2, "--capacity-factor 0.0; valid: a number > 0, or none"),
    (EPLayerConfig(capacity_factor=-1.5), 2, "--capacity-factor -1.5; valid: a number > 0"),
    (EPLayerConfig(hidden=0), 2, "--hidden 0; valid: an integer >= 1"),
    (EPLayerConfig(ffn=-1), 2, "--ffn -1; valid: an integer >= 1"),
    (EPLayerConfig(tokens=0), 2, "--tokens 0; valid: an integer >= 1"),
    (EPLayerConfig(experts=0), 2, "--experts 0; valid: an integer >= 1"),
    (EPLayerConfig(repeats=0), 2, "--repeats 0; valid: an integer >= 1"),
    (EPLayerConfig(aux_weight=-0.1), 2, "--aux-weight -0.1; valid: a number >= 0"),
    (EPLayerConfig(device="tpu"), 2, "--device 'tpu'; valid choices: auto, cpu, cuda"),
])
def test_bad_input_is_refused_naming_the_value_and_the_choices(config, world, match):
    with pytest.raises(ValueError, match=match):
        config.validate(world)


def test_a_bad_launch_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="--ep 4 but the world size is 2"):
        launch(EPLayerConfig(ep=4), nproc=2)


def test_help_lists_every_flag_and_the_flags_round_trip():
    text = EPLayerConfig.parser().format_help()
    for f in fields(EPLayerConfig):
        assert flag(f.name) in text, f.name
    config = EPLayerConfig(ep=2, experts=8, top_k=1, capacity_factor=1.25, shared=True)
    assert EPLayerConfig.from_args(config.args()) == config


def _side(rank: int, a2a_forward: float = 24, a2a_backward: float = 16) -> RankSide:
    """A rank of ep=2, two experts, hidden 1: one row to each expert from each rank."""
    return RankSide(rank, [rank], [1, 1], [1, 1], [1, 1], [2], [2],
                    {"all_to_all": a2a_forward, "all_reduce": 16.0},
                    {"all_to_all": a2a_backward}, {"all_reduce": 16.0}, 40.0, None, [0.001])


def test_the_verdicts_are_decided_by_the_result():
    """Counts 8 B, dispatch and combine 8 B each forward, both again backward; the counts'
    all-reduce and the router's 16 B gradient by the ring formula: 16 B each on 2 ranks."""
    good = EPLayerResult(2, 2, 1, 1, 2, None, [Proof("output", 1e-16, 1e-13)],
                         {"output": 0.001}, [_side(0), _side(1)], [16], 0)
    assert good.verdicts == {"proven": True, "elementwise": True, "bytes_as_predicted": True,
                             "drops_as_one_device": True}
    assert good.tokens_per_expert == [2, 2] and good.imbalance == 1.0
    assert not replace(good, ranks=[_side(0), _side(1, a2a_backward=17)]).bytes_as_predicted
    assert not replace(good, proofs=[Proof("output", 1e-12, 1e-13)]).proven.ok
    assert not replace(good, ratios={"output": 1.5}).elementwise
    assert not replace(good, reference_dropped=1).drops_as_one_device


def _printed(log_dir) -> dict:
    """The JSON line rank 0 printed."""
    out = next(p for p in rank_logs(log_dir, 0) if p.name.startswith("stdout"))
    return json.loads(next(line for line in out.read_text().splitlines()
                           if line.startswith("{")))


@pytest.mark.torchrun
@pytest.mark.slow
def test_expert_parallel_on_torchrun_is_proven_counted_and_drops_as_one_device(tmp_path):
    """One launch (top-2, a shared expert, capacity factor 1): proven within the bound,
    every rank's bytes from its routing, the same assignments dropped as one process
    drops, and the JSON line's verdicts booleans."""
    run = launch(EPLayerConfig(capacity_factor=1.0, top_k=2, shared=True, repeats=1,
                               warmup=0), nproc=2, timeout=180, log_dir=tmp_path / "logs")
    assert isinstance(run, EPLayerResult) and run.proven.ok, run.proven.table()
    assert run.bytes_as_predicted and run.elementwise
    assert run.dropped > 0 and run.drops_as_one_device, (run.dropped, run.reference_dropped)
    assert run.capacity == 64 and all(k <= 64 for r in run.ranks for k in r.kept)
    assert len(run.proofs) == 3 + 1 + 3 * 4 + 3  # output, aux, input; router; 4 experts; shared
    assert any(p.what.startswith("grad shared.") for p in run.proofs)
    assert sum(run.tokens_per_expert) == 2 * 64 * 2 and run.imbalance >= 1.0
    assert all(r.wire_sent is None or r.wire_sent >= r.gloo_sent for r in run.ranks)
    assert all(len(r.seconds) == 1 and r.mean_ms > 0 for r in run.ranks)
    line = _printed(tmp_path / "logs")
    assert line["ep"] == 2 and line["dropped"] == run.dropped
    verdicts = {k: v for k, v in line.items() if k in run.verdicts}
    assert verdicts == run.verdicts and all(type(v) is bool and v for v in verdicts.values())
    assert survivors() == []
