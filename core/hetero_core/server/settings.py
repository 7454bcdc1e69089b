"""Server settings: flags > HETERO_* environment > defaults (the engine's come from HeteroSettings)."""

from __future__ import annotations

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from hetero_core.async_llm import DEFAULT_MAX_PENDING_REQUESTS
from hetero_core.errors import ConfigError
from hetero_core.settings import describe_validation_error

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HETERO_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to bind (default: loopback only)")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0: pick a free one)")
    api_key: SecretStr | None = Field(None, description="require 'Authorization: Bearer KEY' on /v1")
    served_model_name: str | None = Field(None, description="model id clients send (default: the model setting)")
    max_pending_requests: int = Field(DEFAULT_MAX_PENDING_REQUESTS, ge=1,
                                      description="requests accepted at once; beyond it, 429")
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1024, description="request body limit; beyond it, 413")
    graceful_shutdown_seconds: float = Field(30.0, ge=0, description="on stop, wait this long for requests to finish")

    def key(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None


def load_server_settings(**overrides) -> ServerSettings:
    try:
        return ServerSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "server settings")) from None
