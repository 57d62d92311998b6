"""Checkers for lesson 08 (``torchrun`` launches): the second machine's arguments, and each
process's GPU and shard from the environment torchrun gives it."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence

from torch.distributed.run import get_args_parser

from helpers.exercises.feedback import Wrong, answer, checker, given

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


def torchrun_environments(nodes: int = NODES, per_node: int = PER_NODE) -> list[dict[str, str]]:
    """The environment torchrun gives each process of ``nodes`` x ``per_node`` (static
    rendezvous at node 0), in launch order: the ranks handed out by torch's own elastic
    agent (``SimpleElasticAgent._assign_worker_ranks``, one agent per node, run now over an
    in-memory store), the variables named as its ``LocalElasticAgent`` sets them."""
    import threading

    import torch.distributed as dist
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerSpec

    spec = WorkerSpec(role="default", local_world_size=per_node, rdzv_handler=None,
                      entrypoint="python")
    store, workers = dist.HashStore(), {}

    def agent(node: int) -> None:  # the method reads nothing of its agent but the store
        workers[node] = SimpleElasticAgent._assign_worker_ranks(None, store, node, nodes, spec)

    threads = [threading.Thread(target=agent, args=(node,)) for node in range(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return [{"RANK": str(w.global_rank), "LOCAL_RANK": str(w.local_rank),
             "GROUP_RANK": str(node), "ROLE_RANK": str(w.role_rank), "ROLE_NAME": spec.role,
             "LOCAL_WORLD_SIZE": str(per_node), "WORLD_SIZE": str(w.world_size),
             "GROUP_WORLD_SIZE": str(nodes), "ROLE_WORLD_SIZE": str(w.role_world_size),
             "MASTER_ADDR": HOST, "MASTER_PORT": str(PORT)}
            for node in range(nodes) for w in workers[node]]


def _reference(env: dict[str, str]) -> tuple[str, str, str]:
    """What the lesson's worker does: ``init_rank`` takes ``cuda:LOCAL_RANK``; the rank's
    shard files are ``Split.file(RANK)`` of the FFN's splits."""
    import torch

    from helpers.tensor_parallel.ffn import SPLITS

    rank = int(env["RANK"])
    device = str(torch.device("cuda", int(env["LOCAL_RANK"])))
    return (device, *(s.file(rank) for s in SPLITS))


@checker("08.2", "Write the body of place(env), then run this cell again.")
def check_place(place) -> str:
    """The GPU and the shard files of every process of exercise 08.1's launch."""
    given(place)
    for env in torchrun_environments():
        got = answer(place, dict(env))
        want = _reference(env)
        where = f"The process with RANK={env['RANK']}, LOCAL_RANK={env['LOCAL_RANK']}"
        if not isinstance(got, tuple) or len(got) != 3:
            raise Wrong(f"place(...) returned {got!r} for RANK={env['RANK']}",
                        "return a tuple of three strings: (device, fc1 file, fc2 file)")
        if not all(isinstance(x, str) for x in got):
            raise Wrong(f"place(...) returned {got!r}", "return strings, e.g. "
                        "('cuda:0', 'fc1_0.bin', 'fc2_0.bin'); the environment's values are "
                        "strings too")
        if got[0] != want[0]:
            if got[0] == f"cuda:{env['RANK']}":
                raise Wrong(f"{where} would use {got[0]}, but its machine has {PER_NODE} "
                            f"GPUs, cuda:0 to cuda:{PER_NODE - 1}",
                            "a GPU index counts the GPUs of one machine, from 0 on each; of "
                            "RANK, LOCAL_RANK and GROUP_RANK, which one counts the processes "
                            "of one machine the same way?")
            raise Wrong(f"{where} would use {got[0]}; expected {want[0]}",
                        "each process takes the GPU whose index is its rank on its machine")
        if got[1:] != want[1:]:
            twin = f"fc1_{env['LOCAL_RANK']}.bin"
            if got[1] == twin and env["LOCAL_RANK"] != env["RANK"]:
                raise Wrong(f"{where} would load {got[1]}, like the process of the first "
                            f"machine with RANK={env['LOCAL_RANK']}: two ranks, one shard",
                            "each of the 8 ranks holds its own shard, so no two processes, "
                            "on either machine, may load the same file: the number must count "
                            "across both machines")
            raise Wrong(f"{where} would load {got[1:]}; expected {want[1:]}",
                        "lesson 07's files: fc1_{rank}.bin and fc2_{rank}.bin")
    return (f"Each of the {NODES * PER_NODE} processes takes the GPU of its LOCAL_RANK "
            f"(cuda:0 to cuda:{PER_NODE - 1} on each machine) and the shard of its RANK "
            f"(0 to {NODES * PER_NODE - 1} across both).")


