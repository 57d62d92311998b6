"""The course's website (make site, make site-check): the checks that need no browser, and
one that needs Chromium and Playwright (skipped without them; `make site-check` runs the
same self-test, and CI installs Chromium first)."""

import importlib.util
import json
import os
import re
import shutil

import pytest

from course_tools.website import SiteError, build, check, sources
from course_tools.website.links import check_css, check_links, check_loads, is_external
from course_tools.website.notebooks import check_all, check_executed, lesson_notebooks
from course_tools.website.selftest import EXPECTED, missed, run_self_test
from course_tools.website.sphinx_ext import download_html
from helpers.core.paths import NOTEBOOKS_DIR, REPO_ROOT


def notebook(path, cells):
    """Write an nbformat-4 notebook with ``cells`` (dicts) to ``path``."""
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def code(source="print(1)", count=1, outputs=None):
    if outputs is None:
        outputs = [{"output_type": "stream", "name": "stdout", "text": "1\n"}]
    cell = {"cell_type": "code", "source": source, "metadata": {}, "outputs": outputs}
    return cell | {"execution_count": count}


MARKDOWN = {"cell_type": "markdown", "source": "# Lesson 99", "metadata": {}}


# -- the notebooks the site shows ------------------------------------------------------------


def test_an_executed_notebook_passes(tmp_path):
    check_executed(notebook(tmp_path / "01_ok.ipynb", [MARKDOWN, code(), code("", None, [])]))


def test_the_stored_lessons_are_executed_and_error_free():
    check_all(lesson_notebooks(NOTEBOOKS_DIR))


def test_a_never_executed_notebook_is_refused_naming_it(tmp_path):
    path = notebook(tmp_path / "07_fresh.ipynb", [MARKDOWN, code(count=None, outputs=[])] * 2)
    with pytest.raises(SiteError, match=r"07_fresh\.ipynb was never executed.*make refresh"):
        check_executed(path)


def test_a_notebook_without_any_output_is_refused(tmp_path):
    path = notebook(tmp_path / "07_quiet.ipynb", [code(outputs=[]), code(count=2, outputs=[])])
    with pytest.raises(SiteError, match=r"07_quiet\.ipynb stores no outputs"):
        check_executed(path)


def test_a_partly_executed_notebook_is_refused_naming_the_cell(tmp_path):
    path = notebook(tmp_path / "07_half.ipynb", [MARKDOWN, code(), code(count=None, outputs=[])])
    with pytest.raises(SiteError, match=r"07_half\.ipynb is stored partly executed: cell 3"):
        check_executed(path)


def test_an_error_output_is_refused_naming_notebook_and_cell(tmp_path):
    error = {"output_type": "error", "ename": "ValueError", "evalue": "bad size", "traceback": []}
    path = notebook(
        tmp_path / "07_broken.ipynb", [MARKDOWN, code(), code(count=2, outputs=[error])]
    )
    with pytest.raises(SiteError, match=r"07_broken\.ipynb stores an error output in cell 3 \(ValueError: bad size\)"):  # fmt: skip
        check_executed(path)


def test_a_file_that_is_no_notebook_is_refused(tmp_path):
    (tmp_path / "07_text.ipynb").write_text("not json")
    with pytest.raises(SiteError, match=r"07_text\.ipynb is not a readable notebook"):
        check_executed(tmp_path / "07_text.ipynb")


def test_every_refused_notebook_is_named(tmp_path):
    fresh = notebook(tmp_path / "01_a.ipynb", [code(count=None, outputs=[])])
    error = notebook(tmp_path / "02_b.ipynb", [code(outputs=[{"output_type": "error"}])])
    with pytest.raises(SiteError, match=r"2 notebooks refused: 01_a\.ipynb .*; 02_b\.ipynb "):
        check_all([fresh, error])


