"""A model split by layers over devices, lessons 01 and 02.

Taught: ``stages`` (a K-stage split of any layer list), ``resnet`` (ResNet50 as a layer
list and the source's training loop) and ``transfer`` (what moving an activation between
devices costs). Lesson 01's toy model is in ``helpers.models.toy``.
"""

TAUGHT = ("diagrams", "resnet", "stages", "transfer")
