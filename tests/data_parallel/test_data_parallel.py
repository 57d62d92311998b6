"""Lesson 06: collectives, the hand-written ZeRO stages against DDP, ledgers and bytes.

Ranks are threads of this process, each with its own gloo process group
(``helpers.torchrun.in_notebook.run_ranks``): the collectives really communicate.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from helpers.comm.collectives import (
    COLLECTIVES,
    expected_result,
    fit_alpha_beta,
    rank_input,
    ring_bytes,
    run_collective,
)
from helpers.comm.meter import CommMeter
from helpers.data_parallel.fsdp import fsdp_units
from helpers.data_parallel.zero import HandZero, check_divisible, validate_stage
from helpers.models.llama import build_lm, lm_config
from helpers.runs.contract import launch
from helpers.runs.data_parallel.config import DataParallelConfig
from helpers.runs.data_parallel.measured import BucketSpan
from helpers.runs.data_parallel.memory_tables import ledger_table
from helpers.runs.data_parallel.report import (
    bucket_lines,
    bytes_table,
    fit_lines,
    sweep_table,
    traffic_lines,
)
from helpers.runs.data_parallel.results import ZERO_STAGE, DataParallelResult
from helpers.runs.data_parallel.sweep import collective_call
from helpers.runs.data_parallel.traffic import (
    CallLog,
    Traffic,
    check_traffic,
    header_allowance,
    planned,
)
from helpers.torchrun.in_notebook import registered, run_ranks

TINY = lm_config(vocab=64, hidden=16, blocks=2)  # a block (4,128 weights) outweighs the head


def test_ring_bytes_follow_the_ring_and_refuse_bad_input():
    assert ring_bytes("all_reduce", 4, 1000) == 1500
    assert ring_bytes("reduce_scatter", 4, 1000) + ring_bytes("all_gather", 4, 1000) == 1500
    assert ring_bytes("broadcast", 4, 1000) == 1000
    assert all(ring_bytes(c, 1, 1000) == 0 for c in COLLECTIVES)
    with pytest.raises(ValueError, match="unknown collective 'allreduce'; valid choices: all_reduce"):
        ring_bytes("allreduce", 2, 10)
    with pytest.raises(ValueError, match="world_size=0"):
        ring_bytes("all_reduce", 0, 10)


def test_alpha_beta_fit_recovers_a_line_and_its_residuals():
    sent = [1e3, 1e4, 1e5, 1e6]
    fit = fit_alpha_beta("all_reduce", sent, [2e-5 + b / 1e9 for b in sent])
    assert fit.alpha_s == pytest.approx(2e-5) and fit.bandwidth == pytest.approx(1e9)
    assert max(abs(r) for r in fit.relative_residuals) < 1e-9
    with pytest.raises(ValueError, match="at least 2"):
        fit_alpha_beta("all_reduce", [1.0], [1.0])


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_collective_computes_what_it_says_and_is_counted(world_size):
    def work(rank, group):
        out = {}
        for name in COLLECTIVES:
            inputs = [rank_input(r, 4 * world_size) for r in range(world_size)]
            counter = CommMeter()
            with counter, registered(group):
                got = run_collective(name, inputs[rank], rank, world_size, group)
            out[name] = (torch.equal(got, expected_result(name, inputs, rank)),
                         counter.per_collective.ring[name], counter.per_collective.calls[name])
        return out

    for result in run_ranks(world_size, work, raise_errors=True):
        for name, (equal, sent, calls) in result.items():
            assert equal, name
            assert calls == 1 and sent == ring_bytes(name, world_size, 16 * world_size), name


def test_the_clock_at_the_doors_counts_what_the_dispatcher_counts():
    """Timed, the meter wraps torch.distributed's functions for the whole process (both
    thread ranks): the same calls and bytes as the two counters at the dispatcher."""
    def work(rank, group):
        counter = CommMeter()
        with counter, registered(group):
            for name in COLLECTIVES:
                run_collective(name, rank_input(rank, 8), rank, 2, group)
        return counter.per_collective

    with CommMeter(timed=True) as clock:
        counted = run_ranks(2, work, raise_errors=True)
    for what in ("calls", "ring", "gloo"):
        both = sum((getattr(c, what) for c in counted), Counter())
        assert getattr(clock.per_collective, what) == both, what
    assert set(clock.per_collective.seconds) == set(COLLECTIVES)
    assert clock.per_group.calls == {"other": 8}


def test_bad_stages_and_indivisible_parameters_are_refused():
    for bad in (0, 4, "2", True):
        with pytest.raises(ValueError, match="valid choices: 1, 2, 3"):
            validate_stage(bad)
    with pytest.raises(ValueError, match=r"parameter 'embed.weight' has 1024 elements, which do "
                                         r"not divide by 3 ranks"):
        check_divisible(build_lm(TINY), 3)


def test_config_refuses_bad_choices_before_any_launch():
    config = DataParallelConfig(model=TINY, batch=8, seq=8)
    assert config.ranks() == 2
    with pytest.raises(ValueError, match=r"batch of 8 sequences does not split over 3 ranks; "
                                         r"valid world sizes: \[1, 2, 4, 8\]"):
        launch(config, nproc=3)
    with pytest.raises(ValueError, match="accumulation=3 micro-steps"):
        replace(config, accumulation=3).validate(2)
    with pytest.raises(ValueError, match="accumulation=0; valid: an integer >= 1"):
        replace(config, accumulation=0).validate(2)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda' .* 0 GPU"):
            launch(replace(config, device="cuda"), nproc=2)
    with pytest.raises(ValueError, match="device='tpu'; valid choices: auto, cpu, cuda"):
        replace(config, device="tpu").validate(2)
    assert DataParallelConfig.from_args(config.args()) == config
    with pytest.raises(SystemExit):  # argparse: unknown flag
        DataParallelConfig.from_args([*config.args(), "--bogus", "1"])


def test_worker_help_describes_every_flag_and_its_result_is_typed():
    text = DataParallelConfig.parser().format_help()
    for flag in ("--model-vocab", "--model-hidden", "--model-blocks", "--batch", "--seq",
                 "--accumulation", "--bucket-cap-mb", "--collective-sizes", "--device"):
        assert flag in text, flag
    assert DataParallelConfig.result_type() is DataParallelResult


def test_group_of_threads_is_real():
    """The thread ranks above really talk: an all-reduce sums over them."""
    def work(rank, group):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=group)
        return t.item()

    assert run_ranks(2, work, raise_errors=True) == [3.0, 3.0]


UNITS = {"embed": [400], "blocks.0": [100, 300], "norm+head": [16, 400]}  # float32 bytes


def test_the_plans_follow_each_technique_from_the_shapes():
    assert planned("DDP", UNITS) == [("all_reduce", 1216)]
    zero1 = Counter(planned("ZeRO-1", UNITS))
    assert zero1 == Counter({("reduce_scatter", 400): 2, ("all_gather", 400): 2,
                             ("reduce_scatter", 100): 1, ("all_gather", 100): 1,
                             ("reduce_scatter", 300): 1, ("all_gather", 300): 1,
                             ("reduce_scatter", 16): 1, ("all_gather", 16): 1})
    zero3 = Counter(planned("ZeRO-3 bf16", UNITS))  # gathered twice, in 16 bits
    assert zero3[("all_gather", 200)] == 4 and zero3[("reduce_scatter", 400)] == 2
    fsdp = Counter(planned("FSDP2 no reshard", UNITS))
    assert fsdp == Counter({("all_gather", 400): 2, ("all_gather", 416): 1,
                            ("reduce_scatter", 400): 2, ("reduce_scatter", 416): 1})
    with pytest.raises(ValueError, match="no plan for run 'ZeRO-4'; valid: DDP"):
        planned("ZeRO-4", UNITS)


def test_the_bytes_verdict_fails_on_a_wrong_call_and_on_a_wire_out_of_bounds():
    plan = planned("ZeRO-1", UNITS)
    gloo = 1216 + 1216 / 2  # 2 ranks: every reduce-scatter an all-reduce, all-gathers half
    allowance = header_allowance(plan, 2)
    # per parameter (5), a reduce-scatter (an all-reduce of 4 segments: 4 pieces sent, 4
    # received) and an all-gather (2 pieces each way), 96 B a piece sent and 48 B received
    assert allowance == 5 * (96 * 4 + 48 * 4) + 5 * (96 * 2 + 48 * 2)

    def check(issued, wire):
        return check_traffic("ZeRO-1", Traffic(issued, {}, {}, wire), plan, 2)

    assert check(plan[::-1], int(gloo) + 100).ok  # any order
    assert check(plan, None).ok and check(plan, None).wire_ok is None
    assert not check([*plan, ("all_gather", 16)], int(gloo)).calls_as_planned
    assert not check([("all_reduce", s) if c == "reduce_scatter" else (c, s) for c, s in plan],
                     int(gloo)).ok
    assert not check(plan, int(gloo) - 1).ok  # less than gloo's payload: not gloo's algorithm
    assert not check(plan, int(gloo + allowance) + 1).ok
    assert "FAILED" in check(plan, 0).line()


def test_a_bucket_closes_when_it_reaches_or_passes_the_cap():
    def bucket(sizes):
        return BucketSpan(0, sum(sizes), ["p"] * len(sizes), sizes, 0, 1)

    assert bucket([100]).closes_at(100) and bucket([60, 50]).closes_at(100)
    assert not bucket([60, 30]).closes_at(100)  # below the cap: not closed (a last bucket)
    assert not bucket([60, 50, 10]).closes_at(100)  # closed one parameter too late


def test_the_call_log_lists_each_collective_with_its_full_size_and_the_timed_calls_work():
    def work(rank, group):
        with registered(group):
            log = CallLog()
            with log:
                for name in COLLECTIVES:
                    collective_call(name, 2, 64, torch.device("cpu"), group)()
            return log.issued

    for issued in run_ranks(2, work, raise_errors=True):
        assert issued == [(name, 64) for name in COLLECTIVES]


def test_a_hand_zero_gathers_in_16_bits_only_at_stage_3():
    model = build_lm(TINY)
    with pytest.raises(ValueError, match="param_dtype=torch.bfloat16 with stage 2; valid: stage 3"):
        HandZero(model, fsdp_units(model), 2, lr=1e-3, group=_OneRank(),
                 param_dtype=torch.bfloat16)


class _OneRank:
    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


@pytest.mark.twin
@pytest.mark.torchrun
def test_every_technique_on_two_processes_equals_one_process_and_its_prediction():
    """The lesson's launch at a tiny size: every proof, every ledger, every byte count.

    In real processes: DDP and ZeRO-2/3 communicate inside the backward (in gradient
    hooks), and two threads' backward passes in one process may run each other's hooks,
    so threads cannot stand in for ranks here."""
    config = DataParallelConfig(model=TINY, batch=4, seq=8, collective_sizes=(2**10, 2**12),
                                repeats=1, warmup=1, collective_repeats=2, steps=1, device="cpu")
    result = launch(config, nproc=2, timeout=240)
    assert result.config == config
    assert DataParallelResult.from_dict(result.to_dict()) == result
    assert result.ok, result.proof_lines()
    measured, predicted = result.measured_ledgers(), result.predicted_ledgers()
    assert list(measured.rows) == list(ZERO_STAGE) and measured.matches(predicted)
    checks = result.traffic_checks()
    assert [c.run for c in checks] == list(result.runs) and result.traffic_ok, checks
    one = ring_bytes("all_reduce", 2, result.weight_bytes)
    # by the ring formula, in all-reduces of the weights; by gloo's algorithms, whose
    # reduce-scatter is an all-reduce
    factors = {"DDP": (1, 1), "ZeRO-1": (1, 1.5), "ZeRO-2": (1, 1.5), "ZeRO-3": (1.5, 2),
               "ZeRO-3 bf16": (1, 1.5), "FSDP2": (1.5, 2), "FSDP2 no reshard": (1, 1.5),
               "FSDP2 bf16": (1, 1.5)}
    for name, (ring, gloo) in factors.items():
        traffic = result.runs[name].traffic
        assert (traffic.total_ring, traffic.total_gloo) == (ring * one, gloo * one), name
        if result.wire_reason is None:
            assert traffic.total_gloo <= traffic.wire, name
    fits = result.fits("sent"), result.fits("ring")
    if result.wire_reason is None:  # the wire is a reduce-scatter's ring bytes x 2 + headers
        assert fits[1]["reduce_scatter"].beta_s_per_byte == pytest.approx(
            2 * fits[0]["reduce_scatter"].beta_s_per_byte)
    assert result.no_sync_all_reduces == [0, 1] and result.first_step_buckets == 1
    assert [p.what for p in result.no_sync_proofs] == ["grads", "weights"] and result.no_sync_ok
    for row in result.sweep:  # what a fit's predict takes: gloo's payload, plus its headers
        sent = result.sent_bytes(row.collective, row.nbytes)
        assert row.gloo[0] <= sent and (row.wire is None or row.wire[0] <= sent), row
    text = [sweep_table(result), fit_lines(result), bucket_lines(result), bytes_table(result),
            traffic_lines(result), result.fsdp_parameter.line(), result.tracker_table(),
            ledger_table(measured, predicted), result.proof_lines()]
    assert max(len(line) for t in text for line in t.splitlines()) <= 100  # an output area
    assert result.gloo_threads == 2  # a default gloo group's worker threads
    fsdp = result.runs["FSDP2"].tracker
    assert fsdp.sharded_params == result.weight_bytes // 2
    # stage 2's gradients and stage 3's weights: half, plus one whole unit (a block here)
    block = 4 * sum(p.numel() for p in build_lm(config.model).blocks[0].parameters())
    assert measured["ZeRO-2"].grads == measured["ZeRO-3"].weights == result.weight_bytes // 2 + block


def test_the_memory_tables_fit_an_output_area_and_mark_a_prediction_that_differs():
    from helpers.memory import LLAMA_7B_SHAPE, LLAMA_70B_SHAPE, measure_training_memory
    from helpers.memory.fits import LAYOUTS, fits_table
    from helpers.memory.ledger import DeviceMemory, Ledger
    from helpers.memory.torch_trackers import track_step, tracker_table
    from helpers.models.toy import ToyModel
    from helpers.runs.data_parallel.memory_tables import fits_lines

    card = 80 * 2**30
    rows = fits_table({"Llama-7B": LLAMA_7B_SHAPE, "Llama-70B": LLAMA_70B_SHAPE},
                      gpu_bytes=card, seq=4096, layouts=LAYOUTS)
    toy, x, y = ToyModel("cpu", "cpu", 64, 8, 4), torch.randn(4, 64), torch.randn(4, 4)
    row = next(iter(measure_training_memory(toy, x, y, optimizer="adam").rows.values()))
    one = Ledger({"DDP": DeviceMemory(1, 2, 3, 4)})
    other = Ledger({"DDP": DeviceMemory(1, 2, 5, 4)})
    texts = [fits_lines(rows, card), tracker_table(track_step(toy, x, y, optimizer="adam"), row),
             ledger_table(one, one), ledger_table(one, other)]
    assert max(len(line) for t in texts for line in t.splitlines()) <= 100
    assert texts[2].endswith("✓") and texts[3].endswith("✗\n  predicted: optimizer_state 5 B")


def test_the_hand_ddp_proof_catches_a_missing_division_and_zero_a_missing_gather():
    """In-process thread ranks, the launch's tolerances: the right versions pass, the
    broken ones fail where the lesson says they do."""
    from helpers.runs.data_parallel.by_hand import hand_ddp_verdict, zero1_verdict

    config = DataParallelConfig(model=TINY, batch=4, seq=8)
    right, summed = hand_ddp_verdict(config), hand_ddp_verdict(config, divide=False)
    assert right.ok and "grads" in {p.what for p in summed.failed}
    assert summed.line().startswith("✗ DDP without ÷ N") and len(summed.line()) <= 100
    kept, lost = zero1_verdict(config), zero1_verdict(config, gather=False)
    assert kept.ok and [p.what for p in lost.failed] == ["weights"]
    with pytest.raises(ValueError, match="does not split over 3 ranks"):
        hand_ddp_verdict(config, world_size=3)


def test_a_verdict_names_each_proof_by_its_run_and_refuses_an_unknown_run():
    from helpers.core.checks import Proof

    fake = object.__new__(DataParallelResult)  # only the fields a verdict reads
    proofs = [Proof("grads", 1e-9, 1e-6), Proof("weights", 0.0, 1e-4)]
    object.__setattr__(fake, "runs", {"DDP": type("R", (), {"proofs": proofs})()})
    object.__setattr__(fake, "collective_checks", [Proof("all_reduce", 0.0, 0.0)])
    object.__setattr__(fake, "no_sync_proofs", [Proof("grads", 2e-6, 1e-6)])
    assert fake.verdict("DDP", "DDP").line().startswith("✓ DDP (2 checks")
    assert [p.what for p in fake.verdict("c", "DDP").proofs] == ["DDP: grads", "DDP: weights"]
    assert len(fake.verdict("c", "DDP", only=("weights",)).proofs) == 1
    assert not fake.verdict("n", "no_sync").ok
    assert fake.verdict("all", "collectives").line() == "✓ all (1 check, all exact)"
    with pytest.raises(ValueError, match="no run 'ZeRO-4'; valid: DDP, collectives, no_sync"):
        fake.verdict("c", "ZeRO-4")
