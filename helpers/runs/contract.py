"""The one contract between a lesson and its ``torchrun`` worker, in code.

A lesson builds a typed config (a :class:`RunConfig`), calls :func:`launch`, and gets a
typed result (a :class:`Record`) back; every verdict is decided once, in the result's
own module, where its tolerance is named. On the worker's side :func:`serve` is the one
way to start (parse the flags, join the process group), report (rank 0 writes its
result) and exit (without the interpreter's teardown: see :func:`run_worker`)::

    # helpers/runs/<lesson>/config.py
    @dataclass(frozen=True)
    class MyConfig(RunConfig):
        WORKER: ClassVar[str] = "helpers.runs.<lesson>.worker"
        steps: int = option(3, "training steps")

    # helpers/runs/<lesson>/worker.py
    def main(config: MyConfig, rank: Rank) -> MyResult: ...
    if __name__ == "__main__":
        serve(MyConfig, main)

    # the notebook
    result = launch(MyConfig(steps=5), nproc=2)
"""

from __future__ import annotations

import importlib
import sys
import traceback
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import fields, is_dataclass, replace
from typing import Any, ClassVar, NoReturn, TypeVar

from helpers.core.devices import check_gpu_ranks
from helpers.core.errors import TutorialError
from helpers.core.flags import flags_of, hints, parse, parser_for
from helpers.profiles import Profile
from helpers.torchrun import launcher, multinode
from helpers.torchrun.ranks import Rank, exit_worker, process_group, write_result

R = TypeVar("R", bound="Record")
C = TypeVar("C", bound="RunConfig")


def _load(kind: Any, value: Any) -> Any:
    """``value`` read from JSON as the type ``kind`` (records, lists, tuples, dicts)."""
    if value is None:
        return None
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        return _load(options[0], value) if len(options) == 1 else value
    if is_dataclass(kind):
        return kind.from_dict(value) if hasattr(kind, "from_dict") else _record(kind, value)
    args = typing.get_args(kind)
    if origin is list:
        return [_load(args[0], v) for v in value]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_load(args[0], v) for v in value)
        return tuple(_load(a, v) for a, v in zip(args, value, strict=True))
    if origin is dict:
        key = args[0]
        return {key(k) if key in (int, float) else k: _load(args[1], v) for k, v in value.items()}
    if kind is float and isinstance(value, int):
        return float(value)
    return value


def _record(cls: type, data: dict) -> Any:
    """A dataclass ``cls`` from its dict, field by field; unknown keys are an error."""
    known = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {unknown}; valid: {sorted(known)}")
    kinds = hints(cls)
    return cls(**{k: _load(kinds[k], v) for k, v in data.items()})


def _dump(value: Any) -> Any:
    """``value`` as JSON-ready data (records by field, tuples as lists)."""
    if is_dataclass(value) and not isinstance(value, type):
        if (not isinstance(value, Record) and hasattr(value, "as_dict")
                and hasattr(type(value), "from_dict")):
            return _dump(value.as_dict())  # read back by its own from_dict (a Ledger, say)
        return {f.name: _dump(getattr(value, f.name)) for f in fields(value) if f.init}
    if isinstance(value, (list, tuple)):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


class Record:
    """A dataclass that is its own JSON: ``to_dict``/``from_dict`` follow from its fields,
    nested records, lists, tuples and dicts of them included."""

    def to_dict(self) -> dict:
        """This record as JSON-ready data."""
        return _dump(self)

    @classmethod
    def from_dict(cls: type[R], data: dict) -> R:
        """The inverse of :meth:`to_dict`."""
        return _record(cls, data)


class RunConfig(Record):
    """What one launch runs. A subclass is a frozen dataclass whose fields are declared
    with :func:`helpers.core.flags.option` (each flag's ``--help``) and sets ``WORKER``,
    the module ``torchrun`` starts. The result type is the worker's ``main``'s return
    annotation, found from ``WORKER`` (:meth:`result_type`)."""

    WORKER: ClassVar[str]

    @classmethod
    def for_profile(cls: type[C], profile: Profile, **changes: Any) -> C:
        """The lesson's launch for ``profile`` (a subclass reads its sizes from it)."""
        return cls(**changes)

    def ranks(self) -> int:
        """How many processes the run needs when the caller does not say."""
        raise ValueError(f"{type(self).__name__} needs nproc=...: how many ranks to launch")

    def validate(self: C, world_size: int) -> C:
        """``self`` if it can run on ``world_size`` ranks, else a ValueError naming the bad
        choice and the valid ones."""
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size={world_size!r}; valid: an integer >= 1")
        return self

    def before_launch(self, world_size: int) -> None:
        """Checks that need this machine (GPUs, files), made before any process starts."""
        check_gpu_ranks(getattr(self, "device", "cpu"), world_size)

    def args(self) -> list[str]:
        """The worker's command line: every field as its flag."""
        return flags_of(self)

    @classmethod
    def parser(cls):
        """The worker's argument parser (its ``--help`` describes every flag)."""
        return parser_for(cls, f"torchrun --nproc-per-node=N -m {cls.WORKER}",
                          (cls.__doc__ or "").strip().splitlines()[0])

    @classmethod
    def from_args(cls: type[C], argv: Sequence[str] | None = None) -> C:
        """The inverse of :meth:`args`."""
        return parse(cls, f"torchrun --nproc-per-node=N -m {cls.WORKER}", argv,
                     (cls.__doc__ or "").strip().splitlines()[0])

    def read_result(self, data: dict) -> Record:
        """Rank 0's data as the result of this run; a config whose worker returns one of
        several result types (``main(...) -> A | B``) overrides it to say which."""
        return self.result_type().from_dict(data)

    @classmethod
    def result_type(cls) -> type[Record]:
        """The worker's result type: the return annotation of ``WORKER``'s ``main``."""
        main = importlib.import_module(cls.WORKER).main
        kind = typing.get_type_hints(main)["return"]
        options = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
        return options[0]


