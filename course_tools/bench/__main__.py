"""``make bench``: the series' measurements without notebooks, written to results/bench.json.

Each section is measured within one run, so its ratios compare like with like. With
``--only`` the other sections already in bench.json are kept.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from collections.abc import Callable

from helpers.core.devices import machine_info
from helpers.core.files import atomic_write_json
from helpers.core.paths import display_path, results_path


def _pipeline() -> dict:
    from course_tools.bench.sections import pipeline_section  # lesson 03

    return pipeline_section()


def _tp() -> dict:
    from course_tools.bench.sections import tp_section  # lesson 08

    return tp_section()


def _schedules() -> dict:
    from course_tools.bench.sections import schedules_section  # lesson 04

    return schedules_section()


def _data_parallel() -> dict:
    from course_tools.bench.data_parallel import data_parallel_section  # lesson 06

    return data_parallel_section()


def _transformer_tp() -> dict:
    from course_tools.bench.transformer_tp import transformer_tp_section  # lesson 09

    return transformer_tp_section()


def _context_parallel() -> dict:
    from course_tools.bench.context_parallel import context_parallel_section  # lesson 10

    return context_parallel_section()


def _expert_parallel() -> dict:
    from course_tools.bench.expert_parallel import expert_parallel_section  # lesson 11

    return expert_parallel_section()


def _memory() -> dict:
    from course_tools.bench.memory import memory_section  # lessons 01-08's ledgers

    return memory_section()


SECTIONS: dict[str, Callable[[], dict]] = {
    "pipeline": _pipeline, "schedules": _schedules, "data_parallel": _data_parallel, "tp": _tp,
    "transformer_tp": _transformer_tp, "context_parallel": _context_parallel,
    "expert_parallel": _expert_parallel, "memory": _memory,
}


def load_existing(path) -> dict:
    """The current bench.json, or {} when absent; a corrupt file is reported and replaced."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("top level is not an object")
        return data
    except (ValueError, OSError) as error:
        print(
            f"warning: {display_path(path)} is unreadable ({error}); writing a new one",
            file=sys.stderr,
        )
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="+", choices=sorted(SECTIONS), help="sections to run")
    args = parser.parse_args(argv)
    path = results_path("bench.json")
    data = load_existing(path) if args.only else {}
    info = machine_info()
    data["machine"] = {
        "description": info.describe(),
        "cpu_cores": info.cpu_cores,
        "gpus": info.gpu_names,
        "torch": info.torch_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    for name in args.only or SECTIONS:
        print(f"== {name}", flush=True)
        data[name] = SECTIONS[name]()
        atomic_write_json(path, data)  # each finished section is kept even if a later one fails
        print(
            json.dumps(
                {k: v for k, v in data[name].items() if not isinstance(v, list | dict)}, indent=2
            )
        )
    print(f"wrote {display_path(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
