"""Lessons 07-08's run machinery: ``config`` (each worker's launch), the torchrun entry
points ``worker`` (the tensor-parallel FFN, one world size or a sweep) and ``mesh_worker``
(a dp x tp mesh), ``native`` (the source's native mode), ``results`` (the typed results
and their verdicts), ``wire`` (what gloo puts on a rank's sockets, predicted and read; lesson
09's worker uses it too), ``shard_files`` (written before a launch) and ``timings`` (the
lesson's timing tables). ``helpers.tp_demo`` is the source script's command line over them.
"""
