"""The course as a website (``make site``, ``make site-check``).

- ``notebooks``: the stored lessons, refused when never executed or holding an error.
- ``sources``: the book's source folder: landing page from README.md's course map, the
  table of contents, the notebooks as stored, the glossary when docs/glossary.md exists.
- ``sphinx_ext``: the Sphinx extension that puts a download link on every lesson page.
- ``build``: ``make site``: checks, assembles, runs Jupyter Book into results/site/.
- ``links``: what a page's HTML links to and loads, read without a browser.
- ``browser``: one page in headless Chromium (console, requests, images, math).
- ``check``: ``make site-check``: every page, its links, a screenshot per lesson.
- ``selftest``: a tiny broken site that the check must refuse.
"""

from __future__ import annotations

from helpers.core.errors import TutorialError


class SiteError(TutorialError):
    """The website cannot be built or failed its check; the message names file and element."""
