"""Run the hetero command as a user would: a subprocess with a clean HETERO_* environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without its HETERO_* variables (but the cache dir), plus ``extra`` (a None value:
    the variable unset); a `hetero run` reuses no running `hetero serve` unless ``extra`` sets or unsets
    HETERO_REUSE_SERVER (tests/conftest.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_") or k == "HETERO_CACHE_DIR"}
    env["HETERO_REUSE_SERVER"] = "false"
    env.update(extra or {})
    env = {k: v for k, v in env.items() if v is not None}
    return env


def default_sigint() -> None:
    """``preexec_fn`` for a child that is to be interrupted with SIGINT: a test run started in the
    background by a non-interactive shell ignores SIGINT, children inherit that, and Python then
    installs no KeyboardInterrupt handler; restore the default as a terminal's foreground job has it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def hetero_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "hetero_core", *args]


def hetero(*args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 120):
    """Run ``hetero ARGS``; stdin is empty (not a terminal) unless text is given."""
    return subprocess.run(
        hetero_command(*args),
        capture_output=True,
        text=True,
        env=clean_env(env),
        timeout=timeout,
        input=stdin if stdin is not None else "",
    )
