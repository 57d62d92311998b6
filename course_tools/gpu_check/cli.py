"""``make gpu-check``: the series' proofs and measurements on a CUDA machine, in one command.

Each step proves what its lesson proves, then measures, at the full profile's sizes; a
failing step is recorded with its error and the others still run. After every step
results/gpu_check.json and results/gpu_check.md are rewritten atomically, so a run cut
short by a timeout still leaves every finished step on disk.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

from course_tools.gpu_check.catalog import STEPS, execute
from course_tools.gpu_check.context import cuda_available, make_context
from course_tools.gpu_check.report import COMMAND, new_doc, report_writer
from course_tools.gpu_check.runner import DEFAULT_BUDGET_S, run_reported
from helpers.core.paths import RESULTS_DIR, display_path


def positive_seconds(text: str) -> float:
    """argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the budget must be > 0 seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The options, with every step and the budget rule in the help."""
    steps = "\n".join(
        textwrap.fill(
            f"{i}. {s.name} (~{s.estimate_s:.0f} s): {s.summary}",
            width=88,
            initial_indent="  ",
            subsequent_indent="     ",
        )
        for i, s in enumerate(STEPS, 1)
    )
    notes = (
        "budget: before each step its estimate is printed; a step is not started when the "
        "elapsed time plus its estimate would exceed --budget, and it and every later step are "
        "recorded as skipped with reason 'budget'. A step already running is not cut, so run it "
        "under a timeout that leaves time to rerun, e.g. `timeout 540 make gpu-check`.",
        "results: results/gpu_check.json and results/gpu_check.md (--smoke: "
        "gpu_check_smoke.json/.md), rewritten after every step; figures under results/. "
        "Exit status 1 when a step failed.",
    )
    epilog = f"steps (estimated seconds on one H200):\n{steps}\n\n" + "\n\n".join(
        textwrap.fill(n, width=88) for n in notes
    )
    ap = argparse.ArgumentParser(
        prog=COMMAND,
        description=__doc__,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--budget",
        type=positive_seconds,
        default=DEFAULT_BUDGET_S,
        help=f"seconds for the whole check (default {DEFAULT_BUDGET_S:.0f}); see below",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="rehearse: the same steps on the CPU at tiny sizes (gloo, no CUDA, one thread), "
        "about a minute on 2 cores, mostly starting launched processes; writes "
        "gpu_check_smoke.json/.md (figures in gpu_check_smoke/), never a real run's files",
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="folder for the results (default results/)"
    )
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the options, run the steps within the budget, write the report; 1 if a step failed."""
    started = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, also for every launched process
    # torch is imported from here on: after the options are read and the GPUs hidden
    if not args.smoke and not cuda_available():
        parser.error("no CUDA GPU is visible to torch; on a CPU machine run it with --smoke")
    out = Path(args.out) if args.out else RESULTS_DIR
    stem = "gpu_check_smoke" if args.smoke else "gpu_check"
    doc = new_doc(smoke=args.smoke, budget=args.budget, argv=argv)
    ctx = make_context(out, smoke=args.smoke, machine=doc["machine"])
    write = report_writer(out / f"{stem}.json", out / f"{stem}.md", doc, started)
    records = run_reported(
        STEPS, execute(ctx), doc, write, budget=args.budget, smoke=args.smoke, started=started
    )
    failed = [r["name"] for r in records if r["status"] == "failed"]
    print(f"\nwrote {display_path(out / f'{stem}.json')} and {display_path(out / f'{stem}.md')}")
    print(f"failed: {', '.join(failed)}" if failed else "no step failed")
    return 1 if failed else 0
