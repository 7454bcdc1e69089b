"""``hetero serve`` recorded in the cache while it runs, so that ``hetero run`` can send it its prompts
instead of loading the model again (``cache/serve_registry.py``; the rule: ``serve_identity``).

The record is written once the server accepts connections (the engine loaded, the port bound: a run
finding it is answered at once) and removed however the server stops cleanly. Only the plain mode records
itself (one engine in this process): disaggregated roles and Ray replicas do not, nor a server started
with ``reuse_server = false``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hetero_core.cache.cache_dir import default_cache_dir
from hetero_core.cache.serve_registry import ServerRecord, record_server, remove_record
from hetero_core.cli.serve_identity import identity
from hetero_core.logging import get_logger

log = get_logger("hetero.serve")


def registry_cache_dir(settings) -> Path:
    """The cache directory the record goes to (and ``hetero run`` looks in)."""
    return Path(settings.cache_dir).expanduser() if settings.cache_dir else default_cache_dir()


@contextmanager
def recorded_while_serving(settings, server, app, listening) -> Iterator[Callable[[], None] | None]:
    """Gives the callback that writes this server's record (for ``run_server``'s ``on_ready``; None when
    ``reuse_server`` is off); on leaving, the record is removed."""
    if not settings.reuse_server:
        yield None
        return
    written: list[Path] = []

    def write() -> None:
        host, port = listening.getsockname()[:2]
        tokenizer = getattr(app.state.hetero.llm.engine, "tokenizer", None)
        record = ServerRecord(
            host=host,
            port=port,
            pid=os.getpid(),
            model_name=app.state.hetero.model_name,
            identity=identity(settings),
            needs_api_key=server.key() is not None,
            has_chat_template=getattr(tokenizer, "chat_template", None) is not None,
        )
        try:
            written.append(record_server(registry_cache_dir(settings), record))
        except OSError as exc:  # a read-only cache: the server runs, hetero run just cannot find it
            log.warning("serve.record_failed", error=str(exc))

    try:
        yield write
    finally:
        for path in written:
            remove_record(path)
