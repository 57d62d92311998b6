"""Pipeline parallelism, lessons 03 and 04.

Taught (a lesson shows their source):
- ``schedule``: micro-batches in one process (``MicroBatchPipeline``), the bubble, and
  ``accumulated_step``, the one-process step every pipelined step must reproduce.
- ``stage_cuts``: balanced cuts of a layer list, by FLOPs.
- ``runtime``: this rank's chunk(s) under a ``torch.distributed.pipelining`` schedule, one
  training step, and its proof against ``accumulated_step``; lessons 03 and 04 run this code.
- ``events``: every stage action of a step, timestamped (``record_actions``).

Running the lessons (used, not read):
- ``stage_worker`` and ``schedules_worker``: the torchrun entry points of lessons 03 and 04,
  both built on ``runtime``; ``stage_runs``, ``mlp_stack`` (the lesson 04 model and config)
  and ``schedules_run``: their typed configs, launches and results.
- ``timings``, ``speedup``, ``plots`` (lesson 03) and ``timeline`` (lesson 04): measurements,
  reports and charts.
"""
