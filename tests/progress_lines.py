"""Progress a person can read under ``-q``: one line per test file as its last test finishes, instead of
a screen of dots, and each failure named the moment it happens.

    [ 41%] 1266/3091   4m05s  tests/model/test_kernel_contract.py: 852 passed, 3 skipped (61.2 s)
    FAILED tests/cli/test_cli.py::test_run_prints_the_answer (call)

The seconds after a file are the sum of its tests' own durations (set-up, call, tear-down), which
under pytest-xdist is the work the file cost across every worker. pytest's own closing line
(``N passed, ... in Xs``) still ends the run. Without ``-q`` pytest's own per-file output is left as it is.
Registered by tests/conftest.py; usable alone as ``-p progress_lines`` with tests/ on the path.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

ORDER = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def outcome_of(report) -> str | None:
    """What this report says about its test, or None when it adds nothing (a passing set-up/tear-down)."""
    xfail = hasattr(report, "wasxfail")
    if report.failed:
        return "failed" if report.when == "call" else "error"
    if report.skipped:
        return "xfailed" if xfail else "skipped"
    if report.when == "call":
        return "xpassed" if xfail else "passed"
    return None


def file_line(done: int, total: int, elapsed_s: float, path: str, counts: Counter, seconds: float) -> str:
    """``[ 41%] 1266/3091   4m05s  tests/x.py: 12 passed, 1 failed (3.2 s)``."""
    percent = 100 * done // total if total else 100
    minutes, secs = divmod(int(elapsed_s), 60)
    tally = ", ".join(f"{counts[kind]} {kind}" for kind in ORDER if counts[kind])
    width = len(str(total))
    return (
        f"[{percent:3d}%] {done:>{width}}/{total} {minutes:3d}m{secs:02d}s  {path}: {tally or 'no tests'}"
        f" ({seconds:.1f} s)"
    )


class FileProgress:
    """Counts each file's tests from the collection (or, under xdist, a worker's collection) and prints
    the file's line when the last one has been reported."""

    def __init__(self, config):
        self.config = config
        self.per_file: Counter = Counter()  # file -> tests collected
        self.total = 0
        self.done = 0
        self.started = time.monotonic()
        self.outcomes: dict[str, str] = {}  # nodeid -> its outcome so far
        self.counts: dict[str, Counter] = {}  # file -> outcome -> tests
        self.seconds: Counter = Counter()  # file -> summed durations

    def expect(self, nodeids) -> None:
        if self.total:  # every xdist worker reports the same collection; the first one counts
            return
        self.per_file = Counter(file_of(nodeid) for nodeid in nodeids)
        self.total = sum(self.per_file.values())

    def pytest_sessionstart(self, session) -> None:
        self.started = time.monotonic()

    def pytest_collection_finish(self, session) -> None:
        self.expect(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        self.expect(ids)

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report, config):
        """Keep each status's category and word (the closing line counts them) but not its dot."""
        status = yield
        if isinstance(status, tuple) and len(status) == 3:
            category, _letter, word = status
            return category, "", word
        return status

    def pytest_runtest_logreport(self, report) -> None:
        path = file_of(report.nodeid)
        self.seconds[path] += getattr(report, "duration", 0.0) or 0.0
        outcome = outcome_of(report)
        if outcome is not None and self.outcomes.get(report.nodeid, "passed") == "passed":
            self.outcomes[report.nodeid] = outcome
        if outcome in ("failed", "error"):
            self.write(f"{outcome.upper()} {report.nodeid} ({report.when})")
        if report.when == "teardown":
            self.finish(report.nodeid, path)

    def finish(self, nodeid: str, path: str) -> None:
        self.done += 1
        counts = self.counts.setdefault(path, Counter())
        counts[self.outcomes.pop(nodeid, "passed")] += 1
        if sum(counts.values()) == self.per_file.get(path, 0):
            self.write(
                file_line(
                    self.done, self.total, time.monotonic() - self.started, path, counts, self.seconds[path]
                )
            )

    def write(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(line)


def pytest_configure(config) -> None:
    """Used as ``-p progress_lines``; tests/conftest.py calls :func:`register` itself."""
    register(config)


def register(config) -> None:
    """Print per-file lines when the run is quiet (``-q``); louder runs keep pytest's own output."""
    if config.get_verbosity() < 0 and not config.pluginmanager.has_plugin("hetero-file-progress"):
        config.pluginmanager.register(FileProgress(config), "hetero-file-progress")
