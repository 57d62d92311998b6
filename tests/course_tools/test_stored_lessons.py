"""What a learner sees when a stored lesson opens in JupyterLab (beside the file browser,
a 1400-pixel window): no ● on opening, no printed line wrapped in the middle of a
number, no figure scaled down until its labels blur."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import pytest

from course_tools.run_notebooks import KERNELSPEC, lessons

LESSONS = lessons()
MAX_LINE = 100  # characters: what an output area holds at that width (about 118) less a margin
MAX_FIGURE_PX = 950  # the output area's width there: a wider PNG is scaled down


def _outputs(path: Path):
    for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        for output in cell.get("outputs", []):
            yield index, output


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem[:2])
def test_a_lesson_opens_with_the_metadata_jupyterlab_would_write(path):
    metadata = json.loads(path.read_text(encoding="utf-8"))["metadata"]
    assert metadata.get("kernelspec") == KERNELSPEC
    assert metadata.get("language_info", {}).get("name") == "python"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem[:2])
def test_no_printed_line_is_wider_than_the_output_area(path):
    wide = []
    for index, output in _outputs(path):
        text = _text(output.get("text")) or _text(output.get("data", {}).get("text/plain"))
        wide += [(index, len(line), line[:50]) for line in text.splitlines()
                 if len(line) > MAX_LINE]
    assert not wide, f"{len(wide)} line(s) over {MAX_LINE} characters (cell, length): {wide[:5]}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem[:2])
def test_every_figure_is_shown_at_its_own_size(path):
    wide = []
    for index, output in _outputs(path):
        png = output.get("data", {}).get("image/png")
        if png:
            width, height = struct.unpack(">II", base64.b64decode(_text(png))[16:24])
            if width > MAX_FIGURE_PX:
                wide.append((index, width, height))
    assert not wide, f"figures wider than {MAX_FIGURE_PX} px (cell, width, height): {wide}"
