"""vLLM's ``speculative_config`` dict as Hetero settings, for ``LLM(speculative_config={...})``.

    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    -> num_speculative_tokens = 3, speculative_proposer = {"name": "ngram", "ngram": {"prompt_lookup_max": 4}}

``method`` names the proposer (vLLM's ``draft_model``, or a ``model`` without a method, is ``draft``);
every other key but ``num_speculative_tokens`` goes to that proposer's options section, which its
own options model validates (an unknown key is an error naming the proposer and its options).
"""

from __future__ import annotations

from typing import Any

from hetero_core.errors import ConfigError

__all__ = ["speculative_settings"]
METHOD_ALIASES = {"draft_model": "draft"}


def speculative_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings (``num_speculative_tokens``, ``speculative_proposer``) for a vLLM
    ``speculative_config``."""
    if not isinstance(config, dict):
        raise ConfigError(
            f"speculative_config must be a dict such as {{'method': 'ngram', "
            f"'num_speculative_tokens': 3}}, got {type(config).__name__}"
        )
    options = dict(config)
    if "num_speculative_tokens" not in options:
        raise ConfigError("speculative_config needs num_speculative_tokens (the tokens proposed per step)")
    k = options.pop("num_speculative_tokens")
    method = options.pop("method", None) or ("draft" if "model" in options else "ngram")
    name = METHOD_ALIASES.get(method, method)
    return {"num_speculative_tokens": k, "speculative_proposer": {"name": name, name: options}}
