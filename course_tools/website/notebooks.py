"""The stored lessons as the site shows them: executed, and without an error output.

The site never re-executes a notebook. It shows what nbval checks, so a notebook that was
never run (code cells without execution counts, or no outputs at all) or that stores an
error is refused, naming the notebook and the cell.
"""

from __future__ import annotations

import json
from pathlib import Path

from course_tools.run_notebooks import is_lesson
from course_tools.website import SiteError

LESSON_GLOB = "[0-9][0-9]_*.ipynb"
FIX = "execute it and store its outputs (make refresh)"


def lesson_notebooks(folder: Path) -> list[Path]:
    """The lessons in ``folder`` in teaching order (NN_*.ipynb, no ``.failed`` copies)."""
    found = sorted(p for p in folder.glob(LESSON_GLOB) if is_lesson(p))
    if not found:
        raise SiteError(f"no lesson notebooks ({LESSON_GLOB}) in {folder}")
    return found


def _code_cells(path: Path) -> list[tuple[int, dict]]:
    """(1-based cell number, cell) of every code cell; a file that is no notebook is refused."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SiteError(f"{path.name} is not a readable notebook: {error}") from error
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list) or nb.get("nbformat") != 4:
        raise SiteError(f"{path.name} is not an nbformat 4 notebook (no 'cells' list)")
    return [(i, c) for i, c in enumerate(cells, 1) if c.get("cell_type") == "code"]


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def check_executed(path: Path) -> None:
    """Raise :class:`SiteError` naming ``path`` unless it is stored executed and error-free."""
    cells = [(i, c) for i, c in _code_cells(path) if _source(c).strip()]
    if not cells:
        raise SiteError(f"{path.name} has no code cell; a lesson is a notebook that runs")
    missing = [i for i, c in cells if not isinstance(c.get("execution_count"), int)]
    if len(missing) == len(cells):
        raise SiteError(
            f"{path.name} was never executed: no code cell has an execution count; {FIX}"
        )
    if missing:
        raise SiteError(
            f"{path.name} is stored partly executed: cell {missing[0]} has no execution count "
            f"({len(missing)} of {len(cells)} code cells); {FIX}"
        )
    if not any(c.get("outputs") for _, c in cells):
        raise SiteError(f"{path.name} stores no outputs in any code cell; {FIX}")
    for i, cell in cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                what = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}".strip()
                raise SiteError(
                    f"{path.name} stores an error output in cell {i} ({what}); fix the cell, "
                    f"then {FIX}"
                )


def check_all(paths: list[Path]) -> None:
    """Check every notebook; one :class:`SiteError` lists all the refused ones."""
    problems = []
    for path in paths:
        try:
            check_executed(path)
        except SiteError as error:
            problems.append(str(error))
    if problems:
        head = "" if len(problems) == 1 else f"{len(problems)} notebooks refused: "
        raise SiteError(head + "; ".join(problems))
