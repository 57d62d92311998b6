"""Lines for a notebook's output area: commands broken before a flag, messages wrapped,
JSON laid out to fit.

JupyterLab, beside its file browser, shows about 118 characters of an output line and
breaks longer ones anywhere, in the middle of a number or a path; 100 leaves a margin.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence

WIDTH = 100  # characters: a notebook output area beside JupyterLab's file browser, less a margin


def _words(words: Sequence[str]) -> list[str]:
    """The words of a command, each flag joined to the value that follows it."""
    joined: list[str] = []
    for word in words:
        last = joined[-1] if joined else ""
        if (last.startswith("-") and " " not in last and "=" not in last
                and not word.startswith("-")):
            joined[-1] = f"{last} {word}"
        else:
            joined.append(word)
    return joined


def shell_command(words: str | Sequence[str], width: int = WIDTH, prompt: str = "") -> str:
    """A command line as a shell takes it, broken before a flag (`` \\`` at each line's end)
    so that no line is wider than ``width``; ``prompt`` leads the first line."""
    parts = _words(words.split() if isinstance(words, str) else list(words))
    lines, line = [], prompt + parts[0]
    for part in parts[1:]:
        if len(line) + 1 + len(part) + 2 > width:
            lines.append(line + " \\")
            line = "    " + part
        else:
            line = f"{line} {part}"
    return "\n".join([*lines, line])


def wrapped(text: str, width: int = WIDTH, indent: str = "  ") -> str:
    """``text`` with every line wider than ``width`` broken, the continuations indented:
    at its clauses ("; ") where each fits, else between words; words (paths, numbers) are
    never broken."""
    out: list[str] = []
    for line in text.splitlines() or [""]:
        clauses = line.split("; ")
        if len(line) <= width:
            out.append(line)
        elif all(len(indent) + len(c) + 1 <= width for c in clauses):
            current = clauses[0]
            for clause in clauses[1:]:
                if len(current) + 2 + len(clause) + 1 <= width:
                    current += "; " + clause
                else:
                    out.append(current + ";")
                    current = indent + clause
            out.append(current)
        else:
            out.append(textwrap.fill(line, width, subsequent_indent=indent,
                                     break_long_words=False, break_on_hyphens=False))
    return "\n".join(out)


def json_text(value: object, width: int = WIDTH, pad: str = "", column: int = 0) -> str:
    """``value`` as JSON: a dict on one line where it fits within ``width`` (it starts at
    ``column``), else one key per line, indented by one space a level."""
    compact = json.dumps(value)
    if not isinstance(value, dict) or column + len(compact) <= width:
        return compact
    inner = pad + " "
    rows = [f"{inner}{json.dumps(k)}: " for k in value]
    rows = [row + json_text(v, width, inner, len(row)) for row, v in zip(rows, value.values(),
                                                                        strict=True)]
    return "{\n" + ",\n".join(rows) + "\n" + pad + "}"
