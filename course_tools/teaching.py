"""How each stored lesson teaches, measured: the targets of "teach, then prove".

Read from the stored notebooks only (nothing runs). The teaching part of a lesson is every
cell before its ``## Exercises`` heading. ``python -m course_tools.teaching`` prints one row
per lesson and what falls short; ``tests/course_tools/test_teaching.py`` holds the targets.

- question: the opening cell asks the learner's question within its first 80 prose words.
- diagrams: drawn pictures: images in markdown, or PNG outputs of a cell that draws a
  diagram (its code names ``diagram``); one of them within the first five cells.
- sentences: words per sentence of the prose (code, math, tables, headings and
  ``<details>`` folds left out): the 90th percentile and the longest.
- asides and numbers: "(" and numerals per 100 prose words.
- output numbers: numerals per visible output cell, median (cells tagged ``hide-output``
  are folded on the website and in JupyterLab's view, and not counted).
- folds: ``<details>`` boxes and ``hide-output`` cells.
- break it: a "Break it" heading followed by a code cell whose output shows the proof fail.
- predictions: every numbered section that runs code asks the learner to predict, with the
  answer folded in a ``<details>`` box.
- summary: a "What you saw" section; exercises: one asks "Why".
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from course_tools.run_notebooks import lessons

TARGETS = {"p90_words": 35, "max_words": 50, "asides": 1.0, "numbers": 3.0, "output_numbers": 10}
HIDDEN = {"hide-output", "remove-output", "hide-cell", "remove-cell"}
FAILED_MARKS = ("✗", "FAILED", "AssertionError", "caught")
ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|et al|vs|cf|Fig|Eq|approx|no)\.")
NUMERAL = re.compile(r"(?<![\w.])[-+−]?\d[\d,.]*(?:e[-+]?\d+)?")


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def prose(markdown: str) -> str:
    """The sentences of a markdown cell: folds, code, math, images, tables and headings out."""
    text = re.sub(r"<details>.*?</details>", " ", markdown, flags=re.S | re.I)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", " MATH ", text, flags=re.S)
    text = re.sub(r"\$[^$\n]+\$", " MATH ", text)
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)|<img[^>]*>", " ", text)
    text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<a id=[^>]*></a>|<[^>]+>", " ", text)
    text = re.sub(r"^\s*#+ .*$", " ", text, flags=re.M)
    return re.sub(r"^\s*\|.*\|\s*$", " ", text, flags=re.M)


def sentences(text: str) -> list[str]:
    """Sentences of cleaned prose: paragraphs and list items split, then at . ! ?"""
    found = []
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )", text):
        flat = " ".join(ABBREVIATIONS.sub(r"\1", re.sub(r"`[^`]*`", "CODE", block)).split())
        for sentence in re.split(r"(?<=[.!?])\s+", flat):
            sentence = sentence.strip(" -*")
            if len(sentence.split()) >= 3:
                found.append(sentence)
    return found


def numerals(text: str) -> int:
    """Numbers written in ``text`` (inline code left out)."""
    return len(NUMERAL.findall(re.sub(r"`[^`]*`", " ", text)))


def _output_text(cell: dict) -> str:
    parts = []
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if "text/html" in data:
            continue
        for value in (output.get("text", ""), data.get("text/plain", "")):
            parts.append("".join(value) if isinstance(value, list) else value)
    return re.sub(r"<(?:IPython|helpers)[.\w]* object[^>]*>|<diagram: [^>]*>", "", "".join(parts))


def _images(cell: dict) -> int:
    return sum(bool({"image/png", "image/svg+xml"} & set(o.get("data", {})))
               for o in cell.get("outputs", []))


def _is_diagram(cell: dict) -> int:
    if cell["cell_type"] == "markdown":
        return len(re.findall(r"!\[[^\]]*\]\(|<img\b", _source(cell)))
    return _images(cell) if re.search(r"diagram", _source(cell), re.I) else 0


@dataclass
class LessonTeaching:
    """The measures of one stored lesson (see the module's docstring)."""

    lesson: str
    words: int
    question: bool
    diagrams: int
    first_diagram_cell: int | None
    p90_words: int
    max_words: int
    asides: float
    numbers: float
    output_numbers: float
    folds: int
    break_it: bool
    sections_without_prediction: list[str] = field(default_factory=list)
    predictions: int = 0
    summary: bool = False
    why_exercise: bool = False
    longest: str = ""

    def shortfalls(self) -> list[str]:
        """What misses a target, in words; empty when the lesson meets them all."""
        bad = []
        if not self.question:
            bad.append("the opening cell asks no question in its first 80 words")
        if self.diagrams < 1:
            bad.append("no drawn diagram")
        elif self.first_diagram_cell is None or self.first_diagram_cell > 4:
            bad.append(f"the first diagram is in cell {self.first_diagram_cell}, after cell 4")
        for key, limit in TARGETS.items():
            if getattr(self, key) > limit:
                bad.append(f"{key} {getattr(self, key)} > {limit}")
        if self.max_words > TARGETS["max_words"]:
            bad.append(f"longest sentence: {self.longest[:120]}...")
        if not any([self.folds]):
            bad.append("no fold (<details> box or hide-output cell)")
        if not self.break_it:
            bad.append("no 'Break it' cell whose output shows the proof fail")
        if self.sections_without_prediction:
            bad.append("no folded prediction in: " + "; ".join(self.sections_without_prediction))
        if not self.summary:
            bad.append("no 'What you saw' section")
        if not self.why_exercise:
            bad.append("no 'Why' exercise")
        return bad


def _sections(cells: list[dict]) -> list[tuple[str, list[dict]]]:
    """The lesson's ``## `` sections, each with its cells (the opening cells come first)."""
    sections: list[tuple[str, list[dict]]] = [("opening", [])]
    for cell in cells:
        heading = re.match(r"\s*##\s+(.*)", _source(cell)) if cell["cell_type"] == "markdown" else None
        if heading and not _source(cell).lstrip().startswith("###"):
            sections.append((heading.group(1).strip(), []))
        sections[-1][1].append(cell)
    return sections


def _predicts(cells: list[dict]) -> bool:
    for cell in cells:
        if cell["cell_type"] == "markdown":
            text = _source(cell)
            if re.search(r"\bpredict\b", text, re.I) and re.search(r"<details", text, re.I):
                return True
    return False


def _break_it(cells: list[dict]) -> bool:
    for index, cell in enumerate(cells):
        text = _source(cell)
        if cell["cell_type"] == "markdown" and re.search(r"^#+.*break it", text, re.I | re.M):
            for after in cells[index + 1 :]:
                if after["cell_type"] == "markdown" and re.match(r"\s*##\s", _source(after)):
                    break
                if after["cell_type"] == "code" and any(m in _output_text(after) for m in FAILED_MARKS):
                    return True
    return False


def measure(path: Path) -> LessonTeaching:
    """The teaching measures of the stored notebook at ``path``."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    end = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                and _source(c).lstrip().lower().startswith("## exercises")), len(cells))
    teach, exercises = cells[:end], cells[end:]
    markdown = [_source(c) for c in teach if c["cell_type"] == "markdown"]
    text = "\n\n".join(prose(m) for m in markdown)
    words = max(1, len(re.sub(r"`[^`]*`", "CODE", text).split()))
    said = [s for m in markdown for s in sentences(prose(m))]
    lengths = sorted(len(s.split()) for s in said)
    opening = prose(markdown[0]) if markdown else ""
    diagram_cells = [i for i, c in enumerate(teach) if _is_diagram(c)]
    shown = []
    for cell in teach:
        if cell["cell_type"] != "code" or _tags(cell) & HIDDEN:
            continue
        out = _output_text(cell)
        if out.strip():
            shown.append(numerals(out))
    skip = re.compile(r"what you saw|further reading|exercises|opening", re.I)
    missing = [name for name, part in _sections(teach)
               if not skip.search(name) and any(c["cell_type"] == "code" for c in part)
               and not _predicts(part)]
    return LessonTeaching(
        lesson=path.stem[:2],
        words=words,
        question="?" in " ".join(opening.split()[:80]),
        diagrams=sum(_is_diagram(c) for c in teach),
        first_diagram_cell=diagram_cells[0] if diagram_cells else None,
        p90_words=lengths[int(0.9 * (len(lengths) - 1))] if lengths else 0,
        max_words=lengths[-1] if lengths else 0,
        asides=round(100 * re.sub(r"`[^`]*`", "", text).count("(") / words, 1),
        numbers=round(100 * numerals(text) / words, 1),
        output_numbers=statistics.median(shown) if shown else 0,
        folds=sum(m.lower().count("<details") for m in markdown)
        + sum(bool(_tags(c) & {"hide-output", "hide-input", "hide-cell"}) for c in teach),
        break_it=_break_it(teach),
        sections_without_prediction=missing,
        predictions=sum(len(re.findall(r"\bpredict\b", m, re.I)) for m in markdown),
        summary=any(re.search(r"^#+\s*what you saw", m, re.I | re.M) for m in markdown),
        why_exercise=any(re.search(r"^###\s+Exercise[^:\n]*:\s*Why\b", _source(c), re.M)
                         for c in exercises if c["cell_type"] == "markdown"),
        longest=max(said, key=lambda s: len(s.split()), default=""),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the measures as JSON")
    args = parser.parse_args(argv)
    rows = [measure(p) for p in lessons()]
    if args.json:
        print(json.dumps([{**asdict(r), "shortfalls": r.shortfalls()} for r in rows], indent=1))
        return 0
    keys = ("lesson", "words", "question", "diagrams", "first_diagram_cell", "p90_words",
            "max_words", "asides", "numbers", "output_numbers", "folds", "break_it",
            "predictions", "summary", "why_exercise")
    print(" ".join(f"{k[:9]:>9}" for k in keys))
    for row in rows:
        print(" ".join(f"{str(getattr(row, k)):>9}" for k in keys))
    print(f"\ndiagrams in the course: {sum(r.diagrams for r in rows)}")
    short = [(r.lesson, r.shortfalls()) for r in rows if r.shortfalls()]
    for lesson, bad in short:
        print(f"{lesson}: " + "\n    ".join(bad))
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
