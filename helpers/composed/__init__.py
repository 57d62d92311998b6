"""The small Llama trained in 3-D (lesson 13): FSDP x tensor + sequence parallel x pipeline,
and context parallelism as a fourth dimension.

Taught: ``data`` (a learnable task made locally: sequences from a fixed random Markov
chain, the same batch for every layout at every step), ``layout`` (the ``(pp, dp, cp,
tp)`` mesh's sizes, checked; a pipeline stage, tensor- and sequence-parallel with lesson 09's
plan, then fully sharded), ``experts`` (the model as lesson 11's mixture of experts, its
experts split over the data-parallel ranks beside tp and pp, and their gradients' rule),
``training`` (the 3-D loop every rank runs, with hooks for what a harness measures),
``ledger`` (what a rank holds and sends, predicted from the shapes and, with experts, the
routing), ``checkpoint`` (folders of ``torch.distributed.checkpoint`` that any layout
loads, verified), ``layout_search`` (which layout of a cluster fits a Llama, chosen by a
rule built on Megatron-LM's takeaways, with ZeRO counted as data parallelism: the course's
extension), ``published_layouts`` (what others ran) and ``diagrams`` (the mesh's groups
and what one rank holds of one weight, drawn from the layout the run uses).

The lesson's launches, instruments and records are in ``helpers/runs/llama_3d``.
"""

TAUGHT = ("checkpoint", "data", "diagrams", "experts", "layout", "layout_search", "ledger",
          "published_layouts", "training")
