"""The small Llama trained in 3-D (lesson 10): FSDP x tensor + sequence parallel x pipeline.

Taught: ``data`` (a learnable task made locally: sequences from a fixed random Markov
chain, the same batch for every layout at every step), ``layout`` (the ``(pp, dp, tp)``
mesh's sizes, checked; a pipeline stage, tensor- and sequence-parallel with lesson 09's
plan, then fully sharded), ``run`` (one layout's training, measured, against the one
process), ``ledger`` (what a rank holds and sends, predicted), ``checkpoint`` (folders of
``torch.distributed.checkpoint`` that any layout loads, verified), ``digest`` (a
fingerprint of the weights that does not depend on the layout).

They run it: ``config`` and ``trainer`` (the torchrun entry point for one layout),
``suite`` (every layout in one launch), ``launches`` (the lesson's launches), ``results``
(typed results and every verdict, where the tolerances are named), ``comms`` and
``measure`` (what a rank sends and keeps), ``report`` (tables and charts).
"""
