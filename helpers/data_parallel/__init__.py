"""Data parallelism and sharding what it copies (lesson 06).

Taught: ``collectives`` (what all-reduce, reduce-scatter, all-gather and broadcast compute,
the bytes a rank sends in a ring, ``CommCounter``, the alpha-beta fit), ``zero`` (ZeRO
stages 1-3 written by hand), ``ddp`` (DDP's proof, buckets, overlap, ``no_sync``) and
``fsdp`` (``fully_shard`` on the same units). Running the lesson: ``config`` (the typed
config in), the torchrun entry point ``worker``, ``rank_step`` (what every rank shares),
``runs`` (the launch), ``results`` (the typed result and every verdict) and ``plots``.
"""