def test_lessons_are_found_in_order_without_failed_copies(tmp_path):
    for name in ["02_b.ipynb", "01_a.ipynb", "01_a.failed.ipynb", "notes.ipynb"]:
        notebook(tmp_path / name, [code()])
    assert [p.name for p in lesson_notebooks(tmp_path)] == ["01_a.ipynb", "02_b.ipynb"]
    with pytest.raises(SiteError, match="no lesson notebooks"):
        lesson_notebooks(tmp_path / "empty")


def test_make_site_refuses_an_unexecuted_lesson_before_building(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    notebook(tmp_path / "notebooks" / "01_ok.ipynb", [code()])
    notebook(tmp_path / "notebooks" / "02_fresh.ipynb", [code(count=None, outputs=[])])
    monkeypatch.setattr(build, "run_jupyter_book", lambda *a: pytest.fail("built anyway"))
    with pytest.raises(SiteError, match=r"02_fresh\.ipynb was never executed"):
        build.build(tmp_path / "site", tmp_path / "work", repo=tmp_path)
    assert not (tmp_path / "site").exists()


def test_make_site_fails_with_one_readable_line(monkeypatch, capsys):
    def refuse():
        raise SiteError("03_x.ipynb was never executed")

    monkeypatch.setattr(build, "build", refuse)
    assert build.main([]) == 1
    err = capsys.readouterr().err
    assert err == "make site: 03_x.ipynb was never executed\n"


# -- the book's sources ----------------------------------------------------------------------

README = """# Course\n\nIntro.\n\n## Course map\n\n| # | lesson |\n|---|---|
| 01 | [toy](notebooks/01_toy.ipynb) |\n\nAfter the table.\n\n## Other commands\n\n[gpu](docs/gpu.md)\n"""


def test_landing_page_is_the_readme_up_to_the_end_of_its_course_map():
    page = sources.landing_page(README, ["01_toy"], glossary=False)
    assert "# Course" in page and "After the table." in page and "Other commands" not in page
    assert "```{container} course-map\n| # | lesson |" in page
    assert "[toy](notebooks/01_toy.ipynb)" in page and "glossary" not in page
    with_glossary = sources.landing_page(README, ["01_toy"], glossary=True)
    assert "[glossary](docs/glossary.md)" in with_glossary


def test_landing_page_refuses_a_link_to_a_file_not_on_the_site():
    with pytest.raises(SiteError, match=r"links to 'notebooks/01_toy\.ipynb'.*valid: notebooks/02"):
        sources.landing_page(README, ["02_other"], glossary=False)
    with pytest.raises(SiteError, match="no '## Course map' section"):
        sources.landing_page("# Course\n", ["01_toy"], glossary=False)


def test_the_real_readme_makes_a_landing_page_of_the_real_lessons():
    lessons = [p.stem for p in lesson_notebooks(NOTEBOOKS_DIR)]
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    glossary = (REPO_ROOT / sources.GLOSSARY).is_file()
    page = sources.landing_page(readme, lessons, glossary=glossary)
    assert all(f"(notebooks/{name}.ipynb)" in page for name in lessons)
    assert glossary and f"]({sources.GLOSSARY})" in page


def test_table_of_contents_lists_lessons_then_the_glossary():
    toc = sources.table_of_contents(["01_a", "02_b"], glossary=True)
    assert toc.splitlines()[:2] == ["format: jb-book", "root: index"]
    assert toc.index("notebooks/01_a") < toc.index("notebooks/02_b") < toc.index("docs/glossary")
    assert "glossary" not in sources.table_of_contents(["01_a"], glossary=False)


def test_assemble_copies_notebooks_as_stored_and_follows_the_glossary(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "copy_mathjax", lambda target: None)
    repo, src = tmp_path / "repo", tmp_path / "src"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "README.md").write_text(README)
    lesson = notebook(repo / "notebooks" / "01_toy.ipynb", [code()])
    config = REPO_ROOT / "docs" / "site" / "_config.yml"
    (repo / "docs").mkdir()
    (repo / "docs" / "glossary.md").write_text("# Glossary\n")
    docs = sources.assemble(src, repo, [lesson], config)
    assert docs == ["index", "notebooks/01_toy", "docs/glossary"]
    assert (src / "notebooks" / "01_toy.ipynb").read_bytes() == lesson.read_bytes()
    assert (src / "docs" / "glossary.md").is_file() and (src / "_assets" / "site.css").is_file()
    assert (src / "favicon.png").is_file()
    (repo / "docs" / "glossary.md").unlink()
    assert sources.assemble(src, repo, [lesson], config) == ["index", "notebooks/01_toy"]
    assert not (src / "docs" / "glossary.md").exists()  # no stale page