def launch(config: RunConfig, *, nproc: int | None = None, nnodes: int = 1,
           timeout: float = 300.0, restarts: int = 0, **launcher_options: Any) -> Any:
    """Run ``config`` under ``torchrun`` and return rank 0's typed result.

    ``nproc``: ranks per node (default: ``config.ranks()``); ``nnodes > 1`` starts one
    torchrun agent per node on this machine (``helpers.torchrun.multinode``; a result with
    a ``node_commands`` field gets the command each node's operator would type);
    ``restarts``: how often torchrun restarts every rank after one fails. Every choice is
    checked here first, so a bad one fails before any process starts.
    """
    per_node = config.ranks() if nproc is None else nproc
    if not isinstance(per_node, int) or per_node < 1:
        raise ValueError(f"nproc={per_node!r}; valid: an integer >= 1")
    if not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(f"nnodes={nnodes!r}; valid: an integer >= 1")
    if nnodes > 1 and restarts:
        raise ValueError(f"restarts={restarts} with nnodes={nnodes}; valid: restarts=0 on "
                         "several nodes (each node's agent would restart only its own ranks)")
    world = per_node * nnodes
    config.validate(world)
    config.before_launch(world)
    if nnodes == 1:
        data = launcher.run_module(config.WORKER, config.args(), nproc=per_node, timeout=timeout,
                               restarts=restarts, **launcher_options)
    else:
        data = multinode.launch_nodes(config.WORKER, config.args(), nnodes=nnodes,
                                      nproc_per_node=per_node, timeout=timeout,
                                      **launcher_options)
        commands = tuple(data.pop("node_commands"))
        result = config.read_result(data)
        if "node_commands" in {f.name for f in fields(result)}:  # each node's command, typed
            result = replace(result, node_commands=commands)
        return result
    return config.read_result(data)


def run_worker(module: str, body: Callable[[], int | None]) -> NoReturn:
    """Run a worker's body and end the process; the one way every entry point exits.

    The body's own failures and bad arguments end in one line on stderr (exit code 1),
    any other exception in its traceback (exit code 1), argparse's exits in their code.
    The process then leaves with ``os._exit`` after flushing its output, never through
    the interpreter's teardown (``exit_worker``). By then the body has destroyed its
    process group and rank 0 has written its result, so a teardown would only cost time
    (about a second per rank with torch imported; torchrun waits for every rank) and
    risk a crash after the work is done: while Python finalizes, a torch C++ thread that
    takes the GIL (to free a tensor with a Python reference, say) is ended with
    ``pthread_exit``, whose unwinding through a destructor calls ``std::terminate``:
    "terminate called without an active exception" (pytorch/pytorch#38228, #190489).
    """
    try:
        code = body() or 0
    except (TutorialError, ValueError) as error:
        print(f"{module}: error: {error}", file=sys.stderr, flush=True)
        code = 1
    except SystemExit as stop:  # argparse: --help (0), a bad flag (2)
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in full, then the one exit path
        traceback.print_exc()
        code = 1
    exit_worker(code)


def serve(config_type: type[C], main: Callable[[C, Rank], Record | None],
          argv: Sequence[str] | None = None) -> NoReturn:
    """A torchrun worker's entry point: flags to config, join the process group, run
    ``main`` on every rank, rank 0 writes its result for the launcher, exit."""

    def body() -> int:
        config = config_type.from_args(argv)
        with process_group(config_type.WORKER, device=getattr(config, "device", "auto"),
                           backend=getattr(config, "backend", "auto")) as rank:
            config.validate(rank.world_size)  # on every rank, before any step
            result = main(config, rank)
            if result is not None:
                write_result(rank, result.to_dict())
        return 0

    run_worker(config_type.WORKER, body)

