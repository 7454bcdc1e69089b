"""What ``hetero run`` writes around an answer, whoever computed it (its own engine or a running
``hetero serve``): the closing newline, the label of one of several prompts, a failed request's line."""

from __future__ import annotations

import sys
from typing import TextIO

LABEL_WIDTH = 60


def end_line(out: TextIO, text: str) -> None:
    """End the answer's last line, if it did not end itself."""
    if text and not text.endswith("\n"):
        out.write("\n")
        out.flush()


def report_failure(output, number: int) -> None:
    """``hetero: request failed: ...`` on stderr for a failed ``output`` (``number``: of several; 0: one)."""
    if output.failed:
        which = f" {number}" if number else ""
        print(f"hetero: request{which} failed: {output.error}", file=sys.stderr)


def label(prompt: str) -> str:
    """A prompt on one line, cut to ``LABEL_WIDTH`` characters."""
    line = " ".join(prompt.split())
    return line if len(line) <= LABEL_WIDTH else line[: LABEL_WIDTH - 1] + "…"
