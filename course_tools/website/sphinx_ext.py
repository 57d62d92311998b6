"""Sphinx extension of the site: each lesson page links to its own notebook file.

The link points at the copy Sphinx keeps of every source under ``_sources/``: the
notebook exactly as stored in the course, outputs included, downloadable from the site.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # docutils comes with the site's tools, which `make test` does not install
    from docutils import nodes


def download_html(docname: str, filename: str) -> str:
    """The paragraph placed under a lesson's title, linking to ``_sources/<docname>.ipynb``."""
    href = "../" * docname.count("/") + f"_sources/{docname}.ipynb"
    return (
        '<p class="notebook-download">This page is the notebook '
        f'<a class="reference download" href="{escape(href)}" download="{escape(filename)}">'
        f"<code>{escape(filename)}</code></a> as stored and checked by CI. To run it, download "
        "it, or better clone the course and run <code>make lab</code> (the lessons import "
        "the course's <code>helpers/</code>).</p>"
    )


def add_download_link(app: Any, doctree: nodes.document) -> None:
    """On ``doctree-read``: put the download paragraph under the title of a notebook page."""
    from docutils import nodes

    docname = app.env.docname
    source = Path(str(app.env.doc2path(docname)))
    if source.suffix != ".ipynb":
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        return
    raw = nodes.raw("", download_html(docname, source.name), format="html")
    titles = [i for i, child in enumerate(section.children) if isinstance(child, nodes.title)]
    section.insert(titles[0] + 1 if titles else 0, raw)


def setup(app: Any) -> dict[str, Any]:
    """Register the extension with Sphinx."""
    app.connect("doctree-read", add_download_link)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
