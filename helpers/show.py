"""Show the code that teaches: display a helper's source in a notebook."""

from __future__ import annotations

import inspect

from IPython.display import Code, Image


def show_source(*objects: object) -> Code:
    """Highlighted source of functions, classes or modules, one after another."""
    if not objects:
        raise ValueError("show_source needs at least one function, class or module")
    text = "\n\n".join(inspect.getsource(obj).rstrip() for obj in objects)
    return Code(text, language="python")


def show_image(path: object) -> Image:
    """Display a saved PNG, so the notebook shows exactly the file that was written."""
    return Image(filename=str(path))
