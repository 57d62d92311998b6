"""Pipeline parallelism, lessons 03 and 04.

Taught (a lesson shows their source):
- ``schedule``: micro-batches in one process (``MicroBatchPipeline``), the bubble, and
  ``accumulated_step``, the one-process step every pipelined step must reproduce.
- ``stage_cuts``: balanced cuts of a layer list, by FLOPs.
- ``runtime``: this rank's chunk(s) under a ``torch.distributed.pipelining`` schedule, one
  training step, and its proof against ``accumulated_step``; lessons 03 and 04 run this code.
- ``events``: every stage action of a step, timestamped (``record_actions``).
- ``diagrams``: the lessons' pictures, drawn from the order each schedule runs
  (``schedule_order``), replayed at ideal costs (``ideal_timeline``).

The lessons' workers, configs, results and charts are in ``helpers/runs/pipeline`` and
``helpers/runs/schedules``.
"""

TAUGHT = ("diagrams", "events", "runtime", "schedule", "stage_cuts")
