"""The report of ``make gpu-check``: one JSON document and its Markdown, rewritten atomically.

Both files are rewritten after every step, so a run cut short by a timeout still leaves
every finished step on disk.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from helpers.core.files import atomic_write_json, atomic_write_text

COMMAND = "python -m course_tools.gpu_check"


def new_doc(*, smoke: bool, budget: float, argv: Sequence[str]) -> dict:
    """The report's frame: mode, command, budget, and what is known of the machine before step 1."""
    return {
        "mode": "smoke" if smoke else "full",
        "command": " ".join([COMMAND, *argv]),
        "budget_s": budget,
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "elapsed_s": 0.0,
        "finished": False,
        "running": None,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "steps": [],
    }


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


def _figure_lines(figures: dict, indent: str = "") -> list[str]:
    lines = []
    for key, value in figures.items():
        if isinstance(value, dict) and value:
            lines.append(f"{indent}- {key}:")
            lines += _figure_lines(value, indent + "  ")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines.append(f"{indent}- {key}:")
            lines += [
                f"{indent}  - {', '.join(f'{k}: {_fmt(v)}' for k, v in row.items())}"
                for row in value
            ]
        else:
            lines.append(f"{indent}- {key}: {_fmt(value)}")
    return lines


def markdown(doc: dict) -> str:
    """The run as Markdown: machine, a table of steps, then each step's figures."""
    machine = doc["machine"]
    lines = [
        f"### GPU check ({doc['mode']}), {doc['started']}",
        "",
        f"Machine: {machine.get('description', 'not read yet')}; driver "
        f"{machine.get('driver', '?')}, CUDA {machine.get('cuda')}, NCCL {machine.get('nccl')}, "
        f"python {machine.get('python')}",
        f"Command: `{doc['command']}`; budget {doc['budget_s']:.0f} s; "
        f"elapsed {doc['elapsed_s']:.0f} s; "
        + ("finished" if doc["finished"] else "unfinished")
        + (f" (running: {doc['running']})" if doc["running"] else "")
        + (f"; interrupted: {doc['interrupted']}" if doc.get("interrupted") else ""),
        "",
        "| step | status | seconds | estimate | note |",
        "|---|---|---|---|---|",
    ]
    for r in doc["steps"]:
        note = r.get("reason") or (
            f"{r['error']['type']}: {r['error']['message']}"[:160] if "error" in r else ""
        )
        note = note.replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {r['name']} | {r['status']} | {r['seconds']:.1f} | {r['estimate_s']:.0f} | {note} |"
        )
    for r in doc["steps"]:
        lines += ["", f"#### {r['name']}: {r['status']}", "", r["summary"], ""]
        lines += _figure_lines(r["figures"])
        if "error" in r:
            lines += ["", "```", *r["error"]["traceback"], "```"]
    return "\n".join(lines) + "\n"


def report_writer(
    json_path: Path, md_path: Path, doc: dict, started: float | None = None
) -> Callable[[list[dict], str | None], None]:
    """A callback rewriting both files atomically with the records so far."""
    start = time.monotonic() if started is None else started

    def write(records: list[dict], running: str | None) -> None:
        doc.update(steps=records, running=running, elapsed_s=round(time.monotonic() - start, 1))
        atomic_write_json(json_path, doc)
        atomic_write_text(md_path, markdown(doc))

    return write
