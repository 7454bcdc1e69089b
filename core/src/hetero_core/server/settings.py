"""Server settings: flags > HETERO_* environment > defaults (the engine's come from HeteroSettings)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from hetero_core.async_llm import DEFAULT_MAX_PENDING_REQUESTS
from hetero_core.errors import ConfigError
from hetero_core.settings import NON_SETTING_ENV_VARIABLES, NumberEnvSource
from hetero_core.validation import describe_validation_error

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HETERO_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to bind (default: loopback only)")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0: pick a free one)")
    api_key: SecretStr | None = Field(
        None, description="require 'Authorization: Bearer KEY' (all but /health, /metrics)"
    )
    served_model_name: str | None = Field(
        None,
        description="model id clients send (default: the model setting; an "
        "executor that runs no model: its name)",
    )
    max_pending_requests: int = Field(
        DEFAULT_MAX_PENDING_REQUESTS, ge=1, description="choices (prompts x n) run at once; beyond it, 429"
    )
    max_body_bytes: int = Field(
        DEFAULT_MAX_BODY_BYTES, ge=1024, description="request body limit; beyond it, 413"
    )
    chat_page: bool = Field(
        True,
        description="serve a chat page at / to try the model from a browser (the page needs no key; "
        "the API it calls keeps it)",
    )
    graceful_shutdown_seconds: float = Field(
        30.0, ge=0, description="on stop, wait this long for requests to finish"
    )
    replicas: int = Field(
        1, ge=1, le=1024, description="engine replicas behind Ray Serve (1: one process, no Ray)"
    )
    ray_address: str | None = Field(
        None,
        min_length=1,
        description="Ray cluster for the replicas: HOST:PORT, "
        "ray://HOST:PORT, auto; local (the default): a new local Ray instance",
    )
    replica_cpus: float = Field(
        1.0, ge=0, description="CPUs Ray reserves for each replica (also its OMP_NUM_THREADS)"
    )
    replica_gpus: float = Field(
        0.0,
        ge=0,
        description="GPUs Ray reserves for each replica (CUDA executors: 1, or the tensor-parallel size)",
    )

    role: Literal["both", "prefill", "decode"] = Field(
        "both",
        description="prefill/decode disaggregation: this process serves one role to a front end "
        "(prefill: prompts and first tokens, KV blocks published; decode: continues them); "
        "both: the OpenAI server",
    )
    disaggregated: bool = Field(
        False,
        description="start a prefill and a decode engine process behind one "
        "OpenAI front end (docs/disaggregation.md)",
    )
    prefill_url: str | None = Field(
        None,
        min_length=1,
        description="disaggregation: serve only the OpenAI front end, "
        "over the prefill role at this URL (with decode_url; roles may run on other machines)",
    )
    decode_url: str | None = Field(
        None, min_length=1, description="disaggregation: the decode role's URL (with prefill_url)"
    )
    kv_transfer_timeout_s: float = Field(
        30.0,
        gt=0,
        description="disaggregation: how long a decode engine waits "
        "for a prompt's KV blocks, and the front end for a role to answer",
    )
    role_restart_retries: int = Field(
        3,
        ge=0,
        description="--disaggregated: restarts of a role process that "
        "dies, in a row (a minute up resets the count); then the server exits",
    )
    role_restart_backoff_seconds: float = Field(
        1.0,
        ge=0,
        description="--disaggregated: wait before restarting a role process that died, doubled "
        "with each restart in a row",
    )

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, **other_sources):
        return (init_settings, NumberEnvSource(settings_cls))  # HETERO_PORT=-4: `got -4`, not `got '-4'`

    @property
    def uses_ray(self) -> bool:
        """Replicas on Ray Serve: several of them, or a cluster to run on."""
        return self.replicas > 1 or self.ray_address is not None

    def key(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None


# Server settings are HETERO_* variables too: the check for misspelt engine variables must know them.
NON_SETTING_ENV_VARIABLES.update("HETERO_" + name.upper() for name in ServerSettings.model_fields)
NON_SETTING_ENV_VARIABLES.add(
    "HETERO_LAUNCHER_PID"
)  # set by --disaggregated for its roles (disagg/supervisor.py)


def load_server_settings(**overrides) -> ServerSettings:
    try:
        settings = ServerSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "server settings")) from None
    if (settings.prefill_url is None) != (settings.decode_url is None):
        raise ConfigError("--prefill-url and --decode-url go together: the front end needs both roles")
    if settings.prefill_url and (settings.disaggregated or settings.role != "both"):
        raise ConfigError(
            "--prefill-url/--decode-url serve the front end alone; leave out --role and --disaggregated"
        )
    if settings.disaggregated and settings.role != "both":
        raise ConfigError(
            "--disaggregated starts both roles itself; leave out --role (or run one role with "
            "--role and no --disaggregated)"
        )
    if (settings.disaggregated or settings.role != "both" or settings.prefill_url) and settings.uses_ray:
        raise ConfigError(
            "disaggregation (--role, --disaggregated) and replicas on Ray (--replicas, "
            "--ray-address) do not combine yet; choose one"
        )
    restart = [
        name
        for name in ("role_restart_retries", "role_restart_backoff_seconds")
        if name in settings.model_fields_set
    ]
    if restart and not settings.disaggregated:
        flags = " and ".join("--" + name.replace("_", "-") for name in restart)
        raise ConfigError(
            f"{flags} {'apply' if len(restart) > 1 else 'applies'} to the role processes "
            "--disaggregated starts: add --disaggregated"
        )
    unused = [name for name in ("replica_cpus", "replica_gpus") if name in settings.model_fields_set]
    if unused and not settings.uses_ray:
        flags = " and ".join("--" + name.replace("_", "-") for name in unused)
        raise ConfigError(
            f"{flags} {'apply' if len(unused) > 1 else 'applies'} to replicas on Ray: "
            "add --replicas N (N > 1) or --ray-address"
        )
    return settings
