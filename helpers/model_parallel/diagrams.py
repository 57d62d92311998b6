"""The pictures of this technique, drawn from the objects the lesson runs."""

from __future__ import annotations
