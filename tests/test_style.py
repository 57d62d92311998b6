"""Both packages stay ruff-clean, short and acyclic; the taught one imports no tooling."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("helpers", "course_tools")  # what the lessons import, and what runs the course
TOOLING = re.compile(
    r"^\s*(?:from|import)\s+(course_tools|sphinx|playwright|mutmut|nbclient|nbformat|jupyter_book"
    r"|docutils)\b",
    re.M,
)


def test_ruff_check_passes():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it is in requirements.txt)")
    result = subprocess.run(
        [ruff, "check", *PACKAGES, "tests", "solutions", "notebooks"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:]


def _modules() -> list[Path]:
    return [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]


def _imports() -> dict[str, set[str]]:
    """Module -> the modules of both packages it imports (``from a.b import c`` counts a.b
    and a.b.c)."""
    graph = {}
    for path in _modules():
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        deps = set()
        for line in path.read_text().splitlines():
            match = re.match(r"\s*from ((?:helpers|course_tools)[\w.]*) import ([\w, ]+)", line)
            if match:
                deps.add(match.group(1))
                deps.update(f"{match.group(1)}.{n.strip()}" for n in match.group(2).split(","))
        graph[name] = {d for d in deps if d != name}
    return graph


def test_no_import_cycle_in_either_package():
    graph = _imports()
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if dep not in graph:
                continue
            assert state.get(dep) != "open", " -> ".join([*path, dep])
            if dep not in state:
                visit(dep, [*path, dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_no_module_of_either_package_is_over_300_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > 300
    }
    assert not long, long


def test_the_taught_package_imports_no_tooling():
    """helpers/ is what a learner reads: no notebook runner, website, mutation or bench code."""
    found = {
        str(p.relative_to(ROOT)): m.group(1)
        for p in (ROOT / "helpers").rglob("*.py")
        if (m := TOOLING.search(p.read_text()))
    }
    assert not found, found


def test_the_tooling_rule_can_fail():
    assert TOOLING.search("from course_tools.bench import sections\n")
    assert TOOLING.search("    import playwright\n")
    assert not TOOLING.search("from helpers.core import paths\n")


def test_every_test_file_name_is_unique():
    """The test folders are not packages, so pytest's default import mode needs each test
    module's file name to be unique across them."""
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("*.py"):
        if path.name not in ("__init__.py", "conftest.py"):
            names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {n: p for n, p in names.items() if len(p) > 1}
