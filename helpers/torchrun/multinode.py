"""Several machines' launch, run on one: N ``torchrun`` agents talking over 127.0.0.1.

Each agent is what one node of a cluster runs: ``torchrun --nnodes=N --node-rank=i ...``
(static rendezvous at ``--master-addr``) or ``torchrun --nnodes=N --rdzv-backend=c10d
--rdzv-endpoint=HOST:PORT --rdzv-id=ID ...`` (elastic: any node may start first). On one
machine they go through the same rendezvous, process-group set-up and collectives as on
several; what is missing is a real network's latency and bandwidth. Every agent is its
own process group with its own logs; on failure or timeout every agent and worker is
ended and the failing node and rank are named with their log tail.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from helpers.core.errors import LaunchError
from helpers.core.paths import display_path
from helpers.torchrun.launcher import (
    child_env,
    free_port,
    kill_group,
    new_log_dir,
    rank_logs,
    rank_tail,
    read_result,
    root_cause,
    tail,
    validate_port,
)
from helpers.torchrun.lifeline import child_of_this_process
from helpers.torchrun.status import LaunchStatus

RENDEZVOUS = ("static", "c10d")


def node_command(
    module: str,
    args: Sequence[str],
    *,
    nnodes: int,
    node_rank: int,
    nproc_per_node: int,
    port: int,
    rendezvous: str = "static",
    rdzv_id: str = "tutorial",
    join_timeout: int = 30,
    address: str = "127.0.0.1",
) -> list[str]:
    """The command one node runs: ``torchrun`` with the multi-node flags, then the module."""
    if rendezvous == "static":
        rdzv = [
            f"--node-rank={node_rank}",
            f"--master-addr={address}",
            f"--master-port={port}",
            f"--rdzv-conf=timeout={join_timeout}",
        ]
    else:
        rdzv = [
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={address}:{port}",
            f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf=join_timeout={join_timeout}",
        ]
    head = ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}"]
    return [*head, *rdzv, "-m", module, *args]


def validate_nodes(
    nnodes: int, nproc_per_node: int, rendezvous: str, node_ranks: Sequence[int]
) -> list[int]:
    """The node ranks to start, after checking every argument; ValueError names the bad one."""
    for name, value in (("nnodes", nnodes), ("nproc_per_node", nproc_per_node)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r}; valid: an integer >= 1")
    if rendezvous not in RENDEZVOUS:
        raise ValueError(f"rendezvous={rendezvous!r}; valid choices: {', '.join(RENDEZVOUS)}")
    ranks = list(node_ranks)
    for r in ranks:
        if not isinstance(r, int) or not 0 <= r < nnodes:
            raise ValueError(f"node rank {r!r}; valid: 0 .. {nnodes - 1} for nnodes={nnodes}")
    dupes = sorted({r for r in ranks if ranks.count(r) > 1})
    if dupes:
        raise ValueError(
            f"node rank(s) {dupes} claimed by two nodes; valid: each of 0 .. {nnodes - 1} once"
        )
    return ranks


def _start(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:  # the child keeps its own handle
        agent = [sys.executable, "-m", "torch.distributed.run", *cmd[1:]]
        return subprocess.Popen(
            agent, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=child_of_this_process(),  # the agent dies with us; each rank with it
        )


def _wait(agents: dict[int, subprocess.Popen], timeout: float,
          status: LaunchStatus | None = None, log_dir: Path | None = None
          ) -> list[tuple[int, int]] | None:
    """(node, exit code) in the order the agents ended, until all end or one fails; None on
    timeout. ``status`` shows the last line rank 0 printed (whichever node it is on: the
    local rank 0 whose stdout is not empty)."""
    deadline = time.monotonic() + timeout
    ended: list[tuple[int, int]] = []
    while time.monotonic() < deadline:
        if status is not None and log_dir is not None:
            status.update(next((p for p in rank_logs(log_dir, 0)
                                if p.name.startswith("stdout") and p.stat().st_size), None))
        for i, agent in agents.items():
            code = agent.poll()
            if code is not None and i not in dict(ended):
                ended.append((i, code))
        if len(ended) == len(agents) or any(code for _, code in ended):
            return ended
        time.sleep(0.1)
    return None


def launch_nodes(
    module: str,
    args: Sequence[str] = (),
    *,
    nnodes: int,
    nproc_per_node: int,
    rendezvous: str = "static",
    node_ranks: Sequence[int] | None = None,
    join_timeout: int = 30,
    timeout: float = 300.0,
    port: int | None = None,
    log_dir: str | Path | None = None,
    env: dict[str, str] | None = None,
    threads_per_rank: int = 1,
) -> dict:
    """Start one ``torchrun`` agent per node in ``node_ranks`` (default: all); rank 0's JSON.

    Leave a node out of ``node_ranks`` to see what the others are told when it never comes.
    """
    ranks = validate_nodes(
        nnodes, nproc_per_node, rendezvous, range(nnodes) if node_ranks is None else node_ranks
    )
    port = free_port() if port is None else validate_port(port)
    log_dir, created = new_log_dir(module, log_dir)
    result_file = log_dir / "result.json"
    result_file.unlink(missing_ok=True)
    environment = child_env(result_file, threads_per_rank, env)
    rdzv_id = module.rsplit(".", 1)[-1]  # a fresh port per launch keeps runs apart
    agents: dict[int, subprocess.Popen] = {}
    typed: list[str] = []  # each node's command as a reader types it (no launcher-only flags)
    try:
        for i in ranks:
            cmd = node_command(
                module, [*args], nnodes=nnodes, node_rank=i, nproc_per_node=nproc_per_node,
                port=port, rendezvous=rendezvous, rdzv_id=rdzv_id, join_timeout=join_timeout,
            )  # fmt: skip
            typed.append(" ".join(cmd))
            cmd[1:1] = [f"--log-dir={log_dir / f'node{i}'}", "--redirects=3", "--max-restarts=0"]
            agents[i] = _start(cmd, log_dir / f"node{i}" / "launcher.log", environment)
        status = LaunchStatus(module, len(ranks) * nproc_per_node)
        try:
            ended = _wait(agents, timeout, status, log_dir)
        finally:
            status.close()
    finally:
        for agent in agents.values():
            kill_group(agent, grace=1.0)  # ends every agent and worker, whatever happened
    if ended is None:
        raise LaunchError(
            f"{module} on {nnodes} node(s) did not finish within {timeout:g} s; every agent "
            f"and worker was ended. Logs in {display_path(log_dir)}"
        )
    failed = [(i, code) for i, code in ended if code]
    if failed:
        raise _node_failure(module, *failed[0], log_dir)  # the first node seen to fail
    return {**read_result(module, result_file, log_dir, created), "node_commands": typed}


def _node_failure(module: str, node: int, code: int, log_dir: Path) -> LaunchError:
    """The error for a failed node: its root-cause rank and log tail, or its agent's own."""
    node_dir = log_dir / f"node{node}"
    launcher_log = node_dir / "launcher.log"
    text = launcher_log.read_text(errors="replace")
    rank, local = root_cause(text)
    if local is not None:
        where, log = f"on rank {rank}", rank_tail(node_dir, local)
    else:  # the agent itself failed: most often a rendezvous that never completed
        errors = [ln for ln in text.splitlines() if "Error" in ln and not ln.startswith(" ")]
        where = "before its workers ran: " + (errors[-1] if errors else "see its log")
        log = tail(launcher_log, 15)
    return LaunchError(
        f"{module}: node {node} failed (exit code {code}) {where}; logs in "
        f"{display_path(log_dir)}\n{log}",
        rank=rank,
        log_tail=log,
    )
