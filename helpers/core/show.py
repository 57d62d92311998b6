"""Show the code that teaches: a helper's source, highlighted, in a notebook."""

from __future__ import annotations

import inspect

from IPython.display import Image
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer


class Source:
    """Python source shown highlighted in a notebook (inline colours, no page-wide CSS)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_html_(self) -> str:
        return highlight(self.text, PythonLexer(), HtmlFormatter(noclasses=True, nobackground=True))

    def __repr__(self) -> str:
        return self.text


def show_source(*objects: object) -> Source:
    """Highlighted source of functions, classes or modules, one after another."""
    if not objects:
        raise ValueError("show_source needs at least one function, class or module")
    return Source("\n\n".join(inspect.getsource(obj).rstrip() for obj in objects))


def show_image(path: object) -> Image:
    """Display a saved PNG, so the notebook shows exactly the file that was written."""
    return Image(filename=str(path))
