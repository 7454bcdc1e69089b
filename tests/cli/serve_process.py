"""A real ``hetero serve`` subprocess that records itself in a cache dir, for ``hetero run`` to reuse."""

from __future__ import annotations

import http.client
import re
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from hetero_core.cache.serve_registry import live_servers, registry_dir
from tests.cli_helpers import clean_env, default_sigint, hetero_command

START_TIMEOUT_S = 180  # the real model loads in seconds; a busy 2-core machine takes longer


@contextmanager
def running_serve(cache_dir: Path, *flags: str, env: dict[str, str] | None = None, recorded: bool = True):
    """``hetero serve --port 0 FLAGS`` with ``cache_dir`` as its cache; yields its record once written
    (or, with ``recorded`` false, the process once it is ready). Stopped with Ctrl-C, which must exit
    130 and leave no record behind."""
    env = clean_env({"HETERO_CACHE_DIR": str(cache_dir), "HETERO_REUSE_SERVER": "true", **(env or {})})
    process = subprocess.Popen(
        hetero_command("serve", "--port", "0", "--log-level", "warning", *flags),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    try:
        yield _wait_until_ready(process, cache_dir, recorded)
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert not list(registry_dir(cache_dir).glob("*.json")), "the server left its record behind"


def _wait_until_ready(process: subprocess.Popen, cache_dir: Path, recorded: bool):
    if not recorded:  # its ready line, then one answer: on_ready (which records) ran before any answer
        for line in iter(process.stderr.readline, ""):
            if line.startswith("hetero: serving"):
                port = int(re.search(r":(\d+) \(OpenAI", line).group(1))
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                connection.request("GET", "/health")
                assert connection.getresponse().status == 200
                connection.close()
                return process
        raise RuntimeError(f"hetero serve exited {process.wait()} before it was ready")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"hetero serve exited {process.returncode}: {process.stderr.read()}")
        mine = [r for r in live_servers(cache_dir) if r.pid == process.pid]
        if mine:
            return mine[0]
        time.sleep(0.05)
    raise RuntimeError("hetero serve did not get ready in time")
