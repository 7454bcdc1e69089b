"""Progress of a one-time, slow step (converting a model into the cache).

On a terminal it is a tqdm bar on stderr; otherwise (a pipe, a log file, CI) one line when the
step starts and one when it ends, so logs stay readable. Without tqdm installed the lines are
used everywhere.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO


class StepProgress:
    """``with StepProgress("converting x", total=n) as progress: ... progress.advance()``."""

    def __init__(self, description: str, total: int, stream: TextIO | None = None):
        self.description = description
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self._bar = None
        self._started = time.perf_counter()

    def __enter__(self) -> StepProgress:
        self._started = time.perf_counter()
        if _is_terminal(self.stream):
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                # A terminal that reports no size (some emulators, `script`) still gets a bar.
                width, height = shutil.get_terminal_size((80, 24))
                self._bar = tqdm(
                    total=self.total,
                    desc=self.description,
                    file=self.stream,
                    unit="step",
                    leave=False,
                    ncols=width if width >= 40 else 80,
                    nrows=max(height, 1),
                )
        if self._bar is None:
            print(f"hetero: {self.description} ...", file=self.stream, flush=True)
        return self

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._bar is not None:
            self._bar.close()
        seconds = time.perf_counter() - self._started
        outcome = "done" if exc_type is None else "failed"
        print(f"hetero: {self.description}: {outcome} in {seconds:.1f}s", file=self.stream, flush=True)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or unusual streams
        return False
