"""Optional components (accelerate, torchsummary, ...): imported with a clear error, and quiet."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise ImportError saying what needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{purpose} needs the optional component {module!r}, which is not installed; "
            f"install the series' pinned list with `pip install -r requirements.txt` "
            f"(or `make run`, which does it in .venv)"
        ) from error


class _DropMessages(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(f in record.getMessage() for f in self.fragments)


@contextmanager
def quiet_logs(loggers: Iterable[str], *fragments: str) -> Iterator[None]:
    """Drop log messages of ``loggers`` that contain one of ``fragments`` (and only those)."""
    found = [logging.getLogger(n) for n in loggers]
    drop = _DropMessages(fragments)
    for logger in found:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in found:
            logger.removeFilter(drop)
