"""A tiny broken site that ``make site-check`` must refuse: proof that the check can fail.

``broken.html`` loads a script from outside the site, shows an image that does not exist,
links to a missing page and to a missing anchor, leaves raw math in its text and has a
fold that shows nothing when clicked; the check must report each of them, naming the page
and the element. ``index.html`` is sound (a real image, good links, a fold that opens) and
must pass.
"""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Callable
from pathlib import Path

from course_tools.website import SiteError
from course_tools.website.links import Problem

# a 1x1 PNG, so the sound page has an image that decodes
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
HEAD = '<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>{}</title>{}</head><body>'  # icon: no /favicon.ico request
INDEX = (
    HEAD.format("sound", "")
    + """
<h1 id="sound">A sound page</h1>
<p><img src="pixel.png" alt="one pixel"> <a href="broken.html#broken">the broken page</a>
<a href="#sound">this page</a></p>
<details><summary>Answer</summary><p>shown when opened</p></details></body></html>"""
)
EXTERNAL = "https://cdn.invalid/lib.js"  # .invalid: a name that can never resolve
BROKEN = (
    HEAD.format("broken", f'<script src="{EXTERNAL}"></script>')
    + """
<h1 id="broken">A broken page</h1>
<p><img src="missing.png" alt="a figure never written"></p>
<p><a href="nowhere.html">a page that does not exist</a>
<a href="index.html#no-such-anchor">an anchor that does not exist</a></p>
<p>Raw math that nothing typeset: $$x^2$$</p>
<details><summary>Answer</summary><p style="display:none">never shown</p></details>
</body></html>"""
)

# (page, element) the check must name; each element is matched as a substring
EXPECTED = [
    ("broken.html", '<img src="missing.png">'),
    ("broken.html", f'<script src="{EXTERNAL}">'),
    ("broken.html", f"request {EXTERNAL}"),
    ("broken.html", '<a href="nowhere.html">'),
    ("broken.html", '<a href="index.html#no-such-anchor">'),
    ("broken.html", "math"),
    ("broken.html", "<details #1>"),
]


def write_broken_site(folder: Path) -> Path:
    """Write the two-page site into ``folder``; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "index.html").write_text(INDEX, encoding="utf-8")
    (folder / "broken.html").write_text(BROKEN, encoding="utf-8")
    (folder / "pixel.png").write_bytes(PIXEL)
    return folder


def missed(problems: list[Problem]) -> list[str]:
    """The expected findings (page: element) that ``problems`` does not contain."""
    return [
        f"{page}: {element}"
        for page, element in EXPECTED
        if not any(p.page == page and element in p.element for p in problems)
    ]


def run_self_test(check_site: Callable[[Path], list[Problem]]) -> list[Problem]:
    """Run ``check_site`` (check.check_site) on the broken site; raise :class:`SiteError`
    unless every flaw, and nothing on the sound page, is reported."""
    print("self-test: a site with a broken image, an external script, broken links, raw math, a dead fold")
    with tempfile.TemporaryDirectory(prefix="site-selftest-") as tmp:
        problems = check_site(write_broken_site(Path(tmp) / "site"))
    wrong = [str(p) for p in problems if p.page != "broken.html"]
    if missed(problems) or wrong:
        raise SiteError(
            f"self-test: the check missed {missed(problems) or 'nothing'} and wrongly reported "
            f"{wrong or 'nothing'}; it reported: {[str(p) for p in problems]}"
        )
    for problem in problems:
        print(f"  reported, as it must be: {problem}")
    print(f"self-test passed: all {len(EXPECTED)} flaws reported, the sound page passed")
    return problems
