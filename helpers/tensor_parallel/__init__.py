"""Megatron-style tensor parallelism of the source's FFN, lessons 07 and 08.

Taught: ``ffn`` (the split: column-parallel fc1, row-parallel fc2), ``comm`` (f and g),
``block`` (what any tensor-parallel block gives the shard files, the workers and the
proofs: its split weights, a rank's shard, its DTensor plan, its sizes), ``shards`` (one
file per rank and split weight, checked on load) and ``proofs`` (the tolerances).
Running the lessons: ``config`` (the source's flags), ``native`` (its native mode), the
torchrun entry points ``ffn_worker`` and ``mesh_worker``, ``rank_work`` and ``dtensor`` (what
a rank does in them), ``runs``
(their launches) and ``results`` (the typed results the workers return).

A whole Llama block and the vocabulary, split by hand and unit-tested but not yet taught in
a lesson: ``attention_shards`` (grouped-query attention with rotary positions, split by
heads), ``transformer_block`` (the block's tensor-parallel shards and their one-process
simulation) and ``vocab`` (the vocab-parallel embedding and cross-entropy, padded when
the vocabulary does not divide).
"""
