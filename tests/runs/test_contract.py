"""The one contract with every torchrun worker: typed config in, typed result out."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import pytest

import helpers.runs
from helpers.core.flags import option
from helpers.models.llama import LMConfig
from helpers.runs.contract import Record, RunConfig, launch

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Inner(Record):
    sizes: tuple[int, ...] = option((1, 2), "sizes, comma-separated")
    scale: float = option(0.5, "a scale")


@dataclass(frozen=True)
class Example(RunConfig):
    """An example launch."""

    WORKER: ClassVar[str] = "helpers.runs.example"
    model: LMConfig = option(LMConfig(vocab=10, hidden=8, blocks=1, ffn=16, heads=2),
                             "the model")
    inner: Inner = option(Inner(), "inner sizes")
    mode: Literal["a", "b"] = option("a", "which mode")
    switch: bool = option(False, "a switch")
    cap: int | None = option(None, "a cap; none: no cap")


@dataclass(frozen=True)
class Measured(Record):
    name: str
    by_size: dict[int, list[float]]
    parts: list[Inner]
    pair: tuple[int, float]
    extra: Inner | None = None


def test_flags_round_trip_every_kind_of_field() -> None:
    config = Example(model=LMConfig(vocab=12, hidden=16, blocks=2, ffn=32, heads=4,
                                    kv_heads=2, rope=True),
                     inner=Inner((3,), 2.0), mode="b", switch=True, cap=7)
    assert Example.from_args(config.args()) == config
    assert Example.from_args(Example().args()) == Example()
    assert "--model-kv-heads" in config.args()


def test_help_describes_every_flag() -> None:
    text = Example.parser().format_help()
    for name in ("--model-vocab", "--model-rope", "--inner-sizes", "--mode", "--switch", "--cap"):
        assert name in text
    assert "rotary position embeddings" in text and "which mode" in text


def test_a_field_without_help_is_refused() -> None:
    @dataclass(frozen=True)
    class Bare(RunConfig):
        WORKER: ClassVar[str] = "x"
        steps: int = 3

    with pytest.raises(TypeError, match="Bare.steps has no help"):
        Bare.parser()


def test_a_bad_choice_is_refused_with_the_valid_ones(capsys) -> None:
    with pytest.raises(SystemExit):
        Example.from_args(["--mode", "c"])
    assert "choose from 'a', 'b'" in capsys.readouterr().err


def test_records_round_trip_nested_fields() -> None:
    record = Measured("x", {4: [1.0, 2.0]}, [Inner((1,), 1.0)], (2, 3.5), Inner())
    data = record.to_dict()
    assert data["parts"] == [{"sizes": [1], "scale": 1.0}]
    assert Measured.from_dict(data) == record
    import json
    assert Measured.from_dict(json.loads(json.dumps(data))) == record  # int keys come back


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown fields \['oops'\]"):
        Inner.from_dict({"oops": 1})


def test_launch_checks_before_any_process_starts() -> None:
    with pytest.raises(ValueError, match="needs nproc"):
        launch(Example())
    with pytest.raises(ValueError, match=r"nproc=0; valid: an integer >= 1"):
        launch(Example(), nproc=0)


def run_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(helpers.runs.__path__, "helpers.runs.")]


def configs() -> list[type[RunConfig]]:
    found = []
    for name in run_modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, RunConfig)
                    and value is not RunConfig and value.__module__ == name):
                found.append(value)
    return found


def entry_points() -> list[str]:
    """Every module of helpers with a ``__main__`` block."""
    found = []
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        body = ast.parse(path.read_text()).body
        if any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in body):
            found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


def test_every_run_config_describes_every_flag() -> None:
    found = configs()
    assert len(found) >= 6, [c.__name__ for c in found]
    for config in found:
        parser = config.parser()  # raises on a field without help
        for action in parser._actions:
            assert action.help, (config.__name__, action.dest)


@pytest.mark.parametrize("module", entry_points())
def test_every_entry_point_exits_one_way(module: str) -> None:
    """Each ``__main__`` block ends through ``serve`` or ``run_worker`` (``os._exit`` after a
    flush), never through the interpreter's teardown."""
    path = ROOT / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    main_blocks = [n for n in tree.body if isinstance(n, ast.If)
                   and "__main__" in ast.unparse(n.test)]
    assert len(main_blocks) == 1
    calls = {ast.unparse(c.func) for c in ast.walk(main_blocks[0]) if isinstance(c, ast.Call)}
    assert calls & {"serve", "run_worker"}, f"{module} ends through {sorted(calls)}"


HELP_MODULES = [m for m in entry_points() if m.startswith("helpers.runs.")] + ["helpers.tp_demo"]
# One interpreter imports torch once, then forks a child per module that runs it as
# ``python -m module --help`` would (runpy, as __main__), its output on a pipe: each child
# ends through the module's own exit path, without paying torch's import again.
_HELP_ALL = """
import json, os, runpy, sys
import torch  # noqa: F401 (imported once, before the forks)
found = {}
for module in sys.argv[1:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(write, 1)
        os.dup2(write, 2)
        sys.argv = [module, "--help"]
        code = 0
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    found[module] = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), text]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, tuple[int, str]]:
    """Each entry point's ``--help``: (exit code, output)."""
    import json

    out = subprocess.run([sys.executable, "-c", _HELP_ALL, *HELP_MODULES], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    return {m: tuple(v) for m, v in json.loads(out.stdout.splitlines()[-1]).items()}


@pytest.mark.parametrize("module", HELP_MODULES)
def test_every_entry_point_help_lists_its_flags(module: str, helps) -> None:
    code, stdout = helps[module]
    assert code == 0, stdout
    lines = [ln for ln in stdout.splitlines() if ln.strip().startswith("--")]
    assert lines, stdout
    undescribed = [ln for ln in lines if len(ln.split()) < 2 and "--help" not in ln]
    # argparse puts a long flag's help on the next line: check each flag has text after it
    text = stdout
    for ln in undescribed:
        following = text.split(ln, 1)[1].splitlines()[1:2]
        assert following and following[0].startswith(" " * 10), f"{module}: {ln.strip()}"
