"""Logging: structlog events with fields, delivered through the stdlib ``hetero`` logger tree.

Library code only calls ``get_logger``. Until an application configures logging, Python's defaults
apply (warnings and errors on stderr, nothing else), so embedding the engine prints no per-step
noise. The CLI calls ``configure_logging`` once: console lines or JSON lines on stderr, at the
configured level.
"""

from __future__ import annotations

import logging
import sys

import structlog

ROOT_LOGGER = "hetero"


def get_logger(name: str):
    """A structlog logger writing to the stdlib logger ``name`` (use names under ``hetero.``)."""
    return structlog.wrap_logger(logging.getLogger(name))


def configure_logging(
    log_format: str = "console", level: str = "info", stream=None, quiet_events: tuple[str, ...] = ()
) -> None:
    """Readable console lines (coloured on a terminal) or JSON lines, on stderr. CLI only.

    ``quiet_events``: events not logged, because the caller reports them in its own words.
    """
    stream = stream or sys.stderr
    renderer = (
        structlog.processors.JSONRenderer()
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    structlog.configure(
        processors=[
            _drop_events(frozenset(quiet_events)),
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger(ROOT_LOGGER)
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def _drop_events(events: frozenset[str]):
    def drop(logger, method_name, event_dict):
        if event_dict.get("event") in events:
            raise structlog.DropEvent
        return event_dict

    return drop
