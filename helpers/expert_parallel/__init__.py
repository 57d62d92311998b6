"""Expert parallelism: a mixture of experts with its experts split across ranks.

- ``moe``: the MoE layer on one device: router, top-k gates, capacity, load-balancing loss
- ``dispatch``: expert parallelism by hand: permute, all-to-all dispatch, local experts,
  all-to-all combine
- ``traffic``: the bytes each rank sends per step, from the routing
- ``balance``: how uneven the load is, and DeepSeek-V3's bias update that evens it
- ``bounds``: how far the expert-parallel layer may differ from one device in float64
"""

TAUGHT = ("balance", "bounds", "dispatch", "moe", "traffic")
