"""Checker for lesson 08 (``torchrun`` launches)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence

from torch.distributed.run import get_args_parser

from helpers.exercises.feedback import Wrong, checker, given

NODES, PER_NODE, HOST, PORT = 2, 4, "node0.example", 29500
MODULE = "helpers.tp_demo"


def parse_torchrun(args: Sequence[str]) -> dict:
    """``args`` as ``torchrun`` itself reads them (its own argument parser)."""
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise Wrong(f"Expected a list of strings, e.g. ['--nnodes=2', ...]; got {args!r}",
                    "write one list item per word of the command line, without 'torchrun'")
    if args and args[0].endswith(("torchrun", "torch.distributed.run")):
        raise Wrong(f"The list starts with {args[0]!r}", "leave out the command itself: only "
                    "the arguments that follow the word torchrun")
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parser = get_args_parser()
            parser.prog = "torchrun"
            return vars(parser.parse_args(list(args)))
    except SystemExit as error:
        message = errors.getvalue().strip().splitlines()[-1:] or ["(no message)"]
        raise Wrong(f"torchrun refuses these arguments: {message[0]}") from error


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


@checker("08.1", "Set node1_args to the list of torchrun's arguments, then run this cell again.")
def check_node1_args(node1_args: Sequence[str]) -> str:
    """The second machine's ``torchrun`` arguments, read by torchrun's own parser."""
    parsed = parse_torchrun(given(node1_args))
    if parsed["nnodes"] not in (str(NODES), f"{NODES}:{NODES}"):
        raise Wrong(f"--nnodes is {parsed['nnodes']!r}; how many machines take part?")
    if parsed["nproc_per_node"] != str(PER_NODE):
        raise Wrong(f"--nproc-per-node is {parsed['nproc_per_node']!r}",
                    "one process per GPU of this machine")
    if parsed["rdzv_backend"] == "static":
        if parsed["node_rank"] != 1:
            raise Wrong(f"--node-rank is {parsed['node_rank']}; this is the second machine",
                        "node ranks count from 0")
        if (parsed["master_addr"], parsed["master_port"]) != (HOST, PORT):
            raise Wrong(f"The rendezvous is {parsed['master_addr']}:{parsed['master_port']}",
                        "every node must meet at node 0's address and port (--master-addr, "
                        "--master-port)")
    elif parsed["rdzv_endpoint"] != f"{HOST}:{PORT}":
        raise Wrong(f"--rdzv-endpoint is {parsed['rdzv_endpoint']!r}",
                    "every node must name the same host:port")
    if not parsed["module"] or parsed["training_script"] != MODULE:
        raise Wrong(f"torchrun would start {parsed['training_script']!r}"
                    f"{' as a module' if parsed['module'] else ' as a script file'}",
                    f"run the module {MODULE} with -m")
    script = parsed["training_script_args"]
    world = _flag_value(script, "--world_size")
    if world != str(NODES * PER_NODE):
        raise Wrong(f"The program gets --world_size {world}",
                    "how many ranks are there across all the machines?")
    if _flag_value(script, "--mode") != "tp":
        raise Wrong(f"The program gets --mode {_flag_value(script, '--mode')}",
                    "the tensor-parallel run is --mode tp")
    way = ("static rendezvous: node 0 hosts it" if parsed["rdzv_backend"] == "static" else
           f"{parsed['rdzv_backend']} rendezvous: ranks are given out as nodes arrive")
    return (f"torchrun reads {NODES} nodes x {PER_NODE} processes ({way}). Node 0 runs the "
            f"same command{' with --node-rank=0' if parsed['rdzv_backend'] == 'static' else ''}.")
