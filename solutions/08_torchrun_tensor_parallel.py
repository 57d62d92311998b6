"""Lesson 08's exercise, solved. Try it in the notebook first."""


# %% Exercise 08.1: torchrun on the second machine
node1_args = [
    "--nnodes=2", "--nproc-per-node=4", "--node-rank=1",
    "--master-addr=node0.example", "--master-port=29500",
    "-m", "helpers.tp_demo", "--mode", "tp", "--device", "cuda", "--world_size", "8",
]


ANSWERS = {"08.1": node1_args}
