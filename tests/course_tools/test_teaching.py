"""Teach, then prove: every stored lesson meets the course's teaching targets.

The measures live in ``course_tools.teaching`` (``python -m course_tools.teaching`` prints
them); these tests hold the targets, and first show on made-up lessons that the measures
catch what they claim to catch.
"""

from __future__ import annotations

import json

import pytest

from course_tools.run_notebooks import lessons
from course_tools.teaching import measure, numerals, prose, sentences

LESSONS = lessons()
MIN_DIAGRAMS = 10  # in the whole course


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(source: str, out: str = "", tags: tuple[str, ...] = (), png: bool = False) -> dict:
    outputs = [{"output_type": "stream", "name": "stdout", "text": out}] if out else []
    if png:
        outputs.append({"output_type": "display_data", "data": {"image/png": "iVBOR"},
                        "metadata": {}})
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": source,
            "outputs": outputs, "execution_count": 1}


GOOD = [
    _md("# Lesson 99\n\nHow do two ranks share one step? We draw it first."),
    _code("ring_diagram()", png=True),
    _md("## 1. A step\n\nPredict: how many bytes move?\n\n<details><summary>Answer</summary>"
        "Eight, because (the reason is long and folded away from the count) it is so.</details>"),
    _code("print(step())", "✓ the step matches (3 checks; worst 1e-7, allowed 1e-5)\n"),
    _code("print(table())", "1 2 3 4 5 6 7 8 9 10 11 12 13\n", tags=("hide-output",)),
    _md("## Break it\n\nDrop the division and the proof fails. Predict which check fails."
        "\n\n<details><summary>Answer</summary>gradients</details>"),
    _code("print(broken())", "✗ the step matches (1 of 3 checks fail)\n"),
    _md("## What you saw\n\nThe step matches."),
    _md("## Exercises"),
    _md("### Exercise 99.1: Why does the ring send less?\n\nExplain."),
]


def _write(tmp_path, cells) -> object:
    path = tmp_path / "99_made_up.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


def test_a_lesson_that_teaches_first_meets_every_target(tmp_path):
    measured = measure(_write(tmp_path, GOOD))
    assert measured.shortfalls() == []
    assert measured.diagrams == 1 and measured.first_diagram_cell == 1
    assert measured.output_numbers == 2.5  # 3 and 2 numbers shown; the folded table not counted
    assert measured.folds == 3 and measured.break_it and measured.why_exercise


@pytest.mark.parametrize("change, expected", [
    (lambda c: [_md("# Lesson 99\n\nTwo ranks share one step.")] + c[1:], "asks no question"),
    (lambda c: c[:1] + [_code("ring()", png=True)] + c[2:], "no drawn diagram"),
    (lambda c: c[:1] + [_md("x")] * 5 + c[1:], "first diagram is in cell 6"),
    (lambda c: c[:3] + [_code("print(t)", " ".join("1" * 11))] * 2 + c[4:], "output_numbers 11"),
    (lambda c: c[:5] + [_md("## Break it\n\nNothing breaks."), _code("x", "✓ fine")] + c[7:],
     "no 'Break it' cell"),
    (lambda c: c[:2] + [_md("## 1. A step\n\nPredict: bytes? Eight.")] + c[3:],
     "no folded prediction in: 1. A step"),
    (lambda c: c[:7] + c[8:], "no 'What you saw'"),
    (lambda c: c[:-1] + [_md("### Exercise 99.1: How many bytes?")], "no 'Why' exercise"),
    (lambda c: c[:7] + [_md("## What you saw\n\n" + " ".join(["word"] * 51) + ".")] + c[8:],
     "max_words 51 > 50"),
    (lambda c: c[:7] + [_md("## What you saw\n\n(a) (b) (c) is it.")] + c[8:], "asides"),
])
def test_each_measure_catches_what_it_claims(tmp_path, change, expected):
    assert expected in "\n".join(measure(_write(tmp_path, change(GOOD))).shortfalls())


def test_prose_leaves_out_code_math_tables_and_folds():
    text = prose("# Title\n\nOne $x^2$ two `code(1, 2)`.\n\n| 1 | 2 |\n\n"
                 "<details>(1) (2) 3 4</details>\n\n```\nprint(1)\n```")
    assert numerals(text) == 0 and "(" not in text.replace("`code(1, 2)`", "")
    assert sentences("A short one. And e.g. a second, longer one here.") == [
        "A short one.", "And e.g a second, longer one here."]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem[:2])
def test_the_lesson_teaches_then_proves(path):
    assert measure(path).shortfalls() == []


def test_the_course_draws_its_ideas():
    drawn = {p.stem[:2]: measure(p).diagrams for p in LESSONS}
    assert sum(drawn.values()) >= MIN_DIAGRAMS, drawn
