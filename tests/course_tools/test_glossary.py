"""The glossary and the lessons stay in step (docs/glossary.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from course_tools.glossary import (
    GLOSSARY,
    bold_terms,
    glossary_links,
    lesson_markdown,
    problems,
    read_glossary,
    slug,
    with_anchors,
)
from course_tools.run_notebooks import lessons

LESSONS = lessons()
SMALL = with_anchors("""# Glossary

## Bubble

*Also:* pipeline bubble

Idle time.

## f and g

*Also:* f, g

Megatron's operators.
""")


def lesson(*cells: str) -> dict[str, list[str]]:
    return {"99_test.ipynb": list(cells)}


def test_the_lessons_and_the_glossary_agree():
    assert problems(GLOSSARY.read_text(encoding="utf-8"), lesson_markdown(LESSONS)) == []


def test_every_lesson_is_checked():
    assert len(LESSONS) >= 7


def test_entries_are_in_alphabetical_order_and_defined():
    text = GLOSSARY.read_text(encoding="utf-8")
    entries = read_glossary(text)
    names = [e.name for e in entries]
    assert names == sorted(names, key=str.lower)
    for block in text.split("\n## ")[1:]:
        body = [line for line in block.splitlines()[1:] if line and not line.startswith("*Also:*")]
        assert body, f"entry {block.splitlines()[0]!r} has no definition"


@pytest.mark.parametrize(("heading", "anchor"), [
    ("f and g", "f-and-g"), ("1F1B", "1f1b"), ("Micro-batch", "micro-batch"),
    ("Column-parallel and row-parallel", "column-parallel-and-row-parallel"),
    ("`device_map`", "device_map"),
])
def test_slug_matches_the_anchor_a_code_host_makes(heading, anchor):
    assert slug(heading) == anchor


def test_an_undefined_bold_term_is_reported():
    found = problems(SMALL, lesson(
        "A [**bubble**](glossary.md#bubble), [f](glossary.md#f-and-g), [g](glossary.md#f-and-g)"
        " and a **stage**."))
    assert found == ["99_test.ipynb: bold term 'stage' is not in the glossary (add an entry or "
                     "a form after *Also:*, or set it in italics if it is not a term)"]


def test_forms_case_and_markup_are_accepted():
    cells = ["The **Pipeline  Bubble** and **`f`**, [x](glossary.md#bubble), [y](glossary.md#f-and-g),"
             " [z](glossary.md)"]
    assert problems(SMALL, lesson(*cells)) == []


def test_a_bold_lead_in_is_not_a_term_but_bold_in_a_heading_is():
    assert bold_terms("**Proof first.** The split\n- **On a CPU** nothing\n1. **Balance** it") == []
    assert bold_terms("## The **stage** and more") == ["stage"]
    assert bold_terms("text with **a term**\nacross **two\nlines**") == ["a term", "two lines"]


def test_a_link_to_a_missing_anchor_is_reported():
    found = problems(SMALL, lesson("[a](../docs/glossary.md#bubble) [b](../docs/glossary.md#f-and-g)"
                                   " [c](../docs/glossary.md#stage)"))
    assert len(found) == 1 and "glossary.md#stage, which is no entry" in found[0]


def test_an_unused_entry_and_too_few_links_are_reported():
    found = problems(SMALL, lesson("Only the [bubble](glossary.md#bubble)."))
    assert any("'f and g' is linked from no lesson" in p for p in found)
    assert any("1 link(s) to the glossary; at least 3" in p for p in found)


def test_a_form_claimed_by_two_entries_is_reported():
    text = SMALL + "\n## Gap\n\n*Also:* bubble\n\nIdle.\n"
    assert any("'bubble' is a form of both 'Bubble' and 'Gap'" in p for p in problems(text, {}))


def test_links_are_found_with_or_without_anchor():
    assert glossary_links("[a](../docs/glossary.md#rank) and [b](../docs/glossary.md)") == ["rank", ""]


def test_the_site_and_a_code_host_find_the_glossary_where_the_lessons_link_it():
    assert (Path(LESSONS[0]).parent / "../docs/glossary.md").resolve() == GLOSSARY.resolve()


def test_every_entry_has_an_anchor_jupyterlab_can_land_on():
    assert with_anchors(SMALL) == SMALL  # once only
    assert '<a id="f-and-g"></a>\n\n## f and g' in SMALL
    bare = SMALL.replace('<a id="bubble"></a>\n\n', "")
    found = problems(bare, lesson("[**f**](glossary.md#f-and-g) [x](glossary.md#bubble)"), 1)
    assert any("lacks its <a id=...></a> line" in p for p in found)
    assert not [p for p in problems(SMALL, lesson(
        "[**f**](glossary.md#f-and-g) [x](glossary.md#bubble)"), 1) if "<a id" in p]
