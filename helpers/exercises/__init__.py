"""Self-checking exercises: one checker module per topic, the verdicts, the solutions.

A lesson's exercise cell holds the learner's answer (``...`` until written); its check
cell calls a checker from ``helpers.exercises.<topic>``, which compares the answer with the
lesson's own reference code at run time and returns a :class:`Feedback`.
"""

from helpers.exercises.feedback import Feedback
from helpers.exercises.solutions import load_solution, show_solution

__all__ = ["Feedback", "load_solution", "show_solution"]
