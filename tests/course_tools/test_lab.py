"""The lab check's pieces that need no browser: the server's command line, the course's
settings, the glossary links it follows, and the flaws its self-test plants."""

from __future__ import annotations

import json

from course_tools.lab import check, server


def test_the_lab_serves_the_repository_and_lands_in_the_lessons(tmp_path):
    command = server.lab_command(tmp_path, 8123, "secret")
    assert f"--ServerApp.root_dir={tmp_path}" in command
    assert "--LabApp.default_url=/lab/tree/notebooks" in command
    assert "--no-browser" in command and "--ServerApp.port=8123" in command
    lab = server.Lab("http://127.0.0.1:8123", "secret", tmp_path / "log")
    assert lab.url("/api/status") == "http://127.0.0.1:8123/api/status?token=secret"
    assert lab.url("/a?b=1").endswith("?b=1&token=secret")


def test_the_course_settings_render_markdown_and_never_autosave(tmp_path):
    settings = json.loads(server.OVERRIDES.read_text())["@jupyterlab/docmanager-extension:plugin"]
    assert settings == {"autosave": False, "defaultViewers": {"markdown": "Markdown Preview"}}
    installed = server.install_overrides(tmp_path)
    assert installed == tmp_path / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    assert installed.read_text() == server.OVERRIDES.read_text()


def test_the_planted_flaws_break_the_first_lesson_three_ways(tmp_path):
    root = check.copy_course(tmp_path)
    before = check.fragments(root / "notebooks" / check.FIRST)
    assert before and all(before)  # every lesson links its terms
    expected = check.plant_flaws(root)
    notebook = json.loads((root / "notebooks" / check.FIRST).read_text())
    assert "kernelspec" not in notebook["metadata"]
    assert check.fragments(root / "notebooks" / check.FIRST)[0] == check.PLANTED_FRAGMENT
    assert notebook["cells"][-1]["source"].startswith("raise RuntimeError")
    assert len(expected) == 3
    assert check.lesson_names(root, ["01"]) == [check.FIRST]
