"""Megatron-style tensor parallelism: the source's FFN (lessons 07, 08), a whole Llama (09).

Taught: ``ffn`` (the split: column-parallel fc1, row-parallel fc2), ``comm`` (f and g),
``block`` (what any tensor-parallel block gives the shard files, the workers and the
proofs: its split weights, a rank's shard, its DTensor plan, its sizes), ``shards`` (one
file per rank and split weight, checked on load) and ``proofs`` (the tolerances).
Running the lessons: ``config`` (the source's flags), ``native`` (its native mode), the
torchrun entry points ``ffn_worker`` and ``mesh_worker``, ``rank_work`` and ``dtensor`` (what
a rank does in them), ``runs``
(their launches) and ``results`` (the typed results the workers return).

Lesson 09, the whole small Llama. Taught: ``attention_shards`` (heads dealt to ranks),
``transformer_block`` (a block's shards, f and g or their sequence-parallel forms),
``vocab`` (the vocab-parallel embedding and cross-entropy, padding), ``sequence`` (f and g
along the sequence), ``llama`` (the whole model's split), ``native_llama`` (the same with
``parallelize_module``). Running it: ``llama_step`` (one SGD step, one process or one
rank, compared), the torchrun entry point ``block_worker`` with ``llama_config`` (its
flags) and ``llama_results`` (its typed result and the predictions), ``llama_runs``,
``llama_timing`` (time inside collectives), ``llama_report`` (tables, charts).
"""
