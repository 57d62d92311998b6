"""Data parallelism and sharding what it copies (lesson 06).

Taught: ``zero`` (ZeRO stages 1-3 written by hand: what each rank keeps and sends),
``fsdp`` (``fully_shard`` on the same units) and ``diagrams`` (data parallelism, what each
ZeRO stage holds, ZeRO-3's gather, compute and free per unit). Run by the lesson on every rank: ``ddp``
(DDP's proof, its buckets, their overlap, ``no_sync``) and ``rank_step`` (what every
rank's step shares: its rows of the batch, Adam, the bytes of a shard). The lesson's
launch, worker and results are in ``helpers/runs/data_parallel``.
"""

TAUGHT = ("diagrams", "fsdp", "zero")
