"""README.md and CONTRIBUTING.md say what the repository holds.

The course map has one row per lesson, in order, each a single sentence with the lesson's
time; the commands table names only commands that exist and every make target there is;
every file and hand-kept list CONTRIBUTING.md names is where it says. Text only: nothing
is imported or run.
"""

from __future__ import annotations

import re
from pathlib import Path

from course_tools.run_notebooks import lessons

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
LESSONS = [p.name for p in lessons()]


def section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def table(text: str) -> list[list[str]]:
    """The body rows of the first Markdown table in ``text``; it must be one block."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    block = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        block.append(line)
    rest = "\n".join(lines[first + len(block) :])
    assert not re.search(r"^\|", rest, re.M), "a row after the table's end (a blank line in it?)"
    # split on | outside backticks
    rows = [[c.strip() for c in re.split(r"\|(?=(?:[^`]*`[^`]*`)*[^`]*$)", line)[1:-1]]
            for line in block[2:]]
    return rows


MAP = table(section(README, "Course map"))
COMMANDS = table(section(README, "Commands"))


def test_the_course_map_has_one_row_per_lesson_in_order() -> None:
    assert [row[0] for row in MAP] == [name[:2] for name in LESSONS]
    for row, name in zip(MAP, LESSONS, strict=True):
        assert f"(notebooks/{name})" in row[1], (row[1], name)


def test_each_row_says_one_sentence_and_an_honest_time() -> None:
    header = section(README, "Course map").split("\n|---")[0].splitlines()[-1]
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "#", "lesson", "what you will see", "CPU time", "hardware"]
    seconds = 0
    for number, _, seen, time, hardware in MAP:
        words = re.sub(r"`[^`]*`", "code", seen)
        assert words.endswith(".") and words.count(". ") == 0, f"lesson {number}: one sentence"
        assert len(words.split()) <= 40, f"lesson {number}: {len(words.split())} words"
        assert re.fullmatch(r"\d+ s", time), f"lesson {number}: time {time!r}"
        assert hardware, f"lesson {number}: no hardware"
        seconds += int(time.split()[0])
    total = re.search(r"the whole series took (\d+\.\d) minutes", README)
    assert total and float(total.group(1)) == round(seconds / 60, 1)


def make_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.M).group(1).split()
    return {t for t in phony if re.search(rf"^{re.escape(t)}:", makefile, re.M)}


def module_file(module: str) -> Path | None:
    base = ROOT / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__main__.py"):
        if path.is_file():
            return path
    return None


def test_every_make_target_is_listed_and_every_listed_one_exists() -> None:
    listed = {m.group(1) for row in COMMANDS for m in [re.match(r"`make ([\w-]+)`", row[0])] if m}
    assert listed == make_targets()


def test_every_module_the_commands_name_exists() -> None:
    text = "\n".join(" ".join(row) for row in COMMANDS)
    modules = set(re.findall(r"-m ((?:helpers|course_tools)\.[\w.]+\w)(?![\w.<])", text))
    modules |= set(re.findall(r"`((?:helpers|course_tools)\.[\w.]+\w)`", text))
    lesson_rows = [row for row in COMMANDS if "helpers.runs.<lesson>.worker" in row[0]]
    assert len(lesson_rows) == 1
    lessons = re.findall(r"`(\w+)` \(", lesson_rows[0][2])
    modules |= {f"helpers.runs.{name}.worker" for name in lessons}
    missing = sorted(m for m in modules if "<" not in m and module_file(m) is None)
    assert not missing, missing
    workers = {p.parent.name for p in (ROOT / "helpers" / "runs").glob("*/worker.py")}
    assert workers <= set(lessons), f"workers not in the table: {sorted(workers - set(lessons))}"


def test_every_path_contributing_names_exists() -> None:
    paths = set(re.findall(r"`((?:helpers|course_tools|tests|docs|solutions|notebooks)/[^`\s]*)`",
                           CONTRIBUTING))
    concrete = [p for p in paths if not re.search(r"[<>*]|NN", p)]
    assert concrete
    missing = sorted(p for p in concrete if not (ROOT / p).exists())
    assert not missing, missing


def test_every_hand_kept_list_is_in_the_file_named() -> None:
    """Each ``NAME`` CONTRIBUTING.md places in a file is assigned there at top level."""
    kept = {
        "course_tools/gpu_check/catalog.py": ("STEPS",),
        "course_tools/gpu_check/context.py": ("FULL", "SMOKE"),
        "course_tools/bench/__main__.py": ("SECTIONS",),
        "tests/exercises/test_exercises.py": ("MODULES", "WRONG", "PLACEHOLDERS", "ONE_EXERCISE"),
        "tests/test_taught.py": ("TOPICS",),
        "tests/test_layering.py": ("TECHNIQUES",),
        "helpers/profiles.py": ("PROFILES",),
    }
    for path, names in kept.items():
        assert f"`{path}`" in CONTRIBUTING, path
        source = (ROOT / path).read_text()
        for name in names:
            assert f"`{name}`" in CONTRIBUTING, name
            assert re.search(rf"^{name}\b[^=\n]*=", source, re.M), f"{name} not in {path}"
    for solutions in (ROOT / "solutions").glob("[0-9][0-9]_*.py"):
        assert re.search(r"^ANSWERS = ", solutions.read_text(), re.M), solutions.name
