"""When a running ``hetero serve`` may answer a ``hetero run``: the identity both compute from their
settings, which must be equal (``reuse_server``; docs/quickstart.md#reusing-a-running-server).

The rule is strict: the answer must be the one the run would compute itself. So every setting, as each
process loaded it (flags > ``HETERO_*`` variables > ``--config`` file > defaults), must be equal, the
executor's and every other component's option sections included, except:

- the default sampling parameters ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``max_tokens``:
  ``hetero run`` sends its own with every request, so the server's defaults never apply; ``seed`` too
  when the run has one, while a run without one needs a server without one (the server would seed it);
- ``chat``: ``hetero run`` decides chat or raw itself (by the server's recorded chat template when unset);
- ``log_format``, ``log_level`` and ``cache_dir`` (where logs and files go, not what is computed), and
  ``reuse_server`` itself.

Besides the settings, the identity holds the Hetero version; the model, when it names a local path, as
its absolute path with the size and modification time of its files (a relative path run from another
directory, or a checkpoint rewritten since the server loaded it, is another model); and the variables
that change what the engine computes without being settings (``HETERO_DISABLE_PLUGIN_AUTOLOAD``: which
plugins load; ``HETERO_CPU_FLAGS``: which kernels are built). ``dtype = "auto"`` is compared as written:
the server resolved it on this machine from the same cached choice (``cpu_dtype_choice.json``) a local
run reads; CPU threads are not compared (the CPU kernels' results do not depend on them).
"""

from __future__ import annotations

import os
from pathlib import Path

from hetero_core import __version__

SENT_WITH_EACH_REQUEST = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed")
NOT_COMPARED = ("chat", "log_format", "log_level", "cache_dir", "reuse_server")
ENGINE_VARIABLES = ("HETERO_DISABLE_PLUGIN_AUTOLOAD", "HETERO_CPU_FLAGS")


def identity(settings) -> dict:
    """What a server and a run must share (the module's rule), as JSON-ready values."""
    values = settings.model_dump(mode="json")
    for name in SENT_WITH_EACH_REQUEST + NOT_COMPARED:
        values.pop(name, None)
    values["model"] = model_identity(settings.model)
    values["max_num_blocks_given"] = settings.max_num_blocks_given  # else the pool is sized from memory
    values["server_seed"] = settings.seed  # compared only for a run without a seed (``matches``)
    return {
        "hetero": __version__,
        "settings": values,
        "environment": {name: os.environ.get(name) for name in ENGINE_VARIABLES},
    }


def matches(server: dict, run_settings) -> bool:
    """Whether a server of identity ``server`` answers as a run with ``run_settings`` would."""
    mine = identity(run_settings)
    theirs = {**server, "settings": dict(server.get("settings", {}))}
    if run_settings.seed is not None:  # sent with the request: the server's default never applies
        mine["settings"].pop("server_seed")
        theirs["settings"].pop("server_seed", None)
    return theirs == mine


def model_identity(model: str):
    """The model setting as a name (embedded, hub id), or a local path with its files' sizes and times."""
    path = Path(model).expanduser()
    if not path.exists():
        return model
    path = path.resolve()
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    stats = []
    for file in files:
        try:
            stat = file.stat()
        except OSError:
            continue
        stats.append([file.name, stat.st_size, stat.st_mtime_ns])
    return {"path": str(path), "files": stats}
