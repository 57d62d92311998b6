"""The glossary (docs/glossary.md) and the lessons' use of it, read for the tests.

The rules the tests enforce:
- a bold phrase in a lesson's markdown is a term and must be an entry of the glossary
  (its heading or a form listed after *Also:*), except a *lead-in*: bold that opens a
  paragraph or a list item ("**Proof first.** ...");
- a link to ``glossary.md#anchor`` must name an entry's anchor;
- every entry is linked from at least one lesson;
- every entry's heading is preceded by ``<a id="anchor"></a>`` (:func:`with_anchors`).
  The site and a code host make the heading's own anchor; JupyterLab does not (it ids a
  heading by its text, case kept), but it scrolls to any element with that id, so the same
  ``glossary.md#anchor`` lands on the term under ``make lab`` too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from helpers.core.paths import REPO_ROOT

GLOSSARY = REPO_ROOT / "docs" / "glossary.md"
_BOLD = re.compile(r"\*\*(.+?)\*\*", re.DOTALL)
_LEAD_PREFIX = re.compile(r"[ \t>]*(?:(?:[-*]|\d+\.)[ \t]+)?\[?")  # quote, list marker, link
_LINK = re.compile(r"\]\(([^)\s]*glossary\.md)(?:#([^)\s]*))?\)")
_FENCE = re.compile(r"```.*?```", re.DOTALL)


def slug(heading: str) -> str:
    """The anchor a code host and the site (MyST) give a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def normal(term: str) -> str:
    """A term compared case-, markup- and whitespace-blind."""
    return " ".join(re.sub(r"[`*]", "", term).lower().split())


@dataclass(frozen=True)
class Entry:
    name: str
    forms: tuple[str, ...]

    @property
    def anchor(self) -> str:
        return slug(self.name)


def read_glossary(text: str) -> list[Entry]:
    """The entries: each ``## Name`` with the forms of its ``*Also:*`` line."""
    entries = []
    for block in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        name, _, body = block.partition("\n")
        also = re.search(r"^\*Also:\*(.*)$", body, flags=re.MULTILINE)
        forms = [f.strip() for f in also.group(1).split(",")] if also else []
        entries.append(Entry(name.strip(), tuple(f for f in forms if f)))
    return entries


def markdown_cells(notebook: Path) -> list[str]:
    """The lesson's markdown, code blocks removed."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return [_FENCE.sub("", "".join(c["source"])) for c in cells if c["cell_type"] == "markdown"]


def bold_terms(markdown: str) -> list[str]:
    """Bold phrases that are not lead-ins of a paragraph or list item."""
    terms, starts = [], set(_paragraph_starts(markdown))
    for match in _BOLD.finditer(markdown):
        line_begin = markdown.rfind("\n", 0, match.start()) + 1
        prefix = markdown[line_begin:match.start()]
        if not (line_begin in starts and _LEAD_PREFIX.fullmatch(prefix)):
            terms.append(" ".join(match.group(1).split()))
    return terms


def _paragraph_starts(markdown: str) -> list[int]:
    """Offsets of lines that open a paragraph or a list item."""
    starts, previous_blank, offset = [], True, 0
    for line in markdown.split("\n"):
        if line.strip() and (previous_blank or re.match(r"^[ \t>]*(?:[-*]|\d+\.)[ \t]", line)
                             or line.lstrip().startswith("#")):
            starts.append(offset)
        previous_blank = not line.strip()
        offset += len(line) + 1
    return starts


def glossary_links(markdown: str) -> list[str]:
    """The anchors of every link to the glossary ("" for a link to the page itself)."""
    return [m.group(2) or "" for m in _LINK.finditer(markdown)]


def anchor_line(entry: Entry) -> str:
    """The line that gives an entry its anchor where the renderer does not."""
    return f'<a id="{entry.anchor}"></a>'


def with_anchors(glossary_text: str) -> str:
    """The glossary with :func:`anchor_line` before every entry's heading (once)."""
    lines, out = glossary_text.split("\n"), []
    for line in lines:
        if line.startswith("## "):
            anchor = anchor_line(Entry(line[3:].strip(), ()))
            while out and out[-1] in ("", anchor):  # blank lines, and an anchor made before
                out.pop()
            out += ["", anchor, ""] if out else [anchor, ""]
        out.append(line)
    return "\n".join(out)


def problems(glossary_text: str, lessons: dict[str, list[str]], min_links: int = 3) -> list[str]:
    """Every way the lessons and the glossary disagree, one message each (empty: in step).

    ``lessons`` maps a lesson's name to its markdown cells.
    """
    entries = read_glossary(glossary_text)
    found, anchors, used = [], {e.anchor for e in entries}, set()
    index: dict[str, str] = {}
    for entry in entries:
        for form in (entry.name, *entry.forms):
            other = index.setdefault(normal(form), entry.name)
            if other != entry.name:
                found.append(f"glossary: {form!r} is a form of both {other!r} and {entry.name!r}")
    for name, cells in lessons.items():
        links = [a for md in cells for a in glossary_links(md)]
        used.update(links)
        for term in (t for md in cells for t in bold_terms(md)):
            if normal(term) not in index:
                found.append(f"{name}: bold term {term!r} is not in the glossary (add an entry or "
                             "a form after *Also:*, or set it in italics if it is not a term)")
        for anchor in links:
            if anchor and anchor not in anchors:
                found.append(f"{name}: link to glossary.md#{anchor}, which is no entry; valid: "
                             f"{', '.join(sorted(anchors))}")
        if len(links) < min_links:
            found.append(f"{name}: {len(links)} link(s) to the glossary; at least {min_links} "
                         "expected (link a term where the lesson introduces it)")
    if with_anchors(glossary_text) != glossary_text:
        found.append("glossary: an entry's heading lacks its <a id=...></a> line before it "
                     "(JupyterLab needs it to land on the term); run "
                     "`python -m course_tools.glossary --anchor` to add them")
    for entry in entries:
        if entry.anchor not in used:
            found.append(f"glossary: entry {entry.name!r} is linked from no lesson "
                         f"(link glossary.md#{entry.anchor} where a lesson uses it, or remove it)")
    return found


def lesson_markdown(notebooks: list[Path]) -> dict[str, list[str]]:
    """``problems``' input for the lesson notebooks."""
    return {p.name: markdown_cells(p) for p in notebooks}


def main(argv: list[str] | None = None) -> int:
    """``python -m course_tools.glossary --anchor``: add the anchor lines to the glossary."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--anchor", action="store_true",
                        help="rewrite docs/glossary.md with an <a id> line before each entry")
    args = parser.parse_args(argv)
    if args.anchor:
        from helpers.core.files import atomic_write_text

        text = GLOSSARY.read_text(encoding="utf-8")
        atomic_write_text(GLOSSARY, with_anchors(text))
        print(f"{GLOSSARY.name}: {len(read_glossary(text))} entries anchored")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
