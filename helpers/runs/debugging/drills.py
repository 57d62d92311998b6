"""The hang drills from the lesson's side: one launch, then its evidence read and diagnosed.

:func:`run_drills` launches the drills under ``torchrun`` (the Flight Recorder on), waits
for the launch to end (the ranks' watchdogs, else the launcher's timeout, kill it), checks
that none of its processes is left, reads every rank's dump and evidence, and diagnoses
each drill's process group (:func:`helpers.debugging.hangs.diagnose`). PyTorch's own
analyzer is run on the same dumps by :func:`analyzer_report`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pickle
import shutil
import time
from pathlib import Path

from helpers.core.errors import LaunchError
from helpers.core.files import atomic_write_bytes
from helpers.debugging.hangs import FlightRecordError, diagnose, read_dump, repaired_for_analyzer
from helpers.runs.debugging.config import DrillConfig
from helpers.runs.debugging.results import DrillOutcome, DrillRun, RankEvidence
from helpers.torchrun import launcher

FR_BUFFER = "2000"


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def read_evidence(out: Path, world_size: int) -> list[RankEvidence]:
    """Every rank's evidence file, checked to be there."""
    missing = [r for r in range(world_size) if not (out / f"rank_{r}.json").is_file()]
    if missing:
        raise FlightRecordError(f"ranks {missing} wrote no evidence in {out}: they were "
                                "killed before their watchdog fired (raise the launch's "
                                "timeout, or lower --hang-seconds)")
    return [RankEvidence.from_dict(json.loads((out / f"rank_{r}.json").read_text()))
            for r in range(world_size)]


def run_drills(config: DrillConfig, *, timeout: float = 60.0, nproc: int | None = None,
               detail: bool = False) -> DrillRun:
    """Launch ``config``'s drills and diagnose each from the ranks' Flight Recorder dumps.
    ``detail`` launches with ``TORCH_DISTRIBUTED_DEBUG=DETAIL``."""
    world = config.ranks() if nproc is None else nproc
    config.validate(world)
    if timeout < config.hang_seconds + 5:
        raise ValueError(f"timeout={timeout:g} s leaves the ranks too little time to start "
                         f"and hang for --hang-seconds {config.hang_seconds:g}; valid: "
                         f"timeout >= {config.hang_seconds + 5:g} s")
    out = Path(config.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {"TORCH_FR_BUFFER_SIZE": FR_BUFFER,
           "TORCH_DISTRIBUTED_DEBUG": "DETAIL" if detail else "OFF"}
    start = time.monotonic()
    try:
        launcher.run_module(config.WORKER, config.args(), nproc=world, timeout=timeout,
                            log_dir=out / "logs", env=env)
        ended = "every rank finished"
    except LaunchError as error:
        ended = str(error).splitlines()[0]
    evidence = read_evidence(out, world)
    left = [e.pid for e in evidence if alive(e.pid)]
    seconds = time.monotonic() - start
    dumps = dict(read_dump(out / f"fr_{r}") for r in range(world))
    outcomes = []
    for drill in config.drills:
        group = evidence[0].groups[drill]
        outcomes.append(DrillOutcome(
            drill, config.culprit, None if config.tools else diagnose(dumps, group),
            {e.rank: e.stacks[drill] for e in evidence if e.stacks.get(drill)},
            {e.rank: e.errors[drill] for e in evidence if drill in e.errors}))
    return DrillRun(outcomes, ended, seconds, left, evidence)


def run_analyzer(folder: str | Path) -> tuple[str, str]:
    """PyTorch's Flight Recorder analyzer (``fr_trace``) on the dumps in ``folder``: (what it
    printed, the error it stopped with, "" if none). Everything it writes is captured,
    its own logger's too (a handler on stderr made when it is imported)."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        from torch.distributed.flight_recorder.fr_trace import main as fr_trace  # may warn
    log = logging.getLogger("Flight Recorder")
    saved, log.handlers = log.handlers, [logging.StreamHandler(text)]
    error = ""
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            fr_trace([str(folder), "--prefix", "fr_"])
    except Exception as stop:  # noqa: BLE001 - what the analyzer says is the evidence
        error = type(stop).__name__
    finally:
        log.handlers = saved
    return text.getvalue(), error


def analyzer_report(out: str | Path, world_size: int, group: str) -> str:
    """What ``fr_trace`` reports about ``group``, run on the ranks' dumps once their group
    table is repaired (:func:`repaired_for_analyzer`). It reports every group; the blocks
    about ``group`` (``group info: <name>``) are kept."""
    out = Path(out)
    repaired = out.parent / f"{out.name}_for_analyzer"  # beside: fr_trace walks subfolders
    for r in range(world_size):
        with open(out / f"fr_{r}", "rb") as f:
            dump = pickle.load(f)  # noqa: S301 - our ranks' own dumps
        atomic_write_bytes(repaired / f"fr_{r}",
                           pickle.dumps(repaired_for_analyzer(dump, world_size)))
    printed, error = run_analyzer(repaired)
    if error:
        raise FlightRecordError(f"fr_trace stopped with {error} on the repaired dumps in "
                                f"{repaired}")
    blocks, current = [], []
    for line in printed.splitlines():
        if line.startswith(("Collective sequence number", "Not all ranks joining")):
            blocks.append(current)
            current = []
        current.append(line)
    blocks.append(current)
    return "\n".join(line for block in blocks if f"group info: {group}" in block
                     for line in block)
