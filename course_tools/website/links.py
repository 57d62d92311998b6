"""What a page links to and what it loads, read from its HTML without a browser.

A link is internal when it has no scheme: its file must exist inside the site folder, and
its ``#anchor`` must be an ``id`` (or ``<a name>``) on the target page. Anything a page
*loads* (scripts, styles, images, frames, fonts in CSS) must come from the site folder.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from functools import lru_cache
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

# tag -> the attributes whose URL the browser fetches when the page opens
LOADS = {"script": ("src",), "img": ("src",), "iframe": ("src",), "source": ("src",),
         "video": ("src", "poster"), "audio": ("src",), "embed": ("src",), "object": ("data",),
         "input": ("src",), "track": ("src",)}  # fmt: skip
LINK_LOADS = {
    "stylesheet",
    "icon",
    "preload",
    "modulepreload",
    "prefetch",
    "manifest",
    "preconnect",
    "dns-prefetch",
}
NOT_REQUESTS = ("data:", "blob:", "javascript:", "mailto:", "tel:", "about:")
CSS_URL = re.compile(r"""(?:url\(\s*|@import\s+)['"]?((?:https?:)?//[^'")\s]+)""", re.I)


@dataclass(frozen=True)
class Problem:
    """One failure of the check: the page (relative to the site), the element, what is wrong."""

    page: str
    element: str
    detail: str

    def __str__(self) -> str:
        return f"{self.page}: {self.element}: {self.detail}"


@dataclass
class PageRefs:
    """The ids of a page, its hyperlinks and what it loads, each as (element, url)."""

    ids: set[str] = field(default_factory=set)
    links: list[tuple[str, str]] = field(default_factory=list)
    loads: list[tuple[str, str]] = field(default_factory=list)


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.refs = PageRefs()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for key in ("id",) + (("name",) if tag == "a" else ()):
            if a.get(key):
                self.refs.ids.add(a[key])
        if tag in ("a", "area") and "href" in a:
            self.refs.links.append((f'<{tag} href="{a["href"]}">', a["href"]))
        if tag == "link" and "href" in a and LINK_LOADS & set(a.get("rel", "").lower().split()):
            self.refs.loads.append((f'<link rel="{a["rel"]}" href="{a["href"]}">', a["href"]))
        for attr in LOADS.get(tag, ()):
            if a.get(attr):
                self.refs.loads.append((f'<{tag} {attr}="{a[attr]}">', a[attr]))


def parse_html(text: str) -> PageRefs:
    """The ids, links and loads of one HTML document."""
    parser = _Parser()
    parser.feed(text)
    parser.close()
    return parser.refs


@lru_cache(maxsize=256)
def _page_refs(path: Path, mtime: float) -> PageRefs:
    return parse_html(path.read_text(encoding="utf-8", errors="replace"))


def page_refs(path: Path) -> PageRefs:
    """:func:`parse_html` of a file, cached while the file is unchanged."""
    return _page_refs(path, path.stat().st_mtime)


def is_external(url: str) -> bool:
    """True for a URL with a scheme or host of its own (it would leave the site folder)."""
    parts = urlsplit(url.strip())
    return bool(parts.netloc) or (bool(parts.scheme) and not url.lower().startswith(NOT_REQUESTS))


def _target(page: str, url: str) -> tuple[str | None, str]:
    """(path relative to the site or None when it climbs out, fragment) of a relative URL."""
    parts = urlsplit(url)
    if not parts.path:
        return page, unquote(parts.fragment)
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(page), unquote(parts.path)))
    if joined == ".." or joined.startswith("../") or posixpath.isabs(joined):
        return None, ""
    return joined, unquote(parts.fragment)


def check_links(site: Path, page: str) -> tuple[int, list[Problem]]:
    """(internal links checked, problems) for the hyperlinks of ``page`` (relative to ``site``)."""
    problems, count = [], 0
    for element, url in page_refs(site / page).links:
        if not url.strip() or url.lower().startswith(NOT_REQUESTS) or is_external(url):
            continue
        count += 1
        target, anchor = _target(page, url.strip())
        if target is None:
            problems.append(Problem(page, element, "points outside the site folder"))
            continue
        path = site / target
        if path.is_dir():
            path = path / "index.html"
        if not path.is_file():
            problems.append(Problem(page, element, f"{target} does not exist in the site"))
        elif anchor and anchor != "top" and path.suffix == ".html":
            if anchor not in page_refs(path).ids:
                problems.append(Problem(page, element, f"no anchor #{anchor} on {target}"))
    return count, problems


def check_loads(site: Path, page: str) -> list[Problem]:
    """Everything ``page`` loads from outside the site folder (script, style, image, frame)."""
    problems = []
    for element, url in page_refs(site / page).loads:
        if url.strip().lower().startswith(NOT_REQUESTS):
            continue
        target = None if is_external(url) else _target(page, url.strip())[0]
        if target is None:
            problems.append(Problem(page, element, "loads from outside the site folder"))
        elif not (site / target).is_file():
            problems.append(Problem(page, element, f"{target} does not exist in the site"))
    return problems


def check_css(site: Path) -> list[Problem]:
    """Every ``url(...)`` or ``@import`` in the site's CSS that points outside it."""
    return [
        Problem(
            css.relative_to(site).as_posix(), f"url({url})", "loads from outside the site folder"
        )
        for css in sorted(site.rglob("*.css"))
        for url in CSS_URL.findall(css.read_text(encoding="utf-8", errors="replace"))
    ]
