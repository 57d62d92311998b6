"""A dataclass as a command line: one ``--flag`` per field, and back.

The torchrun workers take a typed config; these two functions make its flags, so that
``Config.from_args(config.args()) == config`` holds by construction.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from dataclasses import fields

_TYPES = {"int": int, "float": float, "str": str, "int | None": int, "float | None": float}


def flag(name: str) -> str:
    """``--kv-heads`` for the field ``kv_heads``."""
    return "--" + name.replace("_", "-")


def parser_for(cls: type, prog: str, description: str | None = None) -> argparse.ArgumentParser:
    """One option per field of the dataclass ``cls``; a ``bool`` field is a switch."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    for f in fields(cls):
        if f.type in ("bool", bool):
            p.add_argument(flag(f.name), action="store_true", dest=f.name)
        else:
            kind = _TYPES.get(f.type, f.type) if isinstance(f.type, str) else f.type
            p.add_argument(flag(f.name), type=kind, default=f.default, dest=f.name)
    return p


def flags_of(config: object, *, always: Iterable[str] | None = None) -> list[str]:
    """The command line of ``config``: the fields in ``always`` (all when None) and every
    field that differs from its default; a true ``bool`` is its bare switch."""
    keep = None if always is None else set(always)
    out: list[str] = []
    for f in fields(config):
        value = getattr(config, f.name)
        if keep is not None and f.name not in keep and value == f.default:
            continue
        if isinstance(value, bool):
            out += [flag(f.name)] if value else []
        else:
            out += [flag(f.name), str(value)]
    return out


def parse(cls: type, prog: str, argv: Sequence[str] | None = None,
          description: str | None = None) -> object:
    """``cls`` built from the command line ``argv`` (``sys.argv`` when None)."""
    return cls(**vars(parser_for(cls, prog, description).parse_args(argv)))
