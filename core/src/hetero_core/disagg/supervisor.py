"""The role processes of ``hetero serve --disaggregated``: started, watched, restarted, stopped.

Each role (``hetero serve --role prefill|decode`` on a free loopback port) runs in a session of its own,
so a signal to the launcher's process group stops the launcher only, which stops the front end first
(its streams end as plain mode's do) and then its children. A thread reaps a child the moment it exits
and restarts it on the same port after ``backoff_s`` (doubling with each restart in a row); the front
end's /health answers 503 until it is back, then 200. A role that dies more than ``retries`` times with
less than ``STABLE_S`` seconds of service between deaths is given up: ``failure`` names it and the
``stop`` event is set (the launcher then exits with that one line).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx

from hetero_core.errors import ConfigError
from hetero_core.logging import get_logger

log = get_logger("hetero.disagg")
ROLES = ("prefill", "decode")
START_TIMEOUT_S = 600.0  # a role loads its model (and may convert or time it) before it answers /health
STOP_TIMEOUT_S = 30.0  # after SIGINT, how long a role may take to exit before it is killed
STABLE_S = 60.0  # a restarted role that serves this long has its restart count (and backoff) reset
POLL_S = 0.05
# HETERO_* variables of the launcher's own settings, not handed to the roles (which would refuse them)
LAUNCHER_VARIABLES = (
    "HETERO_ROLE_RESTART_RETRIES",
    "HETERO_ROLE_RESTART_BACKOFF_SECONDS",
    "HETERO_DISAGGREGATED",
)
# A role's environment names its launcher: a role whose launcher is gone (killed by SIGKILL, say)
# stops itself.
LAUNCHER_PID = "HETERO_LAUNCHER_PID"


class RoleProcesses:
    def __init__(self, engine_argv: list[str], *, retries: int, backoff_s: float) -> None:
        self.engine_argv, self.retries, self.backoff_s = engine_argv, retries, backoff_s
        self.children: dict[str, subprocess.Popen] = {}
        self.urls: dict[str, str] = {}
        self.failure: str | None = None  # why a role was given up (one line)
        self.stop = threading.Event()  # set when a role is given up: the front end stops
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> dict[str, str]:
        """Start both roles, wait until each answers /health, then watch them; their URLs."""
        for role in ROLES:
            self.urls[role] = f"http://127.0.0.1:{_free_port()}"
            self.children[role] = self._spawn(role)
        for role in ROLES:
            if not self._wait_ready(role):
                raise ConfigError(self._start_failure(role))
        self._watcher = threading.Thread(target=self._watch, name="hetero-disagg-roles", daemon=True)
        self._watcher.start()
        return self.urls

    def close(self) -> None:
        """Stop watching, then stop both roles (SIGTERM, which ``hetero serve`` takes as Ctrl-C: they
        drain and exit; killed after STOP_TIMEOUT_S)."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(STOP_TIMEOUT_S)
        for child in self.children.values():
            _stop(child)

    # -- the watcher ------------------------------------------------------------------------------
    def _watch(self) -> None:
        deaths = {role: 0 for role in ROLES}  # in a row: without STABLE_S of service between them
        ready_at = {role: time.monotonic() for role in ROLES}
        while not self._stopping.wait(POLL_S):
            for role in ROLES:
                status = self.children[role].poll()  # reaps it: no <defunct> child stays behind
                if status is None:
                    if deaths[role] and time.monotonic() - ready_at[role] > STABLE_S:
                        deaths[role] = 0
                    continue
                deaths[role] += 1
                cause = exit_cause(status)
                if deaths[role] > self.retries:
                    self.failure = (
                        f"the {role} engine process {cause}, {deaths[role]} times in a row; "
                        f"gave up after {self.retries} restart(s) (role_restart_retries); its "
                        "output above says why"
                    )
                    log.error("disagg.role_given_up", role=role, cause=cause, restarts=self.retries)
                    self.stop.set()
                    return
                delay = self.backoff_s * 2 ** (deaths[role] - 1)
                log.warning(
                    "disagg.role_exited",
                    role=role,
                    cause=cause,
                    restart=deaths[role],
                    retries=self.retries,
                    restart_in_s=delay,
                )
                if self._stopping.wait(delay):
                    return
                self.children[role] = self._spawn(role)
                if self._wait_ready(role):
                    ready_at[role] = time.monotonic()
                    log.info(
                        "disagg.role_restarted", role=role, pid=self.children[role].pid, url=self.urls[role]
                    )
                elif self._stopping.is_set():
                    return
                elif self.children[role].poll() is None:  # not ready in time: counted as its next death
                    self.children[role].kill()

    # -- one role ---------------------------------------------------------------------------------
    def _spawn(self, role: str) -> subprocess.Popen:
        port = self.urls[role].rsplit(":", 1)[1]
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
        env[LAUNCHER_PID] = str(os.getpid())
        argv = [
            sys.executable,
            "-m",
            "hetero_core",
            "serve",
            *self.engine_argv,
            "--role",
            role,
            "--host",
            "127.0.0.1",
            "--port",
            port,
        ]
        return subprocess.Popen(argv, env=env, start_new_session=True)

    def _wait_ready(self, role: str) -> bool:
        """True once the role answers /health; False if it exited first, or the launcher is stopping."""
        child, url = self.children[role], self.urls[role]
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and not self._stopping.is_set():
            if child.poll() is not None:
                return False
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        return False

    def _start_failure(self, role: str) -> str:
        child = self.children[role]
        if child.poll() is not None:
            return (
                f"the {role} engine process {exit_cause(child.returncode)} before it was ready; its "
                "output above says why"
            )
        return f"the {role} engine did not answer {self.urls[role]}/health within {START_TIMEOUT_S:.0f}s"


def stop_with_launcher() -> None:
    """In a role started by a launcher (``LAUNCHER_PID`` set): once the launcher is gone, stop this
    process as SIGTERM does (its own session keeps the launcher's process group's signals away)."""
    launcher = os.environ.get(LAUNCHER_PID)
    if not launcher or not launcher.isdigit():
        return

    def watch() -> None:
        while os.getppid() == int(launcher):
            time.sleep(0.5)
        log.warning("disagg.launcher_gone", launcher_pid=int(launcher))
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="hetero-disagg-launcher", daemon=True).start()


def exit_cause(status: int) -> str:
    """``exited with status 1`` or ``was killed by SIGKILL`` (a ``Popen.returncode``)."""
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
