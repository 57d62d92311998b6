"""Exercise 13.1 (which ranks a (pp, dp, tp) DeviceMesh groups): the reference passes,
usual mistakes are told apart, and no process group outlives a check."""

from __future__ import annotations

import sys
import time

import pytest
import torch.distributed as dist

from helpers.exercises import load_solution
from helpers.exercises.mesh_groups import DIMS, LAYOUTS, check_mesh_groups, torch_groups


def _row_major(pp: int, dp: int, tp: int, *, rank=None) -> dict[str, list[list[int]]]:
    """The groups when ranks are numbered by ``rank(p, d, t)`` (row-major by default)."""
    rank = rank or (lambda p, d, t: (p * dp + d) * tp + t)
    return {
        "pp": [[rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
        "dp": [[rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
        "tp": [[rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)],
    }


def solution():
    """Exercise 13.1's reference answer."""
    return load_solution("13.1")


def swapped(pp, dp, tp):
    groups = _row_major(pp, dp, tp)
    return {"pp": groups["pp"], "dp": groups["tp"], "tp": groups["dp"]}


def column_major(pp, dp, tp):
    return _row_major(pp, dp, tp, rank=lambda p, d, t: p + pp * (d + dp * t))


def no_singletons(pp, dp, tp):
    return {k: [g for g in v if len(g) > 1] for k, v in _row_major(pp, dp, tp).items()}


def leaves_a_group(pp, dp, tp):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    return _row_major(pp, dp, tp)


def raises(pp, dp, tp):
    raise ZeroDivisionError("oops")


def unanswered(pp, dp, tp):
    ...


@pytest.fixture(autouse=True)
def no_group_before_or_after():
    """No process group outlives a test, nor the traceback hook each one installs."""
    assert not dist.is_initialized()
    hook = sys.excepthook
    yield
    assert not dist.is_initialized(), "a check left a process group initialised"
    assert sys.excepthook is hook, "init_process_group's excepthook was left installed"


def test_pytorch_numbers_the_ranks_row_major():
    for layout in LAYOUTS[:5]:
        want = {d: sorted(sorted(g) for g in v) for d, v in _row_major(*layout).items()}
        assert torch_groups(*layout) == want


def test_the_reference_solution_is_right():
    assert check_mesh_groups(solution()).solved


def test_a_row_major_answer_is_right_and_quick():
    torch_groups(1, 1, 1)  # the first mesh slice imports a part of torch: not the check's cost
    start = time.perf_counter()
    feedback = check_mesh_groups(_row_major)
    assert feedback.status == "right", feedback
    assert time.perf_counter() - start < 2.0
    assert "tp group within one node" in feedback.message


def test_groups_and_ranks_in_any_order_are_right():
    def shuffled(pp, dp, tp):
        return {d: [g[::-1] for g in v[::-1]] for d, v in _row_major(pp, dp, tp).items()}

    assert check_mesh_groups(shuffled).solved


@pytest.mark.parametrize(("wrong", "dim", "words"), [
    (swapped, "'dp'", "those are the tp groups"),
    (column_major, "'pp'", "row-major"),
    (no_singletons, "'pp'", "size 1"),
])
def test_a_wrong_layout_names_the_dimension_and_what_was_expected(wrong, dim, words):
    feedback = check_mesh_groups(wrong)
    assert feedback.status == "wrong", feedback
    assert f"[{dim}]" in feedback.message and "DeviceMesh forms" in feedback.message
    assert "(pp, dp, tp) = (" in feedback.message
    assert words in feedback.hint and "varies fastest" in check_mesh_groups(swapped).hint
    assert "* tp +" not in feedback.hint  # the principle, never the formula


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda pp, dp, tp: 3, "expected a dict"),
    (lambda pp, dp, tp: {"pp": [], "dp": []}, "'pp', 'dp'"),
    (lambda pp, dp, tp: {d: [[0.5]] for d in DIMS}, "integers"),
    (raises, "ZeroDivisionError"),
    (leaves_a_group, "left a process group"),
])
def test_a_malformed_answer_is_reported_and_nothing_is_left_behind(wrong, words):
    feedback = check_mesh_groups(wrong)
    assert feedback.status == "wrong" and words in f"{feedback.message} {feedback.hint}", feedback


@pytest.mark.parametrize("placeholder", [..., unanswered,
                                         lambda pp, dp, tp: dict.fromkeys(DIMS, ...)])
def test_the_placeholder_is_not_solved_yet(placeholder):
    feedback = check_mesh_groups(placeholder)
    assert feedback.status == "unsolved"
    assert repr(feedback).startswith("… Exercise 13.1: not solved yet. Write the body of")


def test_a_live_process_group_is_refused_and_kept():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    hook = sys.excepthook
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="already initialised"):
            check_mesh_groups(swapped)
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def test_groups_numbered_in_another_order_are_told_which_varies_fastest():
    from helpers.exercises.mesh_groups import _groups_in_order, _hint

    sizes = {"pp": 2, "dp": 1, "tp": 4}
    got = _groups_in_order(sizes, ("tp", "dp", "pp"), "tp")  # pp varying fastest
    hint = _hint("tp", got, torch_groups(2, 1, 4), sizes)
    assert "pp varying fastest" in hint and "tp, is the innermost" in hint
