"""Progress of a batch run, always on stderr (results may be on stdout): a tqdm bar on a terminal
(requests done, tokens/s, ETA), plain log lines otherwise, every ``LOG_SECONDS`` or every tenth
of the requests. Without tqdm installed (the mock path needs no torch extras), a terminal gets the
same plain lines.
"""

from __future__ import annotations

import os
import time
from typing import TextIO

LOG_SECONDS = 5.0


class Progress:
    def __init__(self, total: int, out: TextIO, *, force_lines: bool = False) -> None:
        self.total, self.out = total, out
        self.num_done = self.num_tokens = 0
        self.started = self._last_log = time.perf_counter()
        self._every = max(1, total // 10)
        self._bar = None if force_lines or not _isatty(out) else _tqdm_bar(total, out)

    def update(self, num_done: int, num_tokens: int) -> None:
        self.num_done += num_done
        self.num_tokens += num_tokens
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self.tokens_per_second:.1f} tok/s", refresh=False)
            self._bar.update(num_done)
            return
        now = time.perf_counter()
        crossed = self.num_done // self._every > (self.num_done - num_done) // self._every
        if num_done and (crossed or now - self._last_log >= LOG_SECONDS or self.num_done == self.total):
            self._last_log = now
            self.out.write(self.line() + "\n")
            self.out.flush()

    def line(self) -> str:
        eta = self.eta_seconds
        return (
            f"hetero: batch {self.num_done}/{self.total} requests, {self.num_tokens} tokens, "
            f"{self.tokens_per_second:.1f} tokens/s" + (f", ETA {eta:.0f}s" if eta is not None else "")
        )

    @property
    def tokens_per_second(self) -> float:
        elapsed = time.perf_counter() - self.started
        return self.num_tokens / elapsed if elapsed > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        if not self.num_done or self.num_done >= self.total:
            return None
        elapsed = time.perf_counter() - self.started
        return elapsed / self.num_done * (self.total - self.num_done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _isatty(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def _tqdm_bar(total: int, out: TextIO):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    try:
        size = os.get_terminal_size(out.fileno())
        known_size = size.columns > 0 and size.lines > 0
    except (OSError, ValueError, AttributeError):
        known_size = False
    # A terminal that reports a 0x0 size (some ptys, CI consoles) would get no bar at all: tqdm
    # hides bars below the last of 0 rows.
    size_args = {"dynamic_ncols": True} if known_size else {"ncols": 100, "nrows": 24}
    return tqdm(total=total, file=out, unit="req", desc="batch", **size_args)
