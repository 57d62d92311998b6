"""One rank of the hang drills: ``torchrun --nproc-per-node=3 -m helpers.runs.debugging.drill
--out results/drills`` (the Flight Recorder keeps ``TORCH_FR_BUFFER_SIZE`` entries, 2000
unless set).

Each drill runs in a thread of its own, on a process group of its own, so that four hangs
cost one launch. The main thread is the rank's watchdog, as NCCL's is: it waits
``--hang-seconds`` for the drills; if one is still waiting it writes the rank's evidence
(its Flight Recorder dump, each drill thread's Python stack, its pid), waits until every
rank has written its own, and takes the process down (exit code 1), after which torchrun
ends the other ranks. With ``--tools`` the groups time out by themselves after
``--hang-seconds`` and the drills' errors are the evidence.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from helpers.core.files import atomic_write_bytes, atomic_write_json
from helpers.debugging.hangs import DRILLS
from helpers.runs.contract import serve
from helpers.runs.debugging.config import DrillConfig
from helpers.runs.debugging.results import DrillsEnded
from helpers.torchrun.ranks import Rank, exit_worker, write_result

NEVER = 3600.0  # a drill group's timeout when the watchdog, not gloo, is to end the hang


def stack_of(thread: threading.Thread) -> list[str]:
    """The thread's Python stack, innermost last: the frames outside torch, and the
    ``torch.distributed`` call it waits in (``distributed_c10d.py ... in all_reduce``)."""
    frame = sys._current_frames().get(thread.ident)
    if frame is None:
        return []
    return [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in
            traceback.extract_stack(frame)
            if "/torch/" not in f.filename or f.filename.endswith("distributed_c10d.py")]


def run_drill(name: str, config: DrillConfig, rank: Rank, group, errors: dict) -> None:
    """One drill on this rank; its exception's first line is kept in ``errors``."""
    try:
        if name == "straggler" and config.tools:
            DRILLS[name](rank.rank, group, config.culprit, seconds=config.hang_seconds + 0.5,
                         check_seconds=config.hang_seconds)
        else:
            DRILLS[name](rank.rank, group, config.culprit)
    except Exception as error:  # noqa: BLE001 - the evidence the lesson reads
        errors[name] = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"


def all_written(rank: Rank, deadline: float) -> None:
    """Every rank's evidence is on disk (a count in torchrun's store), or ``deadline`` s."""
    store = dist.distributed_c10d._get_default_store()
    store.add("drill_evidence", 1)
    end = time.monotonic() + deadline
    while int(store.add("drill_evidence", 0)) < rank.world_size and time.monotonic() < end:
        time.sleep(0.05)


def main(config: DrillConfig, rank: Rank) -> DrillsEnded | None:
    out = Path(config.out)
    seconds = config.hang_seconds if config.tools else NEVER
    groups = {name: dist.new_group(timeout=timedelta(seconds=seconds)) for name in config.drills}
    errors: dict[str, str] = {}
    threads = {name: threading.Thread(target=run_drill, args=(name, config, rank, g, errors),
                                      name=f"drill {name}", daemon=True)
               for name, g in groups.items()}
    started = time.monotonic()
    for thread in threads.values():
        thread.start()
    deadline = started + (3 * config.hang_seconds + 5 if config.tools else config.hang_seconds)
    for thread in threads.values():
        thread.join(max(0.0, deadline - time.monotonic()))
    waiting = [n for n, t in threads.items() if t.is_alive()]
    from torch._C._distributed_c10d import _dump_fr_trace

    # (collectives, no stack traces: symbolising them takes seconds; the Python stacks
    # below say where each thread is)
    atomic_write_bytes(out / f"fr_{rank.rank}", _dump_fr_trace(True, False, False))
    atomic_write_json(out / f"rank_{rank.rank}.json", {
        "rank": rank.rank, "pid": os.getpid(), "seconds": time.monotonic() - started,
        "groups": {n: g.group_name for n, g in groups.items()},
        "stacks": {n: stack_of(threads[n]) for n in waiting},
        "errors": errors, "debug": os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF")})
    all_written(rank, deadline=10.0)
    if waiting:
        print(f"rank {rank.rank} watchdog: {', '.join(waiting)} still waiting after "
              f"{config.hang_seconds:g} s; Flight Recorder dumped to {out}; taking the "
              "process down", file=sys.stderr, flush=True)
        exit_worker(1)
    ended = DrillsEnded(list(config.drills))
    write_result(rank, ended.to_dict())
    exit_worker(0)  # the drills' groups are broken: destroying them could wait on them


if __name__ == "__main__":
    serve(DrillConfig, main)
