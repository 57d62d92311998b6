"""Two torchrun agents on one machine: static and elastic rendezvous, a missing node, bad input.

One static launch serves two tests: both nodes' ranks sum into rank 0's result, then the
second node's rank fails. launch_nodes's return of that result on success is what lesson
08's mesh run (c10d, 2 x 2) goes through under nbval."""

import json
import os
import re
import socket
import time
from pathlib import Path

import pytest
from test_launch import alive

from helpers.core.errors import LaunchError
from helpers.torchrun.multinode import launch_nodes, node_command

HERE = Path(__file__).resolve().parent


def _nodes(folder: Path):
    """Launch the probe on nodes, its logs and pid files under ``folder``."""
    pids = folder / "pids"
    pids.mkdir()
    env = {
        "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "PROBE_PID_DIR": str(pids),
    }

    def run(mode="ok", **kwargs):
        kwargs.setdefault("log_dir", folder / "logs")
        kwargs.setdefault("timeout", 120)
        return launch_nodes("launch_probe", [mode], env=env, **kwargs)

    run.pids, run.logs = pids, folder / "logs"
    return run


@pytest.fixture
def nodes(tmp_path):
    return _nodes(tmp_path)


@pytest.fixture(scope="module")
def two_static_nodes(tmp_path_factory):
    """Static rendezvous, 2 x 1: rank 0 writes both ranks' sum, then rank 1 (node 1)
    raises while rank 0 waits in the next all-reduce. The probe's runner and the error."""
    nodes = _nodes(tmp_path_factory.mktemp("two_static_nodes"))
    with pytest.raises(LaunchError) as info:
        nodes("crash", nnodes=2, nproc_per_node=1, rendezvous="static")
    return nodes, info.value


@pytest.mark.torchrun
def test_two_nodes_form_one_world(two_static_nodes):
    """Static rendezvous, 2 x 1 (lesson 08 runs c10d, 2 x 2, under nbval: its mesh run):
    rank 0's result sums the ranks of both nodes."""
    nodes, _ = two_static_nodes
    result = json.loads((nodes.logs / "result.json").read_text())
    world = 2
    assert result["world"] == world and result["sum"] == world * (world + 1) / 2
    assert len(list(nodes.pids.glob("*.pid"))) == world and not alive(nodes.pids)


@pytest.mark.torchrun
def test_a_failing_rank_on_the_second_node_is_named(two_static_nodes):
    nodes, error = two_static_nodes
    assert re.search(r"node 1 failed .* on rank 1", str(error)), str(error)
    assert "rank 1 exploded on purpose" in error.log_tail
    assert not alive(nodes.pids)


@pytest.mark.torchrun
def test_a_node_that_never_comes_ends_in_a_rendezvous_timeout(nodes):
    """c10d (lesson 08 shows the static case under nbval, bounded in time the same way)."""
    rendezvous = "c10d"
    start = time.monotonic()
    with pytest.raises(
        LaunchError, match="node 0 failed .* before its workers ran: .*(Timed out|Timeout)"
    ):
        nodes(nnodes=2, nproc_per_node=1, node_ranks=[0], rendezvous=rendezvous, join_timeout=3)
    assert time.monotonic() - start < 60  # bounded by join_timeout, not a hang
    assert not alive(nodes.pids)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"nnodes": 0, "nproc_per_node": 1}, r"nnodes=0; valid: an integer >= 1"),
        ({"nnodes": 2, "nproc_per_node": 0}, r"nproc_per_node=0; valid: an integer >= 1"),
        ({"nnodes": 2, "nproc_per_node": 1, "node_ranks": [0, 2]}, r"node rank 2; valid: 0 \.\. 1"),
        (
            {"nnodes": 2, "nproc_per_node": 1, "node_ranks": [0, 0]},
            r"node rank\(s\) \[0\] claimed by two nodes",
        ),
        (
            {"nnodes": 2, "nproc_per_node": 1, "rendezvous": "etcd"},
            r"rendezvous='etcd'; valid choices: static, c10d",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_starts(nodes, kwargs, message):
    with pytest.raises(ValueError, match=message):
        nodes(**kwargs)
    assert not list(nodes.pids.glob("*.pid"))


def test_a_taken_port_is_refused(nodes):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {taken} is already in use"):
            nodes(nnodes=2, nproc_per_node=1, port=taken)


def test_the_commands_are_what_a_reader_types_on_each_host():
    static = node_command(
        "m", ["--x"], nnodes=2, node_rank=1, nproc_per_node=4, port=29500, address="node0"
    )
    assert static == [
        "torchrun", "--nnodes=2", "--nproc-per-node=4", "--node-rank=1", "--master-addr=node0",
        "--master-port=29500", "--rdzv-conf=timeout=30", "-m", "m", "--x",
    ]  # fmt: skip
    elastic = node_command(
        "m", [], nnodes=2, node_rank=0, nproc_per_node=1, port=1, rendezvous="c10d", rdzv_id="j"
    )
    assert "--rdzv-backend=c10d" in elastic and "--rdzv-endpoint=127.0.0.1:1" in elastic
    assert "--rdzv-id=j" in elastic and not any(a.startswith("--node-rank") for a in elastic)
