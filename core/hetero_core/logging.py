"""Logging: events with fields. Only the CLI configures output; everyone else just gets a logger."""

from __future__ import annotations

import logging
import sys

import structlog


def get_logger(name: str):
    """A structlog logger for ``name``; library code never configures logging itself."""
    return structlog.get_logger(name)


def configure_logging(log_format: str = "console", level: str = "info", stream=None) -> None:
    """Readable console lines (coloured on a terminal) or JSON lines, on stderr. CLI only."""
    stream = stream or sys.stderr
    renderer = (
        structlog.processors.JSONRenderer()
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
