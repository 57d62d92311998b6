"""The course's models, built locally, shared by every lesson that trains or splits them.

Taught: ``toy`` (lesson 01's two-layer model), ``llama`` (the small Llama: ``LMConfig``,
its shape declared once and embedded by every run that trains it; lesson 05 places it,
06 data-parallelises it, 09, 10 and 11 split it) and ``attention`` (its grouped-query
attention with rotary positions, lesson 09). Run by lesson 04: ``mlp_stack`` (a stack of
equal residual MLP blocks for the pipeline schedules). ResNet50's layer list is lesson
02's subject, so it lives with the technique (``helpers.model_parallel.resnet``).
"""

TAUGHT = ("attention", "llama", "toy")
