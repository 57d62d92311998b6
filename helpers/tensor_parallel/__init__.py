"""Megatron-style tensor parallelism: the source's FFN (lessons 07, 08), a whole Llama (09).

The FFN, taught: ``ffn`` (the split: column-parallel fc1, row-parallel fc2),
``mappings`` (f and g, Megatron-LM's communication operators), ``block`` (what any
tensor-parallel block provides: its split weights, a rank's shard, its DTensor plan),
``shards`` (one file per rank and split weight, checked on load), ``proofs`` (how close a
split result must be, and why), ``rank_work`` (what each rank does: the timed forward,
the proven training step) and ``dtensor`` (the same FFN through ``parallelize_module``);
``ffn_diagrams`` draws its pictures from the same split.

The whole small Llama, taught: ``transformer_block`` (a block's shards with f and g or
their sequence-parallel forms), ``vocab`` (the vocab-parallel embedding and
cross-entropy), ``sequence`` (f and g's sequence-parallel forms, Korthikanti et al.'s g
and g-bar), ``llama`` (the whole model's split) and ``plans`` (the same with
``parallelize_module``); ``diagrams`` draws the block's split and sequence parallelism's
shapes from them. They build on ``attention_shards`` (heads dealt to ranks). The
lessons' launches, workers and results are in ``helpers/runs/tp_ffn`` and
``helpers/runs/tp_llama``.
"""

TAUGHT = ("block", "diagrams", "dtensor", "ffn", "ffn_diagrams", "llama", "mappings", "plans",
          "proofs", "rank_work", "sequence", "shards", "transformer_block", "vocab")
