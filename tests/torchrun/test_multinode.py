"""Two torchrun agents on one machine: static and elastic rendezvous, a missing node, bad input."""

import os
import socket
import time
from pathlib import Path

import pytest
from test_launch import alive

from helpers.core.errors import LaunchError
from helpers.torchrun.multinode import launch_nodes, node_command

HERE = Path(__file__).resolve().parent


@pytest.fixture
def nodes(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {
        "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "PROBE_PID_DIR": str(pids),
    }

    def run(mode="ok", **kwargs):
        kwargs.setdefault("log_dir", tmp_path / "logs")
        kwargs.setdefault("timeout", 120)
        return launch_nodes("launch_probe", [mode], env=env, **kwargs)

    run.pids = pids
    return run


@pytest.mark.torchrun
def test_two_nodes_form_one_world(nodes):
    """Static rendezvous, 2 x 1 (lesson 08 runs c10d, 2 x 2, under nbval: its mesh run)."""
    result = nodes(nnodes=2, nproc_per_node=1, rendezvous="static")
    world = 2
    assert result["world"] == world and result["sum"] == world * (world + 1) / 2
    assert len(list(nodes.pids.glob("*.pid"))) == world and not alive(nodes.pids)


@pytest.mark.torchrun
def test_a_failing_rank_on_the_second_node_is_named(nodes):
    with pytest.raises(LaunchError, match=r"node 1 failed .* on rank 1") as info:
        nodes("crash", nnodes=2, nproc_per_node=1)
    assert "rank 1 exploded on purpose" in info.value.log_tail
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
