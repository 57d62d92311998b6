"""What a checker says: not solved yet, not right yet (with a hint), or right.

A checker runs the learner's answer against the lesson's own reference code, computed at
run time. An answer still left as ``...`` (or a function whose body is ``...``) is "not
solved yet", which is what the stored notebooks show, so unsolved exercises never fail.
"""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import torch

STATUSES = ("unsolved", "wrong", "right")
WIDTH = 88  # the verdict is wrapped to fit a notebook's output area
_HEADS = {
    "unsolved": "… Exercise {}: not solved yet.",
    "wrong": "✗ Exercise {}: not right yet.",
    "right": "✓ Exercise {}: right!",
}


@dataclass(frozen=True)
class Feedback:
    """One checker's verdict; shown as text in the notebook."""

    exercise: str
    status: str
    message: str
    hint: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}; valid: {', '.join(STATUSES)}")

    @property
    def solved(self) -> bool:
        return self.status == "right"

    def __repr__(self) -> str:
        lines = textwrap.wrap(f"{_HEADS[self.status].format(self.exercise)} {self.message}",
                              WIDTH, subsequent_indent="  ", break_on_hyphens=False)
        if self.hint:
            lines += textwrap.wrap(f"Hint: {self.hint}", WIDTH, initial_indent="  ",
                                   subsequent_indent="        ", break_on_hyphens=False)
        return "\n".join(lines)


class NotSolved(Exception):
    """The answer is still the placeholder."""


class Wrong(Exception):
    """The answer was checked and is wrong: ``message`` says how, ``hint`` where to look."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


def is_placeholder(value: object) -> bool:
    """True for the stored notebook's ``...`` (and for None, what a ``...`` body returns)."""
    return value is None or value is Ellipsis


def given(value: object) -> object:
    """``value``, unless it is still the placeholder."""
    if is_placeholder(value):
        raise NotSolved
    return value


def answer(function: object, *args: object) -> object:
    """Call the learner's ``function(*args)``; a placeholder body means "not solved yet"."""
    given(function)
    if not callable(function):
        raise Wrong(f"Expected a function, got {type(function).__name__} {function!r}")
    try:
        result = function(*args)
    except NotImplementedError as error:
        raise NotSolved from error
    except Exception as error:
        shown = ", ".join(_short(a) for a in args)
        raise Wrong(f"{_name(function)}({shown}) raised {type(error).__name__}: {error}") from error
    return given(result)


def _name(function: object) -> str:
    return getattr(function, "__name__", type(function).__name__)


def _short(value: object) -> str:
    text = repr(value) if not hasattr(value, "shape") else f"<tensor {tuple(value.shape)}>"
    return text if len(text) <= 40 else text[:37] + "..."


def checker(exercise: str, todo: str) -> Callable:
    """Make a check function return a :class:`Feedback`.

    The wrapped function raises :class:`NotSolved` or :class:`Wrong`, or returns the
    message that goes with a right answer. It runs seeded, under its own random state. ``todo`` says what to write, when unsolved.
    """

    def wrap(check: Callable[..., str]) -> Callable[..., Feedback]:
        @functools.wraps(check)
        def run(*args: object, **kwargs: object) -> Feedback:
            try:
                with torch.random.fork_rng(devices=[]):  # the notebook's random state is kept
                    torch.manual_seed(0)
                    message = check(*args, **kwargs)
            except NotSolved:
                return Feedback(exercise, "unsolved", todo)
            except Wrong as wrong:
                return Feedback(exercise, "wrong", wrong.message, wrong.hint)
            return Feedback(exercise, "right", message)

        run.exercise = exercise
        return run

    return wrap
