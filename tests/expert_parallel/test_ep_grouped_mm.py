"""``F.grouped_mm`` against the loop over the course's experts, on DTensor with the experts
sharded, and what this CPU refuses, each with the error it raises."""

from __future__ import annotations

import pytest
import torch

from helpers.expert_parallel import grouped_mm
from helpers.expert_parallel.moe import MoEShape

SHAPE = MoEShape(hidden=64, ffn=128, experts=4, top_k=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_is_the_loop_over_experts(dtype):
    """The same products, summed in the same order: the output and every gradient equal
    bit for bit on this CPU."""
    check = grouped_mm.grouped_mm_against_loop(SHAPE, tokens=64, dtype=dtype)
    assert sum(check.counts) == 64 * SHAPE.top_k and len(check.counts) == SHAPE.experts
    assert set(check.max_diff) == {"output", "grad input", "grad gate_proj", "grad up_proj",
                                   "grad down_proj"}
    assert check.equal, check.line()


def test_experts_in_the_wrong_order_fail(monkeypatch):
    """Each expert's rows through its neighbour's weights: far from the loop."""
    right = grouped_mm.stacked
    monkeypatch.setattr(grouped_mm, "stacked", lambda experts, name:
                        right(experts, name).roll(1, dims=0))
    check = grouped_mm.grouped_mm_against_loop(SHAPE, tokens=64)
    assert not check.equal and check.max_diff["output"] > 1e-3


@pytest.mark.parametrize("ep, shape", [(2, SHAPE), (4, MoEShape(64, 128, 8, 2))])
def test_dtensor_grouped_mm_gathers_the_experts_unless_the_tokens_are_there(ep, shape):
    """Rows with offsets, replicated: one all-gather of every expert ((ep - 1) shards per
    rank). Tokens padded per expert and sharded as the experts: nothing sent, the output
    sharded by expert. Both equal one process's; float32 is refused by the sharding rule."""
    run = grouped_mm.dtensor_grouped_mm(ep, shape, tokens=64)
    local = shape.experts // ep * shape.hidden * shape.ffn * 2  # bfloat16 gate_proj block
    assert run.calls == {"all_gather_into_tensor": 1} and run.gathered == (ep - 1) * local
    assert run.equal and run.padded_equal
    assert run.padded_calls == {} and run.padded_placement == "S(0)"
    assert not run.float32.ran
    assert "Expected mat_a to be BFloat16 or supported Float16 matrix, got torch.float32" in \
        run.float32.outcome


def test_what_this_cpu_refuses_each_with_its_error():
    found = {a.what: a for a in grouped_mm.limits()}
    ran = [what for what, a in found.items() if a.ran]
    assert ran == ["F.grouped_mm, float32, rows of 64 B"]
    want = {"float64": "Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double",
            "rows of 24 B": "strides should be multiple of 16 bytes",
            "int64 offsets": "Offsets have to be int32",
            "TokenSwitchNCCL": "ImportError: ",
            "all_to_all_vdev_2d": "Could not run 'symm_mem::all_to_all_vdev_2d' with arguments "
                                  "from the 'CPU' backend",
            "all_to_all_nd": "NotImplementedError: all_to_all_nd: unsupported backend: None"}
    for key, message in want.items():
        (attempt,) = [a for what, a in found.items() if key in what]
        assert message in attempt.outcome and attempt.where.startswith("torch/"), attempt.line()


def test_an_attempt_records_what_ran_and_what_raised():
    assert grouped_mm.attempt("sum", lambda: "3").line() == "sum: ran, 3"
    failed = grouped_mm.attempt("bad", lambda: str(torch.zeros(2) @ torch.zeros(3)))
    assert not failed.ran and failed.outcome.startswith("RuntimeError: ")
    assert "all_to_all_vdev_2d(Tensor input" in grouped_mm.vdev_2d_schema()
