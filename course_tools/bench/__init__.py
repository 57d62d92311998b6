"""``make bench`` (``python -m course_tools.bench``): the lessons' measurements without
notebooks, at larger sizes; ``sections`` (lessons 03, 04, 08), ``data_parallel`` (lesson 06) and ``memory`` (every
course model's ledger)."""
