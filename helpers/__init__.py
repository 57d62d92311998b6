"""Code shared by the lessons: one package per topic, one concept per module.

The infrastructure
- ``core``: ``paths`` and ``files`` (results/, atomic writes, verified folders),
  ``errors`` (one base class), ``profiles`` (every size: smoke/small/full), ``devices`` (the one
  device/backend/dtype decision), ``timing``, ``sizes``, ``checks`` (snapshots and
  step comparisons), ``plotting``, ``show``, ``optional``.
- ``distributed``: ``launcher`` (torchrun from a notebook, safely), ``multinode`` (several
  nodes' torchrun agents on one machine), ``ranks`` (the rank's side) and ``lifeline``
  (launched agents and ranks end when the process that launched them dies).

What runs the course without being taught (the notebook runner, the bench, the GPU check,
the website, the glossary rules) lives beside this package, in ``course_tools``.

The lessons
- 01 ``model_parallel.toy``, ``model_parallel.transfer``: a toy model on two devices; moving
  activations.
- 02 ``model_parallel.stages``, ``model_parallel.resnet``: a K-stage split of any layer list;
  ResNet50 and its training loop.
- 03 ``pipeline.schedule``, ``pipeline.stage_cuts``, ``pipeline.runtime`` (one rank's
  stages, step and proof, run by lessons 03 and 04), ``pipeline.stage_worker`` and
  ``pipeline.stage_runs`` (its typed config and result), ``pipeline.timings``,
  ``pipeline.speedup``, ``pipeline.plots``: micro-batches, balanced cuts, one process per
  stage, the speed-up against the same processes at M = 1.
- 04 ``pipeline.mlp_stack`` (with the launch's typed config), ``pipeline.events``,
  ``pipeline.schedules_worker``, ``pipeline.timeline``, ``pipeline.schedules_run`` (the
  typed result): four schedules, timed action by action.
- 05 ``placement.sizing``, ``placement.strategies``, ``placement.planner``, ``placement.report``,
  ``placement.offload``, ``placement.tiny_lm``: ``device_map`` strategies by hand and with
  accelerate.
- 06 ``data_parallel``: ``collectives``, ``zero`` (ZeRO-1/2/3 by hand), ``ddp``, ``fsdp``,
  run by ``data_parallel.worker`` (``config`` in, ``results`` out); ``memory.recompute`` and
  ``memory.torch_trackers`` (PyTorch's own memory tracker beside the ledger).
- 07 ``tensor_parallel.ffn``, ``tensor_parallel.comm`` (f and g), ``tensor_parallel.block``
  (what any tensor-parallel block provides), ``tensor_parallel.proofs``,
  ``tensor_parallel.shards``, ``tensor_parallel.config``, ``tensor_parallel.native``: the
  Megatron split of an FFN and its shard files.
- 08 ``tensor_parallel.ffn_worker`` and ``tensor_parallel.mesh_worker`` (torchrun entry
  points, named ``*_worker``; ``rank_work`` and ``dtensor``: what a rank does in them),
  ``tensor_parallel.runs`` (their launches, on one node or several) and
  ``tensor_parallel.results`` (the typed results they return).
- 09 ``placement.attention`` (grouped-query attention, RoPE), ``tensor_parallel``'s
  ``attention_shards``, ``transformer_block``, ``vocab``, ``sequence``, ``llama``,
  ``native_llama`` (the whole Llama split, by hand and with ``parallelize_module``), the
  torchrun entry point ``block_worker`` (``llama_config`` in, ``llama_results`` out;
  ``llama_step``, ``llama_runs``, ``llama_timing``, ``llama_report``).
- no lesson yet: ``composed`` (the small Llama trained on a ``(pp, dp, tp)`` mesh:
  ``data``, ``layout``, ``checkpoint``, the torchrun entry point ``trainer``).
- every lesson ``memory``: ``ledger``, ``measure`` and ``saved`` (one step, counted),
  ``estimate``, ``parameters``, ``layer_rules`` and ``transformer`` (predicted from shapes;
  data-parallel sharding and recomputation too), ``cuts``, ``fits`` (what fits where),
  ``recompute``, ``torch_trackers``, ``plots``.
- every lesson ``exercises``: ``feedback`` (the verdicts and the ``checker`` decorator), one
  checker module per topic (``model_parallel`` 01-02, ``pipeline`` 03-04, ``placement`` 05,
  ``data_parallel`` and ``collectives`` 06, ``tensor_parallel`` 07, ``torchrun`` 08,
  ``transformer_tp`` and ``vocab_loss`` 09),
  ``two_ranks`` (a real gloo group as threads) and
  ``solutions`` (the reference answers in solutions/).
- ``tp_demo``: the source script's command line, a thin layer over ``tensor_parallel``.
"""
