"""Test helper: pip distributions that exist only in memory, with a ``hetero`` entry-point group."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import tomllib


class FakeDistribution(importlib.metadata.Distribution):
    """A distribution named ``name`` at ``version`` whose ``hetero`` entry points are ``entry_points``."""

    def __init__(self, name: str, version: str, entry_points: dict[str, str]):
        self._files = {
            "METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
            "entry_points.txt": "[hetero]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()),
        }

    @classmethod
    def from_pyproject(cls, folder: Path) -> FakeDistribution:
        """The distribution a plugin folder's pyproject.toml declares, as pip would install it."""
        project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        return cls(project["name"], project["version"], project["entry-points"]["hetero"])

    def read_text(self, filename):
        return self._files.get(filename)

    def locate_file(self, path):  # pragma: no cover - not needed for entry points
        return path
