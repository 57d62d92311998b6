"""Exercises 11.1 to 11.3 (expert parallelism): the reference solutions pass, the usual
mistakes get their hints, the placeholder is "not solved yet", and the "why" answer is
backed by a two-rank run against one device."""

from __future__ import annotations

import pytest
import torch

from helpers.exercises.expert_parallel import (
    CHOICES,
    RIGHT,
    check_bytes_sent,
    check_capacity_drops,
    check_why_not_all_reduced,
    gradient_proof,
)
from helpers.exercises.solutions import load_solutions
from helpers.expert_parallel.moe import keep_within_capacity

CHECKS = {"11.1": check_bytes_sent, "11.2": check_capacity_drops,
          "11.3": check_why_not_all_reduced}


SOLUTIONS = load_solutions("11")


@pytest.mark.parametrize("exercise", list(CHECKS))
def test_the_reference_solution_is_right(exercise):
    feedback = CHECKS[exercise](SOLUTIONS.ANSWERS[exercise])
    assert feedback.solved and feedback.exercise == exercise, feedback


@pytest.mark.parametrize("exercise", list(CHECKS))
def test_the_placeholder_is_not_solved_yet(exercise):
    def unanswered(*args): ...

    assert CHECKS[exercise](...).status == "unsolved"
    if exercise != "11.3":
        assert CHECKS[exercise](unanswered).status == "unsolved"


# --- 11.1: bytes sent --------------------------------------------------------------------------

def _sent(pick, scale=lambda h, e: h * e):
    """A bytes_sent that sums ``pick(counts, rank, ep, experts)`` rows."""
    def bytes_sent(counts, rank, hidden, element_bytes):
        ep, experts = counts.shape
        return int(pick(counts, rank, ep, experts)) * scale(hidden, element_bytes)
    return bytes_sent


def _away(c, r, ep, e):
    local = e // ep
    return c[r].sum() - c[r, r * local:(r + 1) * local].sum()


def _received(c, r, ep, e):
    local = e // ep
    return c[:, r * local:(r + 1) * local].sum() - c[r, r * local:(r + 1) * local].sum()


@pytest.mark.parametrize("wrong, words", [
    (_sent(lambda c, r, ep, e: c[r].sum()), "stay home"),
    (_sent(_received), "what the rank receives"),
    (_sent(_away, lambda h, e: h), "count bytes"),
    (_sent(_away, lambda h, e: e), "whole token vector"),
    (_sent(_away, lambda h, e: 2 * h * e), "forward only"),
    (lambda c, r, h, e: _sent(_away)(c, r, h, e) + _sent(_received)(c, r, h, e),
     "the dispatch only"),
    (_sent(lambda c, r, ep, e: c[r][torch.arange(e) % ep != r].sum()), "not every ep-th"),
    (_sent(lambda c, r, ep, e: c[r][torch.arange(e) != r].sum()), "is not its rank's"),
    (_sent(lambda c, r, ep, e: _away(c, r, ep, e) + 3), "sum the rank's rows"),
    (lambda c, r, h, e: "lots", "expected a number of bytes"),
    (lambda c, r, h, e: 1 / 0, "raised ZeroDivisionError"),
])
def test_bytes_sent_mistakes_get_their_hints(wrong, words):
    feedback = check_bytes_sent(wrong)
    assert feedback.status == "wrong" and words in f"{feedback.message} {feedback.hint}", feedback


def test_bytes_sent_accepts_a_tensor_or_a_float_of_the_right_value():
    right = SOLUTIONS.bytes_sent
    assert check_bytes_sent(lambda *a: torch.tensor(right(*a))).solved
    assert check_bytes_sent(lambda *a: float(right(*a))).solved


# --- 11.2: capacity drops ----------------------------------------------------------------------

def _token_major(experts, num, capacity, *, slot_first=False, last=False, kept=False, delta=0):
    order = experts.t() if slot_first else experts
    flat = order.reshape(-1)
    flat = flat.flip(0) if last else flat
    keep = keep_within_capacity(flat[:, None], capacity + delta, num).reshape(-1)
    keep = (keep.flip(0) if last else keep).view_as(order)
    keep = keep.t() if slot_first else keep
    return keep if kept else ~keep


@pytest.mark.parametrize("options, words", [
    ({"kept": True}, "True where an assignment is dropped"),
    ({"slot_first": True}, "token order: token 0's slots"),
    ({"last": True}, "keeps the first assignments"),
    ({"delta": -1}, "the (capacity + 1)-th is the first dropped"),
    ({"delta": 1}, "the (capacity + 1)-th is the first dropped"),
])
def test_capacity_mistakes_get_their_hints(options, words):
    feedback = check_capacity_drops(lambda *a: _token_major(*a, **options))
    assert feedback.status == "wrong" and words in f"{feedback.message} {feedback.hint}", feedback


@pytest.mark.parametrize("wrong, words", [
    (lambda e, n, c: torch.zeros(e.shape, dtype=torch.bool), "wrong at (token, slot)"),
    (lambda e, n, c: ~keep_within_capacity(e, c, n)[:, 0], "got shape"),
    (lambda e, n, c: (e >= c).float() * 2, "expected a bool tensor"),
    (lambda e, n, c: {(0, 1)}, "expected a bool tensor"),
])
def test_capacity_answers_of_the_wrong_kind_are_told_so(wrong, words):
    feedback = check_capacity_drops(wrong)
    assert feedback.status == "wrong" and words in f"{feedback.message} {feedback.hint}", feedback


def test_capacity_accepts_zeros_and_ones():
    assert check_capacity_drops(lambda *a: SOLUTIONS.capacity_drops(*a).long().tolist()).solved


# --- 11.3: why the experts' gradients are not all-reduced -------------------------------------

def test_the_why_answer_is_what_the_two_rank_run_shows():
    proof = gradient_proof()
    assert proof.expert_diff < 1e-12  # whole, with no collective on it
    assert proof.router_partial > 0.05  # one rank's share only, before the all-reduce
    assert proof.router_summed < 1e-12
    assert proof.mixed > 0.05  # another expert's gradient is no small correction
    assert check_why_not_all_reduced(" B ").solved


@pytest.mark.parametrize("choice, words", [
    ("a", "nothing is missed"),
    ("c", "adds nothing up"),
    ("d", "hold different experts"),
    ("e", "valid: 'a', 'b', 'c', 'd'"),
    (2, "valid: 'a'"),
])
def test_each_wrong_reason_is_told_why(choice, words):
    feedback = check_why_not_all_reduced(choice)
    assert feedback.status == "wrong" and words in f"{feedback.message} {feedback.hint}", feedback


def test_the_choices_are_four_and_one_is_right():
    assert list(CHOICES) == ["a", "b", "c", "d"] and RIGHT in CHOICES
    assert SOLUTIONS.why_not_all_reduced == RIGHT
