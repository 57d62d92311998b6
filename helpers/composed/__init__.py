"""The small Llama trained in 3-D: the groundwork of the final lesson (not yet taught).

``data`` (a learnable task made locally: sequences from a fixed random Markov chain, the
same batch for every layout at every step), ``layout`` (the ``(pp, dp, tp)`` mesh's sizes,
checked; a pipeline stage of the model, tensor- and sequence-parallel with lesson 09's
plan and fully sharded), ``checkpoint`` (``torch.distributed.checkpoint`` folders, verified,
that any layout loads), and the torchrun entry point ``trainer`` (AdamW steps under a 1F1B
schedule; its losses beside the one-process model's; checkpoints and resume).
"""