def test_the_site_config_never_executes_and_names_no_host():
    text = (REPO_ROOT / "docs" / "site" / "_config.yml").read_text()
    assert re.search(r'^\s*execute_notebooks:\s*"off"', text, re.M)
    assert "://" not in text and "sphinx_thebe" not in text.split("extensions:")[1].split("]")[0]


def test_site_requirements_are_pinned_exactly():
    lines = (REPO_ROOT / "requirements-site.txt").read_text().splitlines()
    pins = [line for line in lines if line.strip() and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][\w.]*", p) for p in pins), pins


def test_download_link_points_at_the_stored_notebook_copy():
    html = download_html("notebooks/01_toy", "01_toy.ipynb")
    assert 'href="../_sources/notebooks/01_toy.ipynb" download="01_toy.ipynb"' in html


# -- links and loads, on small synthetic pages -------------------------------------------------

PAGE = """<html><head><link rel="stylesheet" href="../_static/a.css">
<script src="https://cdn.invalid/x.js"></script><script src="//cdn.invalid/y.js"></script></head>
<body><h1 id="top-title">T</h1><a name="old-anchor"></a>
<img src="../_images/fig.png"><img src="../_images/gone.png"><img src="data:image/png;base64,AA">
<a href="other.html#sec">ok</a> <a href="other.html#nope">bad anchor</a> <a href="#top-title">self</a>
<a href="#old-anchor">named</a> <a href="#missing">bad self</a> <a href="../missing.html">gone</a>
<a href="../../../etc/passwd">escape</a> <a href="https://docs.invalid/page">external</a>
<a href="mailto:a@b.c">mail</a> <a href="../_sources/x.ipynb">download</a> <a href="#">top</a>
<a href="./">folder</a></body></html>"""


