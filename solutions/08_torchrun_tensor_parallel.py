"""Lesson 08's exercises, solved. Try them in the notebook first."""


# %% Exercise 08.1: torchrun on the second machine
node1_args = [
    "--nnodes=2", "--nproc-per-node=4", "--node-rank=1",
    "--master-addr=node0.example", "--master-port=29500",
    "-m", "helpers.tp_demo", "--mode", "tp", "--device", "cuda", "--world_size", "8",
]


# %% Exercise 08.2: Which GPU, which shard
def place(env: dict[str, str]) -> tuple[str, str, str]:
    """(this process's GPU, its fc1 shard file, its fc2 shard file)."""
    rank, local_rank = int(env["RANK"]), int(env["LOCAL_RANK"])
    # the GPU counts within this machine; the shard across all the ranks of the launch
    return f"cuda:{local_rank}", f"fc1_{rank}.bin", f"fc2_{rank}.bin"


# %% Exercise 08.3: Why p = 2 is not twice as fast
def speedup(tokens: int, hidden: int, ffn: int, p: int, flop_rate: float, bandwidth: float,
            latency: float) -> float:
    """One rank's time over p ranks' time: the products shrink as 1/p, but g's all-reduce
    of the float32 output comes after them and does not shrink."""

    def seconds(ranks: int) -> float:
        compute = 4 * tokens * hidden * ffn / ranks / flop_rate  # fc1 and fc2, 2 FLOPs each
        if ranks == 1:
            return compute
        steps = 2 * (ranks - 1)  # a ring: reduce-scatter, then all-gather
        sent = steps / ranks * tokens * hidden * 4  # bytes each rank sends
        return compute + steps * latency + sent / bandwidth

    return seconds(1) / seconds(p)


ANSWERS = {"08.1": node1_args, "08.2": place, "08.3": speedup}
