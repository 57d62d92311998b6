"""Where the series writes its results, and how paths are displayed to a learner."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "results"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"


def results_path(name: str | Path) -> Path:
    """Path of ``name`` under results/, creating the folders it needs."""
    path = RESULTS_DIR / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def display_path(path: str | Path) -> str:
    """The path relative to the repository root when it lies inside it (no machine paths)."""
    path = Path(path).resolve()
    try:
        return path.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return path.name
