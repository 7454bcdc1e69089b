"""The default sampling parameters of a set of settings (``temperature``, ``top_p``, ``top_k``, ``min_p``,
``max_tokens``, ``seed``): what a request that brings none runs with, for the engine's default
(``builder``) and for the CLI's requests (``hetero run``, ``hetero chat``, batch files).

Its own small module, importing only the request parameters: ``hetero run`` builds them before it
decides whether a running ``hetero serve`` answers (``cli/run_on_server.py``), and the builder with the
whole engine behind it would add a tenth of a second to that path.
"""

from __future__ import annotations

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import ConfigError, InvalidRequestError


def default_sampling_params(settings, **overrides) -> SamplingParams:
    """``settings``' sampling defaults (a ``HeteroSettings``), with ``overrides`` that are not None;
    invalid values are a ConfigError (a mistake in the settings, not in a request)."""
    values = dict(
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        min_p=settings.min_p,
        max_tokens=settings.max_tokens,
        seed=settings.seed,
    )
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return SamplingParams(**values)
    except InvalidRequestError as exc:
        raise ConfigError(str(exc)) from None
