"""Context parallelism: attention over a sequence split across ranks.

- ``merge``: attention block by block, merged by the log-sum-exp (the piece ring attention uses)
- ``split``: which tokens a rank holds: contiguous, or the zig-zag that balances causal work
- ``ring``: ring attention: keys and values passed round the ranks, forward and backward
- ``gather``: all-gathered keys and values (Llama 3), and Ulysses' all-to-all to heads
- ``traffic``: the bytes each rank sends per layer under each variant
- ``bounds``: how far two float64 computations of one layer may differ, derived
- ``llama``: the small Llama with context-parallel attention, its loss and gradients
- ``diagrams``: the pictures, drawn from the ring's plans
"""

TAUGHT = ("bounds", "diagrams", "gather", "llama", "merge", "ring", "split", "traffic")
