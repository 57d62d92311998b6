"""The book's source folder, assembled from the repository as it is.

Layout mirrors the repository, so relative links keep working: ``index.md`` (README.md up
to the end of its course map, whose ``notebooks/NN_*.ipynb`` links become the lesson
pages), ``notebooks/`` (the lessons, copied byte for byte), ``docs/glossary.md`` when the
repository has one, ``_toc.yml``, ``_config.yml`` and ``_assets/mathjax`` (MathJax 3). Files are only
rewritten when they change, so Sphinx rebuilds only what changed.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

from course_tools.website import SiteError

COURSE_MAP = "## Course map"
LINK = re.compile(r"\]\(([^)\s]+)\)")
GLOSSARY = "docs/glossary.md"
WIDE_PAGE = "---\nhtml_theme.sidebar_secondary.remove: true\n---\n"  # room for the map
MATHJAX_ENTRY = "tex-mml-chtml.js"  # the bundle Sphinx loads by default, served locally


def landing_page(readme: str, lessons: list[str], glossary: bool) -> str:
    """README.md from its start to the end of its course map, plus how to read the site.

    ``lessons`` are the notebook stems; every relative link must reach a page of the site.
    """
    start = readme.find(COURSE_MAP)
    if start < 0:
        raise SiteError(
            f"README.md has no '{COURSE_MAP}' section; the landing page is made from it"
        )
    end = readme.find("\n## ", start + len(COURSE_MAP))
    text = _wide_table(readme[: end if end >= 0 else len(readme)].rstrip())
    pages = {f"notebooks/{name}.ipynb" for name in lessons} | ({GLOSSARY} if glossary else set())
    for target in LINK.findall(text):
        path = target.split("#", 1)[0]
        if path and "://" not in target and not target.startswith("mailto:") and path not in pages:
            raise SiteError(
                f"README.md's course map links to {target!r}, which is not a page of the site; "
                f"valid: {', '.join(sorted(pages))}"
            )
    more = f" The [glossary]({GLOSSARY}) explains the terms the lessons use." if glossary else ""
    return (
        f"{WIDE_PAGE}{text}\n\n## Reading this site\n\n"
        "Every lesson page is its notebook as stored in the course and checked by CI, which "
        "re-executes it and compares every output (nbval): the outputs, figures and tables "
        "shown here are the ones CI verified; nothing was re-run to make this site. Each "
        "lesson page links to its notebook (`.ipynb`) at the top: download it, or clone the "
        f"course and run `make lab`, to run it yourself.{more}\n"
    )


def _wide_table(text: str) -> str:
    """Wrap the first Markdown table in a ``course-map`` container (site.css widens it)."""
    lines = text.split("\n")
    rows = [i for i, line in enumerate(lines) if line.startswith("|")]
    if not rows:
        return text
    first = last = rows[0]
    while last + 1 < len(lines) and lines[last + 1].startswith("|"):
        last += 1
    table = lines[first : last + 1]
    return "\n".join(
        [*lines[:first], "```{container} course-map", *table, "```", *lines[last + 1 :]]
    )


def table_of_contents(lessons: list[str], glossary: bool) -> str:
    """The ``_toc.yml`` of the book: the landing page, the lessons, then the glossary."""
    lines = ["format: jb-book", "root: index", "parts:", "- caption: Lessons", "  chapters:"]
    lines += [f"  - file: notebooks/{name}" for name in lessons]
    if glossary:
        lines += [
            "- caption: Reference",
            "  chapters:",
            f"  - file: {GLOSSARY.removesuffix('.md')}",
        ]
    return "\n".join(lines) + "\n"


def mathjax_folder() -> Path:
    """MathJax 3's browser build (es5/) as shipped by django-static-mathjax (not imported)."""
    spec = importlib.util.find_spec("mathjax")
    folders = list(spec.submodule_search_locations or []) if spec else []
    folder = Path(folders[0]) / "static" / "mathjax" / "es5" if folders else None
    if folder is None or not (folder / MATHJAX_ENTRY).is_file():
        raise SiteError(
            f"MathJax 3 ({MATHJAX_ENTRY}) not found: django-static-mathjax is not installed; "
            "`make site` installs requirements-site.txt"
        )
    return folder


def copy_mathjax(target: Path) -> None:
    """The MathJax the pages load (its entry point and the components it loads on demand)."""
    if (target / MATHJAX_ENTRY).is_file():
        return
    source = mathjax_folder()
    for path in source.iterdir():  # the other bundles are alternatives the site does not load
        if path.is_dir():
            shutil.copytree(path, target / path.name, dirs_exist_ok=True)
    shutil.copy2(source / MATHJAX_ENTRY, target / MATHJAX_ENTRY)


def site_glossary(text: str) -> str:
    """The glossary without its ``<a id>`` lines: the site's headings carry the same ids,
    and an empty element holding one would be what its search shows for the entry."""
    return re.sub(r'^<a id="[^"]*"></a>\n\n', "", text, flags=re.MULTILINE)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def _copy(source: Path, target: Path) -> None:
    """Copy byte for byte, keeping the time stamp; skip an identical copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_file() and target.read_bytes() == source.read_bytes():
        return
    shutil.copy2(source, target)


def assemble(src: Path, repo: Path, notebooks: list[Path], config: Path) -> list[str]:
    """Fill ``src`` with the book's sources; returns the documents (without suffix) it holds."""
    lessons = [p.stem for p in notebooks]
    glossary = repo / GLOSSARY
    has_glossary = glossary.is_file()
    readme = (repo / "README.md").read_text(encoding="utf-8")
    _write(src / "index.md", landing_page(readme, lessons, has_glossary))
    _write(src / "_toc.yml", table_of_contents(lessons, has_glossary))
    _copy(config, src / "_config.yml")
    _copy(config.with_name("site.css"), src / "_assets" / "site.css")
    _copy(config.with_name("favicon.png"), src / "favicon.png")  # else browsers ask /favicon.ico
    wanted = {src / "notebooks" / p.name for p in notebooks}
    for stale in (src / "notebooks").glob("*"):
        if stale not in wanted:
            stale.unlink()
    for path in notebooks:
        _copy(path, src / "notebooks" / path.name)
    if has_glossary:
        _write(src / GLOSSARY, site_glossary(glossary.read_text(encoding="utf-8")))
    else:
        (src / GLOSSARY).unlink(missing_ok=True)
    copy_mathjax(src / "_assets" / "mathjax")
    docs = ["index", *(f"notebooks/{name}" for name in lessons)]
    return docs + ([GLOSSARY.removesuffix(".md")] if has_glossary else [])