@pytest.fixture
def site(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "page.html").write_text(PAGE)
    (tmp_path / "notebooks" / "other.html").write_text('<h2 id="sec">S</h2>')
    (tmp_path / "notebooks" / "index.html").write_text("<p>folder index</p>")
    for name in ["_static/a.css", "_images/fig.png", "_sources/x.ipynb"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    return tmp_path


def test_internal_links_resolve_to_files_and_anchors(site):
    count, problems = check_links(site, "notebooks/page.html")
    assert count == 10  # external and mailto links are not counted
    assert [(p.element, p.detail) for p in problems] == [
        ('<a href="other.html#nope">', "no anchor #nope on notebooks/other.html"),
        ('<a href="#missing">', "no anchor #missing on notebooks/page.html"),
        ('<a href="../missing.html">', "missing.html does not exist in the site"),
        ('<a href="../../../etc/passwd">', "points outside the site folder"),
    ]
    assert all(p.page == "notebooks/page.html" for p in problems)


def test_loads_from_outside_or_missing_files_are_named(site):
    problems = check_loads(site, "notebooks/page.html")
    assert [(p.element, p.detail) for p in problems] == [
        ('<script src="https://cdn.invalid/x.js">', "loads from outside the site folder"),
        ('<script src="//cdn.invalid/y.js">', "loads from outside the site folder"),
        ('<img src="../_images/gone.png">', "_images/gone.png does not exist in the site"),
    ]


def test_css_that_fetches_from_outside_is_named(tmp_path):
    (tmp_path / "a.css").write_text(
        "@font-face{src:url('https://fonts.invalid/f.woff2')} .x{background:url(data:image/png;base64,AA)}"
        '@import "//cdn.invalid/b.css"; .y{background:url(img/local.png)}'
    )
    assert [p.element for p in check_css(tmp_path)] == [
        "url(https://fonts.invalid/f.woff2)",
        "url(//cdn.invalid/b.css)",
    ]


@pytest.mark.parametrize(
    ("url", "external"),
    [("https://a.invalid/x", True), ("//a.invalid/x", True), ("x.html#y", False),
     ("../_static/a.js?v=1", False), ("data:image/png;base64,AA", False), ("mailto:a@b.c", False),
     ("#top", False)],
)  # fmt: skip
def test_is_external(url, external):
    assert is_external(url) is external


def test_pages_are_every_html_but_assets_landing_first(tmp_path):
    with pytest.raises(SiteError, match="has no index.html; build it first"):
        check.site_pages(tmp_path)
    for name in ["index.html", "a.html", "notebooks/01.html", "_static/x.html", "screens/y.html"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("<p>")
    assert check.site_pages(tmp_path) == ["index.html", "a.html", "notebooks/01.html"]


def test_self_test_expectations_are_matched_by_page_and_element():
    reported = [check.Problem(page, element + " more", "detail") for page, element in EXPECTED]
    assert missed(reported) == []
    assert missed(reported[1:]) == [f"{EXPECTED[0][0]}: {EXPECTED[0][1]}"]


# -- the browser check itself (needs Chromium and Playwright) ------------------------------------


def _browser_missing() -> str:
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (make site-check installs requirements-site.txt)"
    if shutil.which(os.environ.get("CHROMIUM") or "/usr/bin/chromium") is None:
        return "no Chromium (apt-get install chromium, or set CHROMIUM); make site-check runs this"
    return ""


@pytest.mark.skipif(bool(_browser_missing()), reason=_browser_missing() or "ready")
def test_browser_check_reports_broken_image_and_external_script():
    problems = run_self_test(check.check_site)
    named = {(p.page, p.element) for p in problems}
    assert ("broken.html", '<img src="missing.png">') in named
    assert ("broken.html", '<script src="https://cdn.invalid/lib.js">') in named
    assert any(p.page == "broken.html" and "request https://cdn.invalid/lib.js" in p.element for p in problems)  # fmt: skip
    assert any("image not decoded" in p.detail for p in problems)
    assert all(p.page == "broken.html" for p in problems)


def test_the_site_glossary_drops_the_anchor_lines_its_headings_already_give():
    from course_tools.website.sources import site_glossary

    text = '# G\n\n<a id="bubble"></a>\n\n## Bubble\n\nIdle time.\n'
    assert site_glossary(text) == "# G\n\n## Bubble\n\nIdle time.\n"


def test_a_lesson_page_must_show_the_folds_hidden_outputs_and_diagrams_its_notebook_stores(tmp_path):
    from course_tools.website.browser import PageReport

    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": "<details><summary>A</summary>x</details>"},
        {"cell_type": "code", "metadata": {"tags": ["hide-output"]}, "source": "t()", "outputs": []},
        {"cell_type": "code", "metadata": {}, "source": "ring_diagram()", "execution_count": 1,
         "outputs": [{"output_type": "display_data", "data": {"image/png": "x"}, "metadata": {}}]},
    ]
    (tmp_path / "99_x.ipynb").write_text(json.dumps({"cells": cells, "nbformat": 4}))
    shown = PageReport("notebooks/99_x.html", images=1, folds=2, toggles=1)
    assert check.lesson_problems(shown, tmp_path) == []
    bare = PageReport("notebooks/99_x.html", images=1, broken_images=["<img>"], folds=0)
    found = {p.element for p in check.lesson_problems(bare, tmp_path)}
    assert found == {"hidden outputs", "<details> boxes", "diagrams"}
    assert check.lesson_problems(PageReport("index.html"), tmp_path) == []
