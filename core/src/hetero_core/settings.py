"""Settings: one validated model, from CLI flags > HETERO_* environment > settings file > defaults.

Component choices (one field per seam of ``seams.SEAM_TABLE``: ``tokenizer``, ``scheduler_policy``,
``kv_allocator``, ``executor``, ``structured_output``, ``kv_connector``, ``speculative_proposer``)
are either a name (``executor = "mock"``) or a table with a ``name`` and one options section per
component, validated later by the component's own model
(``[executor]`` / ``name = "mock"`` / ``[executor.mock]`` / ``vocab_size = 64``).
"""

from __future__ import annotations

import contextvars
import json
import os
import warnings
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from hetero_core.errors import ConfigError
from hetero_core.plugin_system.seams import SEAM_TABLE
from hetero_core.suggest import did_you_mean
from hetero_core.validation import as_number, describe_validation_error, is_number_field

ENV_PREFIX = "HETERO_"
COMPONENT_DEFAULTS = {seam.name: seam.default for seam in SEAM_TABLE}
COMPONENT_FIELDS = tuple(COMPONENT_DEFAULTS)
DEFAULT_MODEL = "smollm2-135m-instruct"
# Short CLI flags besides the generated ``--setting-name`` ones (vLLM's spellings).
SHORT_FLAGS = {"tensor_parallel_size": "-tp", "pipeline_parallel_size": "-pp"}
# HETERO_* variables that are switches read elsewhere, not settings.
# HETERO_* variables read by something other than the settings (plugin loading, `hetero bench`, the
# fuzz tests' example count, the CPU flags reported instead of this CPU's: docs/testing.md)
NON_SETTING_ENV_VARIABLES = {
    "HETERO_DISABLE_PLUGIN_AUTOLOAD",
    "HETERO_BENCH_VLLM_PYTHON",
    "HETERO_BENCH_LM_EVAL",
    "HETERO_FUZZ_EXAMPLES",
    "HETERO_CPU_FLAGS",
    "HETERO_API_KEY",  # hetero serve's key, which hetero run sends to a server it reuses
}
_config_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("config_file", default=None)


class SettingsWarning(UserWarning):
    """A setting that is probably a mistake (e.g. a misspelt HETERO_* variable) but not an error."""


