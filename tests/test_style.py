"""The code the lessons teach from stays ruff-clean (helpers, tests and notebooks)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_passes():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it is in requirements.txt)")
    result = subprocess.run(
        [ruff, "check", "helpers", "tests", "notebooks"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-3000:]


def _helper_imports() -> dict[str, set[str]]:
    """Module -> the helpers modules it imports (``from helpers.x import y`` counts x and x.y)."""
    graph = {}
    for path in (ROOT / "helpers").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        deps = set()
        for line in path.read_text().splitlines():
            match = re.match(r"\s*from (helpers[\w.]*) import ([\w, ]+)", line)
            if match:
                deps.add(match.group(1))
                deps.update(f"{match.group(1)}.{n.strip()}" for n in match.group(2).split(","))
        graph[name] = {d for d in deps if d != name}
    return graph


def test_helpers_have_no_import_cycle():
    graph = _helper_imports()
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


def test_no_helper_module_is_over_250_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "helpers").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 250
    }
    assert not long, long
