"""Running the steps: the budget rule, one record per step, errors kept, SIGTERM as an exit.

A failing step is recorded with its error and the others still run; a step is not started
when the elapsed time plus its estimate would exceed the budget.
"""

from __future__ import annotations

import signal
import time
import traceback
from collections.abc import Callable, Sequence

from course_tools.gpu_check.context import Step, StepSkipped

DEFAULT_BUDGET_S = 420.0

Execute = Callable[[Step, dict], None]
Report = Callable[[list[dict], str | None], None]


def run_step(
    step: Step, execute: Execute, clock: Callable[[], float] = time.monotonic, smoke: bool = False
) -> dict:
    """Run one step; its record: status ok, skipped (with reason) or failed (with error)."""
    figures: dict = {}
    start = clock()
    record: dict = {"name": step.name, "summary": step.summary, "status": "ok"}
    try:
        execute(step, figures)
    except StepSkipped as skip:
        record.update(status="skipped", reason=str(skip))
    except Exception as error:  # a failing step is recorded; the others still run
        lines = traceback.format_exception(type(error), error, error.__traceback__)
        record.update(
            status="failed",
            error={
                "type": type(error).__name__,
                "message": str(error)[-2000:],
                "traceback": "".join(lines).splitlines()[-12:],
            },
        )
    record["seconds"] = round(clock() - start, 3)
    record["estimate_s"] = step.estimate(smoke)
    record["figures"] = figures
    return record


def budget_skip(step: Step, smoke: bool) -> dict:
    """The record of a step not started because the budget would be exceeded."""
    return {
        "name": step.name,
        "summary": step.summary,
        "status": "skipped",
        "reason": "budget",
        "seconds": 0.0,
        "estimate_s": step.estimate(smoke),
        "figures": {},
    }


def _print_outcome(record: dict) -> None:
    print(f"   {record['name']}: {record['status']} in {record['seconds']:.1f} s", flush=True)
    if record["status"] == "skipped":
        print(f"   reason: {record['reason']}", flush=True)
    if record["status"] == "failed":
        print(f"   {record['error']['type']}: {record['error']['message'][:500]}", flush=True)


def run_steps(
    steps: Sequence[Step],
    execute: Execute,
    *,
    budget: float,
    smoke: bool = False,
    clock: Callable[[], float] = time.monotonic,
    started: float | None = None,
    report: Report | None = None,
) -> list[dict]:
    """Run ``steps`` in order; once elapsed + estimate exceeds ``budget``, skip the rest.

    Elapsed time counts from ``started`` (a ``clock()`` reading; default: now).
    """
    start, records = clock() if started is None else started, []
    for i, step in enumerate(steps):
        estimate, elapsed = step.estimate(smoke), clock() - start
        print(
            f"\n== [{i + 1}/{len(steps)}] {step.name}: estimated {estimate:.0f} s "
            f"(elapsed {elapsed:.0f} s of a {budget:.0f} s budget)",
            flush=True,
        )
        if elapsed + estimate > budget:
            print(f"   not started: {elapsed:.0f} + {estimate:.0f} s > budget; the rest skipped")
            records += [budget_skip(s, smoke) for s in steps[i:]]
            break
        if report:
            report(records, step.name)
        record = run_step(step, execute, clock, smoke)
        records.append(record)
        _print_outcome(record)
        if report:
            report(records, None)
    if report:
        report(records, None)
    return records


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (from ``timeout``) as an exception, so running launches kill their ranks."""
    raise SystemExit(128 + signum)


def run_reported(
    steps: Sequence[Step],
    execute: Execute,
    doc: dict,
    write: Report,
    *,
    budget: float,
    smoke: bool,
    started: float,
) -> list[dict]:
    """``run_steps`` with SIGTERM as SystemExit; an interrupted run is reported, then re-raised."""
    signal.signal(signal.SIGTERM, _terminated)  # a timeout: launched ranks are killed too
    try:
        records = run_steps(
            steps, execute, budget=budget, smoke=smoke, started=started, report=write
        )
    except (KeyboardInterrupt, SystemExit) as stop:
        doc["interrupted"] = f"{type(stop).__name__} during {doc['running']}"
        write(doc["steps"], doc["running"])
        raise
    doc["finished"] = True
    write(records, None)
    return records
