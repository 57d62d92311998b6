"""Context parallelism: attention over a sequence split across ranks.

- ``merge``: attention block by block, merged by the log-sum-exp (the piece every variant uses)
- ``split``: which tokens a rank holds: contiguous, or the zig-zag that balances causal work
- ``ring``: ring attention: keys and values passed round the ranks, forward and backward
- ``gather``: all-gathered keys and values (Llama 3), and Ulysses' all-to-all to heads
"""

TAUGHT = ("gather", "merge", "ring", "split")
