"""What every lesson stands on; nothing here is a lesson's subject.

- ``flags``: a dataclass as a command line, one described ``--flag`` per field.
- ``devices``: the one decision of device, backend and dtype; ``timing``: warm-up, repeats,
  mean +- std; ``checks``: snapshots, step comparisons and ``Proof`` (a verdict decided once).
- ``paths``, ``files`` (atomic writes, verified folders), ``errors``, ``sizes``, ``plotting``,
  ``show`` (a function's source in a lesson), ``optional`` (packages a lesson may lack).
"""
