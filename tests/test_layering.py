"""The library's imports follow one layering, and no module imports itself round a cycle.

Layers, lowest first (a module may import its own layer's packages and lower ones):

0. ``helpers.core``: files, flags, devices, checks, timing
1. ``helpers.memory``, ``helpers.comm``, ``helpers.torchrun``: instruments and launcher
2. ``helpers.models``: the toy model, the MLP stack, the small Llama
3. ``helpers.profiles``, ``helpers.profile_sizes``: each lesson's sizes
4. the techniques, in lesson order: a technique may import an earlier lesson's
5. ``helpers.runs`` (the contract, then each lesson's run machinery) and ``helpers.tp_demo``
6. ``helpers.exercises``
7. ``course_tools``
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TECHNIQUES = ("model_parallel", "pipeline", "placement", "data_parallel", "tensor_parallel",
              "context_parallel", "expert_parallel",
              "debugging", "composed")  # in lesson order
LAYERS = {
    "core": 0, "memory": 1, "comm": 1, "torchrun": 1, "models": 2, "profiles": 3,
    "profile_sizes": 3, **dict.fromkeys(TECHNIQUES, 4), "runs": 5, "tp_demo": 5,
    "exercises": 6, "course_tools": 7,
}


def unit(module: str) -> str:
    """The layer unit of a module: ``helpers.<package>``'s package, or ``course_tools``."""
    parts = module.split(".")
    return "course_tools" if parts[0] == "course_tools" else parts[1]


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: Path) -> set[str]:
    """The helpers/course_tools modules ``path`` imports anywhere but under TYPE_CHECKING."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking(node):
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m.split(".")[0] in ("helpers", "course_tools") and "." in m}


def modules() -> dict[str, Path]:
    out = {}
    for top in ("helpers", "course_tools"):
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _existing(name: str, known: dict[str, Path]) -> str | None:
    """The module ``name`` names (``a.b.func`` is module ``a.b``), None if none."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def test_every_package_has_a_layer() -> None:
    units = {unit(m) for m in modules() if m.count(".") >= 1 or m == "course_tools"}
    assert units <= set(LAYERS) | {"__init__"}, sorted(units - set(LAYERS))


def test_no_import_runs_up_the_layers() -> None:
    known = modules()
    wrong = []
    for name, path in known.items():
        if "." not in name:
            continue
        mine = unit(name)
        for target in imports(path):
            other = unit(target)
            if other == mine or other not in LAYERS:
                continue
            if LAYERS[other] > LAYERS[mine]:
                wrong.append(f"{name} imports {target} (layer {LAYERS[other]} > {LAYERS[mine]})")
            elif mine in TECHNIQUES and other in TECHNIQUES and (
                    TECHNIQUES.index(other) > TECHNIQUES.index(mine)):
                wrong.append(f"{name} imports {target}: a later lesson's technique")
            elif mine == "runs" == other:
                pass
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle() -> None:
    known = modules()
    graph = defaultdict(set)
    for name, path in known.items():
        for target in imports(path):
            module = _existing(target, known)
            if module and module != name and not name.startswith(module + "."):
                graph[name].add(module)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(known):
        if node not in state and (cycle := visit(node)):
            raise AssertionError("import cycle: " + " -> ".join(cycle))


def test_the_layering_test_catches_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from helpers.runs.contract import launch\n")
    assert "helpers.runs.contract" in imports(bad)
    assert LAYERS[unit("helpers.runs.contract")] > LAYERS[unit("helpers.core.flags")]
