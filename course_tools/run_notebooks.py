"""Execute the lessons headless, in order (``make run``, ``make refresh``).

``python -m course_tools.run_notebooks`` writes each executed lesson to results/;
``--in-place`` rewrites the stored outputs in notebooks/ that nbval compares.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from tqdm import tqdm

from helpers.core.devices import machine_info
from helpers.core.files import atomic_write_text
from helpers.core.paths import NOTEBOOKS_DIR, RESULTS_DIR, display_path
from helpers.core.timing import PROGRESS_ENV
from helpers.profiles import resolve_name

# What JupyterLab writes into a notebook it opens when the notebook lacks it: stored with
# every lesson, so that opening one does not mark it modified.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def with_lab_metadata(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with the kernelspec JupyterLab would add (language_info comes from the
    kernel that executed it)."""
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    return nb


def is_lesson(path: Path) -> bool:
    """A stored lesson, not a failed run's copy nor a learner's own (``*.mine.ipynb``)."""
    return not any(part in path.name for part in (".failed", ".mine."))


def lessons(only: list[str] | None = None) -> list[Path]:
    """The lesson notebooks in teaching order, optionally those whose name starts with ``only``."""
    found = sorted(p for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb") if is_lesson(p))
    if only:
        chosen = [p for p in found if any(p.name.startswith(o) for o in only)]
        if not chosen:
            names = ", ".join(p.stem for p in found)
            raise ValueError(f"no lesson matches {only}; valid: a prefix of {names}")
        return chosen
    return found


def execute(path: Path, out_path: Path, timeout: int) -> float:
    """Execute one notebook with its folder as working directory; write it atomically."""
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    bar = tqdm(total=len(cells), desc=path.stem, unit="cell", leave=False)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
        on_cell_executed=lambda **_: bar.update(1),
    )
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError:
        failed = RESULTS_DIR / f"{path.stem}.failed.ipynb"  # never beside the lessons
        atomic_write_text(failed, nbformat.writes(nb))
        print(
            f"\n{path.name} failed; the executed part is in {display_path(failed)}", file=sys.stderr
        )
        raise
    finally:
        bar.close()
    atomic_write_text(out_path, nbformat.writes(with_lab_metadata(nb)))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--in-place", action="store_true", help="rewrite notebooks/ (nbval's reference)"
    )
    parser.add_argument("--only", nargs="*", help="lesson prefixes to run, e.g. 01 03")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = parser.parse_args(argv)

    os.environ[PROGRESS_ENV] = "final"  # the kernels inherit it: no progress-bar redraws stored
    try:
        profile = resolve_name()
        paths = lessons(args.only)
    except ValueError as error:  # a mistyped TUTORIAL_PROFILE or --only: one line, no traceback
        parser.error(str(error))
    print(f"Executing {len(paths)} lesson(s), profile '{profile}'; {machine_info().describe()}")
    start = time.time()
    for i, path in enumerate(paths, 1):
        out = path if args.in_place else RESULTS_DIR / path.name
        print(f"[{i}/{len(paths)}] {path.name} ...", flush=True)
        try:
            seconds = execute(path, out, args.timeout)
        except CellExecutionError as error:
            print(str(error)[-3000:], file=sys.stderr)
            return 1
        print(
            f"[{i}/{len(paths)}] {path.name} done in {seconds:.1f} s -> {display_path(out)}",
            flush=True,
        )
    figures = sorted(p for p in RESULTS_DIR.glob("*.png") if p.stat().st_mtime >= start)
    print("\nSummary")
    print(f"  notebooks run : {len(paths)} in {time.time() - start:.0f} s")
    print(f"  figures       : {', '.join(display_path(p) for p in figures) or 'none'}")
    print(f"  profile       : {profile}")
    print(f"  machine       : {machine_info().describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
