"""Lesson 12's run machinery: the traced launch (``worker``), the hang drills
(``drill`` on the ranks, ``drills`` in the lesson), their configs and typed results."""
