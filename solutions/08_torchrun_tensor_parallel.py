"""Lesson 08's exercises, solved. Try them in the notebook first."""


# %% Exercise 08.1: torchrun on the second machine
node1_args = [
    "--nnodes=2", "--nproc-per-node=4", "--node-rank=1",
    "--master-addr=node0.example", "--master-port=29500",
    "-m", "helpers.tp_demo", "--mode", "tp", "--device", "cuda", "--world_size", "8",
]


# %% Exercise 08.2: Llama-70B on 80 GiB cards
# from helpers.memory import LLAMA_70B_SHAPE
# from helpers.memory.fits import Layout, per_gpu
# [pp for pp in range(1, 81)
#  if per_gpu(LLAMA_70B_SHAPE, Layout("x", tp=8, pp=pp), seq=4096).total <= 80 * 2**30][0]
fewest_stages_70b = 4


ANSWERS = {"08.1": node1_args, "08.2": fewest_stages_70b}
