"""A dataclass as a command line: one described ``--flag`` per field, and back.

Every torchrun worker takes a typed config; these functions make its flags, so that
``parse(Config, prog, flags_of(config)) == config`` holds by construction and ``--help`` describes
every flag. A field says what it is with :func:`option`::

    hidden: int = option(64, "model width (features per position)")

A field whose type is itself such a dataclass (the small Llama's ``LMConfig``, say) gives
one flag per field of its own, prefixed with the field's name: ``--lm-hidden``.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, field, fields, is_dataclass
from typing import Any, Literal


def option(default: Any = MISSING, help: str = "", **kwargs: Any) -> Any:
    """A dataclass field with the ``--help`` line of its flag."""
    if not help:
        raise ValueError("option(...) needs help: the sentence --help shows for the flag")
    if isinstance(default, (list, dict, set)):
        raise TypeError(f"default {default!r} is mutable; use a tuple")
    return field(default=default, metadata={"help": help}, **kwargs)


def flag(name: str) -> str:
    """``--kv-heads`` for the field ``kv_heads``."""
    return "--" + name.replace("_", "-")


def hints(cls: type) -> dict[str, Any]:
    """The resolved type of each field of the dataclass ``cls``."""
    return typing.get_type_hints(cls)


def _unwrap(kind: Any) -> tuple[Any, bool]:
    """(the type without ``| None``, whether None is allowed)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return kind, False


def _converter(kind: Any, optional: bool):
    """The function that turns one flag's text into the field's value."""
    origin = typing.get_origin(kind)
    if origin is tuple:
        item = typing.get_args(kind)[0]
        if typing.get_origin(item) is tuple:  # items that are tuples: "a:1,b:2"
            item = _pair_converter(typing.get_args(item))

        def items(text: str) -> tuple:
            return tuple(item(v) for v in text.split(",") if v.strip())
        convert = items
    elif origin is Literal:
        choices = typing.get_args(kind)
        convert = type(choices[0])
    elif kind in (int, float, str):
        convert = kind
    else:
        raise TypeError(f"a flag cannot hold a {kind!r}; valid: int, float, str, bool, "
                        "tuple[...], Literal[...], X | None, or a dataclass of these")
    if not optional:
        return convert
    return lambda text: None if text == "none" else convert(text)


def _pair_converter(kinds: tuple) -> Any:
    """One item of a tuple of tuples, ``"gpipe:4"`` for ``tuple[str, int]``."""
    def pair(text: str) -> tuple:
        values = text.split(":")
        try:
            if len(values) != len(kinds):
                raise ValueError
            return tuple(k(v) for k, v in zip(kinds, values, strict=True))
        except ValueError:
            form = ":".join(k.__name__ for k in kinds)
            raise argparse.ArgumentTypeError(
                f"{text!r}; valid: items of the form {form}, joined by ','") from None
    return pair


def _text(value: Any) -> str:
    """A value as its flag's text (the inverse of ``_converter``)."""
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(":".join(map(str, v)) if isinstance(v, tuple) else str(v)
                        for v in value)
    return str(value)


def _walk(cls: type, prefix: str = "", defaults: Any = None
          ) -> Iterable[tuple[str, str, Any, Any]]:
    """(dotted name, help, type, default) of every leaf field, nested dataclasses flattened;
    a nested field's defaults are those of its parent's default instance when it has one."""
    resolved = hints(cls)
    for f in fields(cls):
        kind = resolved[f.name]
        if defaults is not None:
            default = getattr(defaults, f.name)
        elif f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = MISSING
        if is_dataclass(kind):
            yield from _walk(kind, f"{prefix}{f.name}.",
                             None if default is MISSING else default)
        else:
            yield prefix + f.name, f.metadata.get("help", ""), kind, default


def parser_for(cls: type, prog: str, description: str | None = None) -> argparse.ArgumentParser:
    """One described option per field of the dataclass ``cls``; a ``bool`` is a switch."""
    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for name, text, kind, default in _walk(cls):
        if not text:
            raise TypeError(f"{cls.__name__}.{name} has no help; declare it with option()")
        dest, opt = name.replace(".", "__"), flag(name.replace(".", "_"))
        metavar = name.replace(".", "_").upper()
        kind, optional = _unwrap(kind)
        required = default is MISSING
        default = None if required else default
        if kind is bool:
            p.add_argument(opt, action=argparse.BooleanOptionalAction, default=default,
                           dest=dest, help=text, required=required)
            continue
        choices = typing.get_args(kind) if typing.get_origin(kind) is Literal else None
        p.add_argument(opt, type=_converter(kind, optional), default=default, dest=dest,
                       choices=choices, required=required, help=text,
                       metavar=None if choices else metavar)
    return p


def flags_of(config: object, *, always: Iterable[str] | None = None) -> list[str]:
    """The command line of ``config``: the fields in ``always`` (all when None) and every
    field that differs from its default. Nested dataclasses give all their fields."""
    keep = None if always is None else set(always)
    out: list[str] = []
    for name, _, _, default in _walk(type(config)):
        value = config
        for part in name.split("."):
            value = getattr(value, part)
        nested = "." in name
        if not nested and keep is not None and name not in keep and value == default:
            continue
        opt = flag(name.replace(".", "_"))
        if isinstance(value, bool):
            out.append(opt if value else "--no-" + opt[2:])
        else:
            out += [opt, _text(value)]
    return out


def build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """``cls`` from the parser's flat values (``lm__hidden`` is ``lm.hidden``)."""
    resolved = hints(cls)
    kwargs = {}
    for f in fields(cls):
        kind = resolved[f.name]
        key = prefix + f.name
        kwargs[f.name] = build(kind, values, key + "__") if is_dataclass(kind) else values[key]
    return cls(**kwargs)


def parse(cls: type, prog: str, argv: Sequence[str] | None = None,
          description: str | None = None) -> Any:
    """``cls`` built from the command line ``argv`` (``sys.argv`` when None)."""
    return build(cls, vars(parser_for(cls, prog, description).parse_args(argv)))


def require_ints(config: object, least: dict[str, int], *, as_flags: bool = True) -> None:
    """Raise ValueError naming the first field of ``config`` in ``least`` that is not an
    integer (a bool is not) at least its bound: ``--name 0; valid: an integer >= 1`` (or
    ``name=0; ...`` when ``as_flags`` is False)."""
    for name, bound in least.items():
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < bound:
            shown = f"{flag(name)} {value!r}" if as_flags else f"{name}={value!r}"
            raise ValueError(f"{shown}; valid: an integer >= {bound}")