class ComponentChoice(BaseModel):
    """A component picked by name, with per-component option sections as extra keys."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None

    def section(self, component_name: str) -> dict[str, Any]:
        value = (self.model_extra or {}).get(component_name)
        return value if isinstance(value, dict) else {}

    def sections(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# One ComponentChoice field per seam, generated from the seam table.
_SeamFields = create_model(
    "_SeamFields",
    **{
        seam.name: (
            ComponentChoice,
            Field(default_factory=ComponentChoice, description=f"{seam.label} by name"),
        )
        for seam in SEAM_TABLE
    },
)


class HeteroSettings(BaseSettings, _SeamFields):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    # Model
    model: str = Field(DEFAULT_MODEL, description="embedded model name, local HF dir, GGUF file or hub id")
    cache_dir: Path | None = Field(
        None,
        description="where converted models, prepared weights and the compiled CPU kernels are cached "
        "(~/.cache/hetero, or $HETERO_CACHE_DIR)",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = Field(
        None,
        description="the executor's compute dtype: sets its `dtype` option "
        "(None: the executor's own setting)",
    )
    quantization: Literal["int8", "w8a8"] | None = Field(
        None,
        description="int8 linears (as vLLM's `quantization`): int8 weight-only, w8a8 int8 weights and "
        "activations; sets the executor's `quantization` option (None: the executor's own setting)",
    )
    # Paged KV cache and scheduling budgets (hetero-paged-infer's options)
    block_size: int = Field(16, ge=1, le=1024, description="tokens per KV block")
    max_num_blocks: int = Field(
        1024,
        ge=1,
        description="KV blocks in the pool; not given: the torch executor on the CPU sizes it from "
        "kv_cache_memory or the memory left after the weights (docs/configuration.md#kv-cache-size)",
    )
    kv_cache_memory: ByteSize | None = Field(
        None,
        gt=0,
        description="the CPU KV cache's size, bytes or '4GiB' (vLLM: VLLM_CPU_KVCACHE_SPACE, "
        "--kv-cache-memory-bytes); unset: half the memory left after the weights; not with max_num_blocks",
    )
    max_batch_size: int = Field(32, ge=1, description="sequences in one step")
    max_num_seqs: int = Field(256, ge=1, description="sequences admitted (running) at once")
    max_model_len: int = Field(2048, ge=1, description="prompt + output tokens per request")
    max_total_tokens: int = Field(4096, ge=1, description="tokens processed in one step")
    memory_threshold: float = Field(0.9, gt=0, le=1, description="fraction of blocks new requests may fill")
    max_prefill_chunk: int | None = Field(
        None, ge=1, description="prompt tokens one request prefills per step (default: the token budget)"
    )
    enable_prefix_caching: bool = Field(
        True, description="reuse the KV blocks of identical prompt prefixes across requests"
    )
    preemption_mode: Literal["recompute", "swap"] = Field(
        "recompute",
        description="when KV blocks run out: recompute the victim later, or swap its blocks to CPU",
    )
    num_swap_blocks: int = Field(
        256, ge=1, description="CPU swap space in KV blocks (preemption_mode = swap)"
    )
    async_scheduling: bool | None = Field(
        None,
        description="schedule the next step while the executor runs this one, on its own thread "
        "(None: the executor's preference, its async_scheduling attribute); with pipeline stages, "
        "keep two steps of disjoint requests in flight (false: one step at a time)",
    )
    # Speculative decoding (the proposer is the speculative_proposer component)
    num_speculative_tokens: int = Field(
        0,
        ge=0,
        le=64,
        description="tokens the speculative proposer guesses "
        "per decoding sequence per step, verified in one target pass (0: off; "
        "on, steps run without async scheduling)",
    )
    # Scaling out
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=1024,
        description="processes the model is sharded across "
        "(heads, MLP, vocabulary); needs an executor that supports it",
    )
    pipeline_parallel_size: int = Field(
        1,
        ge=1,
        le=1024,
        description="pipeline stages the model's layers are split across, "
        "one process per stage (times tensor_parallel_size); needs an executor that supports it",
    )
    distributed_executor_backend: Literal["mp", "ray"] = Field(
        "mp",
        description="what runs the ranks of tensor_parallel_size x pipeline_parallel_size > 1 (vLLM's "
        "name): mp, processes on this machine; ray, Ray actors on the cluster at ray_address "
        "(needs hetero-core[ray])",
    )
    ray_address: str | None = Field(
        None,
        min_length=1,
        description="the Ray cluster of distributed_executor_backend ray (and of hetero serve's "
        "replicas): HOST:PORT (the head's GCS), auto; local or unset: a new local Ray instance",
    )
    enable_expert_parallel: bool = Field(
        False,
        description="split a mixture-of-experts model's experts across "
        "the tensor_parallel_size ranks (tokens dispatched to them all-to-all) "
        "instead of every rank holding a slice of every expert",
    )
    # Default sampling parameters (for requests that bring none)
    temperature: float = Field(0.0, ge=0, description="sampling temperature (0: greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    top_k: int = Field(-1, ge=-1, description="top-k (-1: off)")
    min_p: float = Field(0.0, ge=0, le=1, description="min-p")
    max_tokens: int = Field(128, ge=1, description="tokens to generate per request")
    seed: int | None = Field(None, description="per-request sampling seed")
    chat: bool | None = Field(
        None, description="hetero run: apply the chat template (None: if the model has one)"
    )
    reuse_server: bool = Field(
        True,
        description="hetero serve records itself in the cache dir, and hetero run sends its prompts to "
        "such a running server of the same model and output-affecting settings instead of loading the "
        "model (false: neither; docs/quickstart.md#reusing-a-running-server)",
    )
    # Components: one field per seam (see _SeamFields), plus the plugin allow-list
    plugins: list[str] | None = Field(None, description="allow-list of installed plugins to load")
    # Logging
    log_format: Literal["console", "json"] = Field("console", description="log lines on stderr")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "warning", description="lowest level shown"
    )

    @field_validator(*COMPONENT_FIELDS, mode="before")
    @classmethod
    def _name_or_table(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("plugins", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _default_component_names(self) -> HeteroSettings:
        for seam, default in COMPONENT_DEFAULTS.items():
            choice = getattr(self, seam)
            if choice.name is None:
                choice.name = default
        return self

    @model_validator(mode="after")
    def _one_kv_pool_size(self) -> HeteroSettings:
        if self.kv_cache_memory is not None and "max_num_blocks" in self.model_fields_set:
            raise ValueError("set one of max_num_blocks and kv_cache_memory, not both")
        return self

    @model_validator(mode="after")
    def _ray_backend_has_ranks_to_place(self) -> HeteroSettings:
        if (
            self.distributed_executor_backend == "ray"
            and self.tensor_parallel_size * self.pipeline_parallel_size == 1
        ):
            raise ValueError(
                "distributed_executor_backend 'ray' places the ranks of tensor_parallel_size x "
                "pipeline_parallel_size on a Ray cluster, and both are 1 (one process, nothing to place): "
                "set one of them > 1, or distributed_executor_backend = 'mp'"
            )
        return self

    @property
    def max_num_blocks_given(self) -> bool:
        """max_num_blocks was set (flag, variable, file, argument): the pool is exactly that."""
        return "max_num_blocks" in self.model_fields_set

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return (init_settings, HeteroEnvSource(settings_cls), ConfigFileSource(settings_cls))

    def component_name(self, seam: str) -> str:
        return getattr(self, seam).name


class NumberEnvSource(EnvSettingsSource):
    """``HETERO_*`` variables, a number setting's text read as the number it spells: its error then
    shows a number (``got -4``), as a flag's and the settings file's do."""

    def prepare_field_value(self, field_name, field, value, value_is_complex):
        if isinstance(value, str) and is_number_field(field.annotation):
            return as_number(value)
        return super().prepare_field_value(field_name, field, value, value_is_complex)


class HeteroEnvSource(NumberEnvSource):
    """HETERO_* variables; a component may be a bare name and ``plugins`` a comma-separated list."""

    def prepare_field_value(self, field_name, field, value, value_is_complex):
        if isinstance(value, str) and field_name in COMPONENT_FIELDS and not value.startswith("{"):
            # HETERO_EXECUTOR=mock beside HETERO_EXECUTOR__MOCK__EOS_AFTER=5: keep both.
            return {**self.explode_env_vars(field_name, field, self.env_vars), "name": value}
        if isinstance(value, str) and field_name == "plugins" and not value.startswith("["):
            return [part.strip() for part in value.split(",") if part.strip()]
        return super().prepare_field_value(field_name, field, value, value_is_complex)

    def __call__(self) -> dict[str, Any]:
        try:
            return super().__call__()
        except Exception as exc:  # pydantic-settings raises SettingsError for undecodable values
            raise ConfigError(f"invalid environment settings: {exc}") from None


class ConfigFileSource(PydanticBaseSettingsSource):
    """The settings file named by ``--config``: TOML, or a flat/nested JSON object."""

    def get_field_value(self, field, field_name):  # pragma: no cover - __call__ does the work
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = _config_file.get()
        return normalize_components(read_config_file(path)) if path is not None else {}


def normalize_components(values: dict[str, Any]) -> dict[str, Any]:
    values = dict(values)
    for key in COMPONENT_FIELDS:
        if isinstance(values.get(key), str):
            values[key] = {"name": values[key]}
    return values


def read_config_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"settings file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise ConfigError(f"settings file {path} is not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"settings file {path} must hold a table/object of settings")
    return data


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> HeteroSettings:
    """Build settings from all sources; ``overrides`` (CLI flags) win. Raises ConfigError.

    A ``HETERO_*`` variable that names no setting gets a SettingsWarning with the closest name.
    """
    check_setting_names(overrides, "setting")
    overrides = normalize_components({k: v for k, v in overrides.items() if v is not None})
    warn_unknown_env_variables()
    token = _config_file.set(Path(config_file) if config_file is not None else None)
    try:
        return HeteroSettings(**overrides)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "settings", HeteroSettings.model_fields)) from None
    finally:
        _config_file.reset(token)


def check_setting_names(names, kind: str = "setting") -> None:
    """Raise ConfigError for a name that is not a setting, naming the closest one."""
    fields = HeteroSettings.model_fields
    unknown = [name for name in names if name not in fields]
    if unknown:
        problems = [f"unknown {kind} {name!r}{did_you_mean(name, fields)}" for name in unknown]
        raise ConfigError("; ".join(problems))


def warn_unknown_env_variables(environ: dict[str, str] | None = None) -> list[str]:
    """Warn about each ``HETERO_*`` variable that names no setting; returns their names."""
    environ = os.environ if environ is None else environ
    known = {ENV_PREFIX + name.upper() for name in HeteroSettings.model_fields} | NON_SETTING_ENV_VARIABLES
    unknown = []
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known:
            continue
        if upper.split("__")[0] in known and "__" in upper:  # HETERO_EXECUTOR__MOCK__SEED: a nested value
            continue
        unknown.append(variable)
        hint = did_you_mean(upper, sorted(known), quote=False)
        message = f"unknown environment variable {variable}, ignored{hint}"
        warnings.warn(message, SettingsWarning, stacklevel=3)
    return unknown
