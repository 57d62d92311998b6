"""``device_map`` placement by hand and with accelerate, lesson 05.

Taught: ``sizing`` (bytes and budgets), ``strategies`` (how "auto", "balanced" and
"sequential" set the budgets), ``planner`` (the device map, module by module),
``offload`` (weights on disk, read back and verified), and ``diagrams`` (the lesson's
pictures, drawn from the planner's plans). The model it places is
``helpers.models.llama``; the lesson's tables and charts are in ``helpers/runs/placement``.
"""

TAUGHT = ("diagrams", "offload", "planner", "sizing", "strategies")
