"""Lesson 05's views of a placement (``report``): tables of modules and devices, a chart."""
