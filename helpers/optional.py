"""Optional components (accelerate, torchsummary, ...) imported with a clear error."""

from __future__ import annotations

import importlib
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