# Rates assumed for the feedback's example (not measured): a CPU core, gloo over sockets
CPU_RATES = {"flop_rate": 50e9, "bandwidth": 2e9, "latency": 200e-6}


def model_speedup(tokens: int, hidden: int, ffn: int, p: int, flop_rate: float,
                  bandwidth: float, latency: float) -> float:
    """Lesson 07's cost model: one float32 forward on 1 rank against one on ``p`` ranks,
    each the rank's products plus g's ring all-reduce, on the critical path."""
    from helpers.tensor_parallel.mappings import forward_seconds, tp_cost

    def seconds(world: int) -> float:
        cost = tp_cost(1, tokens, hidden, ffn, world, 4)
        return sum(forward_seconds(cost, tokens * hidden * 4, flop_rate=flop_rate,
                                   bandwidth=bandwidth, latency=latency))

    return seconds(1) / seconds(p)


@checker("08.3", "Write the body of speedup(tokens, hidden, ffn, p, flop_rate, bandwidth, "
                 "latency), then run this cell again.")
def check_speedup(speedup) -> str:
    """The speed-up of p ranks over one in lesson 07's model, against the course's own."""
    given(speedup)
    cases = ((128, 128, 512, 2, 50e9, 2e9, 30e-6), (512, 512, 4096, 2, 50e9, 2e9, 30e-6),
             (128, 128, 512, 4, 1e12, 100e9, 5e-6), (256, 64, 256, 1, 50e9, 2e9, 30e-6))
    for tokens, hidden, ffn, p, rate, bandwidth, latency in cases:
        got = answer(speedup, tokens, hidden, ffn, p, rate, bandwidth, latency)
        want = model_speedup(tokens, hidden, ffn, p, rate, bandwidth, latency)
        if isinstance(got, bool) or not isinstance(got, (int, float)) or \
                abs(got - want) > 1e-6 * want:
            no_latency = model_speedup(tokens, hidden, ffn, p, rate, bandwidth, 0.0)
            hint = ("the ranks still add their partial outputs: g's all-reduce comes after "
                    "the products, and nothing else can start before it ends"
                    if abs(got - p) < 1e-9 else
                    "each of the ring's 2(p-1) steps pays the fixed cost `latency` too"
                    if abs(got - no_latency) < 1e-6 * no_latency else
                    "per rank: 4 x tokens x hidden x ffn / p FLOPs, then a ring all-reduce of "
                    "the float32 output: 2(p-1) steps of `latency` plus 2(p-1)/p of its bytes "
                    "over `bandwidth`; one rank alone needs no all-reduce")
            raise Wrong(f"speedup(tokens={tokens}, hidden={hidden}, ffn={ffn}, p={p}, ...) = "
                        f"{got!r}; the cost model gives {want:.4g}", hint)
    small = model_speedup(128, 128, 512, 2, **CPU_RATES)
    wide = model_speedup(512, 512, 4096, 2, **CPU_RATES)
    rates = (f"{CPU_RATES['flop_rate'] / 1e9:g} GFLOP/s, {CPU_RATES['bandwidth'] / 1e9:g} GB/s, "
             f"{CPU_RATES['latency'] * 1e6:g} us per ring step")
    return (f"Your model agrees with lesson 07's. With rates assumed for a CPU core and gloo "
            f"({rates}), p = 2 gives {small:.2f}x at this lesson's size and {wide:.2f}x at the "
            "wide size: each rank's products shrink as 1/p and grow with hidden x ffn x "
            "tokens, but the all-reduce only grows with hidden x tokens, and its fixed cost "
            "per step never shrinks. Small layers spend their time talking. The speed-ups "
            "measured on this machine fall further short: its cores are shared, which the "
            "model leaves out.")
