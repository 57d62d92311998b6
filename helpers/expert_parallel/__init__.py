"""Expert parallelism: a mixture of experts with its experts split across ranks.

- ``moe``: the MoE layer on one device: router, top-k gates, capacity, load-balancing loss
- ``dispatch``: expert parallelism by hand: permute, all-to-all dispatch, local experts,
  all-to-all combine
- ``traffic``: the bytes each rank sends per step, from the routing
- ``balance``: how uneven the load is, and DeepSeek-V3's bias update that evens it
- ``bounds``: how far the expert-parallel layer may differ from one device in float64
- ``llama``: the small Llama with MoE blocks, its experts split over the data-parallel ranks
- ``memory``: what one rank holds, predicted from the shapes and its routing
- ``diagrams``: the pictures, drawn from a real routing and router
- ``native``: PyTorch's own tools on gloo ranks: DTensor redistributing the experts'
  weights (counted against the hand all-to-all), ``all_to_all_single_autograd`` against
  the course's dispatch
- ``grouped_mm``: the experts in one ``F.grouped_mm`` call against the loop, on DTensor,
  and what torch ships for MoE that this CPU refuses, with its exact error
"""

TAUGHT = ("balance", "bounds", "diagrams", "dispatch", "grouped_mm", "llama", "memory", "moe",
          "native", "traffic")
