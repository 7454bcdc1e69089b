"""Where Hetero keeps what it builds once: ``$HETERO_CACHE_DIR``, or ``~/.cache/hetero``."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "HETERO_CACHE_DIR"


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hetero"
