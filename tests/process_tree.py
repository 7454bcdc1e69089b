"""Processes as /proc shows them, for tests that check that nothing is left behind. A zombie counts
as gone: it has exited (an orphan's zombie may wait for a parent that never reaps it)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def live_processes() -> dict[int, tuple[int, int, str]]:
    """Every live process: pid -> (parent pid, session id, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":  # state, ppid, pgrp, session, ...
            found[int(entry.name)] = (int(fields[1]), int(fields[3]), cmdline.strip())
    return found


def live_children(pid: int | None = None) -> dict[int, str]:
    """The live children of ``pid`` (this process by default): pid -> command line."""
    pid = os.getpid() if pid is None else pid
    return {p: cmd for p, (ppid, _, cmd) in live_processes().items() if ppid == pid}


def live_in_session(session: int) -> dict[int, str]:
    """The live processes of a session (a process started with ``start_new_session=True`` leads one
    whose id is its pid, and everything it starts joins it): pid -> command line."""
    return {p: cmd for p, (_, sid, cmd) in live_processes().items() if sid == session}


def still_alive(pids, timeout: float) -> list[int]:
    """Those of ``pids`` still alive after waiting up to ``timeout`` seconds (a hang guard, not a
    measurement) for them to go."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if p in live_processes()]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)
