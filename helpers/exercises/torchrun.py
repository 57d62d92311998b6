"""Checkers for lesson 08 (``torchrun`` launches, and what fits on real GPUs)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence

from torch.distributed.run import get_args_parser

from helpers.core.sizes import format_bytes
from helpers.exercises.feedback import Wrong, checker, given
from helpers.memory import LLAMA_70B_SHAPE
from helpers.memory.fits import Layout, per_gpu

NODES, PER_NODE, HOST, PORT = 2, 4, "node0.example", 29500
MODULE = "helpers.tp_demo"
CARD = 80 * 2**30
SEQ, TP = 4096, 8


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


def fullest_gpu(pp: int) -> int:
    """Bytes on the fullest GPU of Llama-70B under TP 8 x PP ``pp``, 1F1B (lesson 08's table)."""
    return per_gpu(LLAMA_70B_SHAPE, Layout(f"TP {TP} x PP {pp}", tp=TP, pp=pp), seq=SEQ).total


def fewest_stages() -> int:
    """The fewest pipeline stages that fit the card, searched with the lesson's estimator."""
    for pp in range(1, LLAMA_70B_SHAPE.blocks + 1):
        if fullest_gpu(pp) <= CARD:
            return pp
    raise ValueError("no pipeline depth fits")


@checker("08.2", "Set fewest_stages_70b to a number, then run this cell again.")
def check_fewest_stages_70b(fewest_stages_70b: int) -> str:
    """The fewest 1F1B stages that, with TP 8, fit Llama-70B's training on 80 GiB cards."""
    got = given(fewest_stages_70b)
    blocks = LLAMA_70B_SHAPE.blocks
    if not isinstance(got, int) or not 1 <= got <= blocks:
        raise Wrong(f"fewest_stages_70b = {got!r}; expected a whole number of stages, 1 to "
                    f"{blocks} (one block per stage at most)")
    want = fewest_stages()
    if got < want:
        raise Wrong(f"With {got} stage(s) the fullest GPU needs {format_bytes(fullest_gpu(got))}, "
                    f"over {format_bytes(CARD)}",
                    "per_gpu(shape, Layout(name, tp=8, pp=...), seq=4096) from helpers.memory.fits "
                    "gives the fullest GPU's ledger for one depth")
    if got > want:
        raise Wrong(f"{got} stages fit ({format_bytes(fullest_gpu(got))} on the fullest GPU), "
                    "but fewer stages fit too, and each stage you add lengthens the bubble",
                    "try smaller depths")
    return (f"{want} stages x TP {TP} = {want * TP} GPUs: the fullest GPU needs "
            f"{format_bytes(fullest_gpu(want))}, and {format_bytes(fullest_gpu(want - 1))} with "
            f"{want - 1}. Note that 1F1B's first stage holds pp micro-batches of blocks/pp "
            "blocks: more stages shrink its weights, not its activations.")
