"""PyTorch's own tools beside the course's, on real gloo ranks (threads): DTensor moving the
experts' weights (counted, against the hand collective and the sockets), and
``all_to_all_single_autograd`` against the course's dispatch; each with a planted fault
that must fail."""

from __future__ import annotations

import pytest

from helpers.expert_parallel import native
from helpers.expert_parallel.dispatch import dispatch
from helpers.expert_parallel.moe import MoEShape

SHAPE = MoEShape(hidden=64, ffn=128, experts=4, top_k=2)
SHAPE_8 = MoEShape(hidden=64, ffn=128, experts=8, top_k=2)


@pytest.mark.parametrize("ep, shape", [(2, SHAPE), (4, SHAPE_8)])
@pytest.mark.parametrize("target", native.TARGETS)
def test_dtensor_moves_the_experts_by_an_all_gather_on_cpu(ep, shape, target):
    """Every rank ends with its slice (DTensor's and the hand one's, equal bit for bit). On
    this CPU mesh DTensor issues one all-gather whatever the target: (ep - 1) shards per
    rank, ep times the hand all-to-all's (ep - 1)/ep of one shard; the meter counts the hand
    collective as the formula says, and the sockets carry each within gloo's headers."""
    move = native.redistribute_experts(ep, shape, target)
    local = shape.experts // ep * shape.ffn * shape.hidden * 4  # float32 gate_proj block
    assert move.shape == (shape.experts, shape.ffn, shape.hidden) and move.local_bytes == local
    assert move.equal
    assert move.dtensor_calls == {"all_gather_into_tensor": 1}
    assert move.dtensor_sent == (ep - 1) * local
    if target == "Replicate()":
        assert move.hand_collective == "all_gather" and move.hand_calls == {"all_gather": 1}
        assert move.hand_sent == (ep - 1) * local and move.ratio == 1
    else:
        assert move.hand_collective == "all_to_all" and move.hand_calls == {"all_to_all": 1}
        assert move.hand_sent == local * (ep - 1) / ep and move.ratio == ep
    assert move.counted_as_predicted
    assert move.dtensor_wire.ok is not False and move.hand_wire.ok is not False
    assert move.dtensor_wire.payload == ep * move.dtensor_sent


def test_a_wrong_slice_is_caught(monkeypatch):
    """The check compares every rank's block with the slice it must hold: the neighbour's
    slice fails it."""
    wrong = native.expected_shard
    monkeypatch.setattr(native, "expected_shard",
                        lambda full, target, rank, n: wrong(full, target, (rank + 1) % n, n))
    assert not native.redistribute_experts(2, SHAPE, "Shard(1)").equal


def test_the_socket_check_can_fail():
    check = native.WireCheck(payload=1000.0, headers=288, wire=1289)
    assert check.ok is False and native.WireCheck(1000.0, 288, 1288).ok is True
    assert native.WireCheck(1000.0, 288, 999).ok is False
    assert native.WireCheck(1000.0, 288, None).ok is None


@pytest.mark.parametrize("bad, match", [
    ({"target": "Shard(0)"}, r"target='Shard\(0\)'; valid: Shard\(1\), Shard\(2\), Replicate\(\)"),
    ({"ep": 3}, r"experts=4 is not divisible by ep=3; valid ep: \[1, 2, 4\]"),
    ({"shape": MoEShape(64, 6, 4, 2), "ep": 4, "target": "Shard(1)"},
     r"Shard\(1\) of gate_proj: its dim 1 has 6 rows, not divisible by ep=4"),
])
def test_bad_input_is_refused_naming_the_value_and_the_choices(bad, match):
    args = {"ep": 2, "shape": SHAPE, "target": "Shard(1)", **bad}
    with pytest.raises(ValueError, match=match):
        native.redistribute_experts(args["ep"], args["shape"], args["target"])


@pytest.mark.parametrize("ep, shape", [(2, SHAPE), (4, SHAPE_8)])
def test_all_to_all_single_autograd_is_the_courses_dispatch(ep, shape):
    """Forward and backward, both all-to-alls give what the definition says, on the splits
    the router chose; each is one all-to-all forward and one backward. The meter counts
    the course's at the dispatcher, as the formula says; PyTorch's functional collective
    reaches gloo from C++, past that door: 0 bytes counted."""
    a2a = native.autograd_all_to_all(ep, shape, tokens=16)
    assert len(a2a.routing) == ep and sum(map(sum, a2a.routing)) == ep * 16 * shape.top_k
    assert a2a.forward_equal and a2a.backward_equal
    assert a2a.hand_calls == {"alltoall_base_": 2}
    assert a2a.native_calls == {"all_to_all_single": 2}
    assert a2a.hand_meter == a2a.predicted > 0 and a2a.native_meter == 0


def test_a_wrong_all_to_all_fails_both_directions(monkeypatch):
    """The course's all-to-all with its rows reversed: wrong forward, and so backward."""
    monkeypatch.setattr(native, "dispatch",
                        lambda x, send, recv, group: dispatch(x, send, recv, group).flip(0))
    a2a = native.autograd_all_to_all(2, SHAPE, tokens=16)
    assert not a2a.forward_equal and not a2a.backward_equal


def test_moving_weights_against_moving_tokens():
    """The three projections of 2 float64 experts per rank: 3 x 2 x 128 x 64 x 8 B."""
    move = native.movement(SHAPE, 2, tokens=32768)
    assert move.weights_all_to_all == 196608 and move.weights_dtensor_cpu == 393216
    assert "196,608 B by all-to-all (393,216 B as DTensor does it on CPU)" in move.line()
    with pytest.raises(ValueError, match="not divisible by ep=3"):
        native.movement(SHAPE, 3, tokens=0)


def test_the_fallback_is_shown_from_this_torchs_source():
    text = native.fallback_source()
    assert text.startswith("# torch/distributed/tensor/_collective_utils.py:")
    assert "all_gather_single" in text and text.rstrip().endswith("return out.contiguous()")
