"""A model split by layers over devices, lessons 01 and 02.

Taught: ``stages`` (a K-stage split of any layer list), ``resnet`` (ResNet50 as a layer
list and the source's training loop) and ``transfer`` (what moving an activation between
devices costs); ``diagrams`` draws the lessons' pictures (the three ways to cut, two devices
and their idle timeline, a model's stages). Lesson 01's toy model is in ``helpers.models.toy``.
"""

TAUGHT = ("diagrams", "resnet", "stages", "transfer")
