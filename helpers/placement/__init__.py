"""``device_map`` placement by hand and with accelerate, lesson 05.

Taught: ``sizing`` (bytes and budgets), ``strategies`` (how "auto", "balanced" and
"sequential" set the budgets), ``planner`` (the device map, module by module) and
``offload`` (weights on disk, read back and verified). Running the lesson: ``report``
(tables and charts) and ``tiny_lm`` (the small Llama-shaped model it places).
"""
