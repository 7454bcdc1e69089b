"""Build an Engine from settings: pick each seam's component by name and hand it its options.

Callers use ``hetero_core.LLM`` (the public facade); this module never imports it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hetero_core.distributed import engine_setup as tensor_parallel
from hetero_core.engine.engine import Engine
from hetero_core.engine.executor_capabilities import check_capabilities
from hetero_core.engine.kv.block_transfer import block_transfer_options
from hetero_core.engine.kv.kv_transfer import KVConnectorContext
from hetero_core.engine.sampling.structured_output import StructuredOutput
from hetero_core.engine.scheduling.scheduler import Scheduler, SchedulerLimits
from hetero_core.engine.speculation.speculation import Speculation
from hetero_core.errors import (
    ConfigError,
    ModelLoadError,
    PluginError,
    UnknownComponentError,
)
from hetero_core.executor import ExecutorContext
from hetero_core.logging import get_logger
from hetero_core.model.config import ModelConfig
from hetero_core.plugin_system.checks import check_components
from hetero_core.plugin_system.discovery import AUTOLOAD_ENV, PluginSet, load_plugins
from hetero_core.plugin_system.installed import install_architectures, installed_architectures
from hetero_core.plugin_system.registry import Component, Registry
from hetero_core.plugin_system.seams import SEAM_TABLE
from hetero_core.sampling_defaults import default_sampling_params
from hetero_core.settings import DEFAULT_MODEL, HeteroSettings, load_settings
from hetero_core.speculative import ProposerContext
from hetero_core.structured_output import StructuredOutputContext
from hetero_core.suggest import did_you_mean
from hetero_core.tokenizer import TokenizerContext

log = get_logger("hetero.builder")


def build_engine(settings: HeteroSettings | None = None, plugins: PluginSet | None = None) -> Engine:
    settings = settings or load_settings()
    plugins = plugins or load_plugins(allow=settings.plugins)
    install_architectures(plugins.registry.architectures)  # what model loading looks config.json up in
    check_allow_list(settings.plugins, plugins)
    check_sections(settings, plugins.registry)
    tensor_parallel.check_backend(settings)

    executor_c, executor_options = select(settings, plugins, "executor")
    tensor_parallel.check_executor(
        executor_c, plugins.registry, settings.tensor_parallel_size, settings.pipeline_parallel_size
    )
    preflight = executor_c.traits.get("preflight")
    reasons = preflight(executor_options) if preflight else []
    if reasons:
        raise PluginError(f"executor '{executor_c.name}' cannot run here: " + "; ".join(reasons))
    model_dir = resolve_model_dir(settings) if executor_c.traits.get("needs_model") else None
    if model_dir is not None:
        settings = fit_max_model_len(settings, model_dir)
        tensor_parallel.check_model(
            model_dir,
            settings.tensor_parallel_size,
            settings.enable_expert_parallel,
            settings.pipeline_parallel_size,
        )

    tokenizer_name = settings.tokenizer.name
    if tokenizer_name == "auto":
        tokenizer_name = "hf" if model_dir is not None else "byte"
    tokenizer_c, tokenizer_options = select(settings, plugins, "tokenizer", tokenizer_name)
    tokenizer = tokenizer_c.factory(TokenizerContext(tokenizer_options, model_dir))

    policy_c, policy_options = select(settings, plugins, "scheduler_policy")
    policy = policy_c.factory(policy_options)
    check_components(plugins, {"tokenizer": (tokenizer_c, tokenizer), "scheduler_policy": (policy_c, policy)})
    allocator_c, allocator_options = select(settings, plugins, "kv_allocator")
    if getattr(allocator_options, "max_model_len", 0) is None:  # an allocator option left to the engine's
        allocator_options = allocator_options.model_copy(update={"max_model_len": settings.max_model_len})
    executor_context = ExecutorContext(
        settings=settings,
        options=executor_options,
        model_dir=model_dir,
        num_blocks=settings.max_num_blocks,
        block_size=settings.block_size,
        max_model_len=settings.max_model_len,
        max_num_batched_tokens=settings.max_total_tokens,
        max_num_seqs=settings.max_batch_size,
        eos_token_id=tokenizer.eos_token_id,
        vocab_size=tokenizer.vocab_size,
        num_swap_blocks=settings.num_swap_blocks if settings.preemption_mode == "swap" else 0,
        tensor_parallel_size=settings.tensor_parallel_size,
        enable_expert_parallel=settings.enable_expert_parallel,
        pipeline_parallel_size=settings.pipeline_parallel_size,
    )
    executor = tensor_parallel.create_executor(executor_c, executor_context)
    try:  # whatever fails from here on, the executor (its memory, its workers) is released
        check_components(plugins, {"executor": (executor_c, executor)})
        capabilities = check_capabilities(executor, executor_c.name)
        # An executor that sizes its KV pool itself (e.g. from GPU memory) declares num_kv_blocks.
        num_blocks = capabilities.num_kv_blocks or settings.max_num_blocks
        if settings.kv_cache_memory is not None and capabilities.num_kv_blocks is None:
            raise ConfigError(
                f"kv_cache_memory sizes the torch executor's KV cache on the CPU; executor "
                f"{executor_c.name!r} here does not size its pool from it: set max_num_blocks instead"
            )
        allocator = allocator_c.factory(num_blocks, settings.block_size, allocator_options)
        check_components(plugins, {"kv_allocator": (allocator_c, allocator)})
        limits = SchedulerLimits(
            max_batch_size=settings.max_batch_size,
            max_num_seqs=settings.max_num_seqs,
            max_total_tokens=settings.max_total_tokens,
            max_model_len=settings.max_model_len,
            memory_threshold=settings.memory_threshold,
            max_prefill_chunk=settings.max_prefill_chunk,
        )
        scheduler = Scheduler(
            policy,
            allocator,
            limits,
            policy_name=policy_c.name,
            prefix_caching=settings.enable_prefix_caching,
            **block_transfer_options(executor, executor_c.name, settings),
        )
        speculation = speculative_decoding(
            settings, plugins, executor, executor_c.name, tokenizer, executor_context
        )
        try:
            return Engine(
                tokenizer=tokenizer,
                executor=executor,
                scheduler=scheduler,
                max_model_len=settings.max_model_len,
                default_params=default_sampling_params(settings),
                sampler_seed=settings.seed,
                structured_output=structured_output(settings, plugins, tokenizer, executor),
                async_scheduling=use_async_scheduling(
                    settings, executor, executor_c.name, speculation is not None
                ),
                speculation=speculation,
                pipelined_steps=use_pipelined_steps(settings, capabilities, speculation is not None),
            )
        except BaseException:
            if speculation is not None:
                speculation.shutdown()
            raise
    except BaseException:
        if callable(getattr(executor, "shutdown", None)):  # one without it is what check_components refuses
            executor.shutdown()
        raise


def structured_output(settings: HeteroSettings, plugins: PluginSet, tokenizer, executor) -> StructuredOutput:
    """The engine's structured output: the chosen backend, created on the first guided request."""
    component, options = select(settings, plugins, "structured_output")
    vocab_size = max(tokenizer.vocab_size, executor.capabilities.vocab_size or 0)
    context = StructuredOutputContext(options, tokenizer, vocab_size)

    def create():
        backend = component.factory(context)
        check_components(plugins, {"structured_output": (component, backend)})
        return backend

    return StructuredOutput(create, vocab_size, component.name)


def speculative_decoding(
    settings: HeteroSettings,
    plugins: PluginSet,
    executor,
    executor_name: str,
    tokenizer,
    executor_context: ExecutorContext,
) -> Speculation | None:
    """The engine's speculation (its proposer built), or None when ``num_speculative_tokens`` is 0."""
    k = settings.num_speculative_tokens
    if k == 0:
        return None
    if not executor.capabilities.supports_speculative_decoding:
        raise PluginError(
            f"executor '{executor_name}' cannot verify speculative tokens (its capabilities do not declare "
            "supports_speculative_decoding=True: one output row per proposed token, docs/hooks.md); "
            "set num_speculative_tokens = 0 or pick an executor that can (torch, triton, cuda, mock)"
        )
    component, options = select(settings, plugins, "speculative_proposer")
    vocab_size = max(tokenizer.vocab_size, executor.capabilities.vocab_size or 0)
    context = ProposerContext(
        options=options,
        num_speculative_tokens=k,
        vocab_size=vocab_size,
        model_dir=executor_context.model_dir,
        executor=executor_name,
        block_size=settings.block_size,
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_batch_size,
        eos_token_id=tokenizer.eos_token_id,
        cache_dir=settings.cache_dir,
        target_executor=executor_context,
    )
    proposer = component.factory(context)
    check_components(plugins, {"speculative_proposer": (component, proposer)})
    log.info("engine.speculative_decoding", proposer=component.name, num_speculative_tokens=k)
    return Speculation(proposer, k, settings.max_model_len, vocab_size, name=component.name)


def use_async_scheduling(
    settings: HeteroSettings, executor, executor_name: str, speculating: bool = False
) -> bool:
    """The setting, or the executor's preference (``capabilities.prefers_async_scheduling``).
    Off while speculating (a verifying step's tokens decide the next step's inputs)."""
    preferred = executor.capabilities.prefers_async_scheduling
    chosen = preferred if settings.async_scheduling is None else settings.async_scheduling
    if speculating and chosen:
        log.info(
            "engine.async_scheduling",
            enabled=False,
            executor=executor_name,
            reason="speculative decoding (num_speculative_tokens > 0) runs steps in sync",
        )
        return False
    log.info(
        "engine.async_scheduling",
        enabled=chosen,
        executor=executor_name,
        executor_prefers=preferred,
        source="executor" if settings.async_scheduling is None else "settings",
    )
    return chosen


def use_pipelined_steps(settings: HeteroSettings, capabilities, speculating: bool) -> bool:
    """Two steps in flight on an executor that declares ``pipelined_steps`` (pipeline stages), unless
    ``async_scheduling = false`` asks for one step at a time, or speculative decoding needs it."""
    return capabilities.pipelined_steps and not speculating and settings.async_scheduling is not False


def select(settings: HeteroSettings, plugins: PluginSet, seam: str, name: str | None = None):
    """The component chosen for ``seam`` (or ``name``) and its validated options section."""
    name = name or settings.component_name(seam)
    try:
        component = plugins.registry.get(seam, name)
    except UnknownComponentError as exc:
        raise UnknownComponentError(str(exc) + disabled_hint(plugins, name)) from None
    section = getattr(settings, seam).section(component.name)
    if seam == "executor":
        section = executor_section(component, settings, section)
    return component, component.validate_options(section)


def executor_section(component, settings: HeteroSettings, section: dict) -> dict:
    """The executor's options ``section`` with the top-level ``dtype`` and ``quantization`` applied."""
    if settings.dtype is not None:
        section = {**section, "dtype": executor_dtype(component, settings.dtype)}
    if settings.quantization is not None:
        section = {
            **section,
            "quantization": executor_dtype(component, settings.quantization, "quantization"),
        }
    return section


def executor_dtype(component, dtype: str, option: str = "dtype") -> str:
    """The top-level ``dtype`` (or ``option``) setting, for an executor whose options have that field."""
    fields = getattr(component.options, "model_fields", {})
    if option not in fields:
        raise ConfigError(
            f"{option}: executor '{component.name}' has no {option} option; leave {option} unset"
        )
    return dtype


def disabled_hint(plugins: PluginSet, name: str) -> str:
    """What the plugins allow-list left out, for an "unknown component" message."""
    left_out = sorted(info.name for info in plugins.plugins if info.status == "not allowed")
    if not left_out:
        return ""
    if name in left_out:
        return (
            f"; plugin '{name}' is installed but disabled by the plugins allow-list "
            "(HETERO_PLUGINS / --plugins); add it to the list"
        )
    return f"; disabled by the plugins allow-list (HETERO_PLUGINS / --plugins): {', '.join(left_out)}"


def check_allow_list(allow: list[str] | None, plugins: PluginSet) -> None:
    """Every name in the plugins allow-list must be an installed plugin."""
    if allow is None:
        return
    installed = sorted({info.name for info in plugins.plugins} - {"core"})
    missing = [name for name in allow if name not in installed and name != "core"]
    if not missing:
        return
    hint = did_you_mean(missing[0], installed)
    autoload = f" (plugin autoload is off: {AUTOLOAD_ENV} is set)" if os.environ.get(AUTOLOAD_ENV) else ""
    raise PluginError(
        f"the plugins allow-list (HETERO_PLUGINS / --plugins) names {', '.join(map(repr, missing))}, "
        f"which is not installed; installed plugins: {', '.join(installed) or '(none)'}{autoload}{hint}"
    )


def check_sections(settings: HeteroSettings, registry: Registry) -> None:
    """Every options section must name a known component and pass that component's model."""
    for seam in (s.name for s in SEAM_TABLE):
        for name, section in getattr(settings, seam).sections().items():
            if not isinstance(section, dict):
                raise ConfigError(f"{seam}.{name}: expected a table of options, got {section!r}")
            if name in registry.names(seam):
                component: Component = registry.get(seam, name)
                component.validate_options(section)
            elif not any(f.plugin == name for f in registry.failures):
                names = registry.names(seam)
                raise ConfigError(
                    f"settings section [{seam}.{name}]: unknown {seam} '{name}'; "
                    f"available: {', '.join(names)}{did_you_mean(name, names)}"
                )


def resolve_model_dir(settings: HeteroSettings) -> Path:
    """The local HF-layout directory for ``settings.model`` (converting or downloading once)."""
    from hetero_core.model.embedded import ensure_embedded_model
    from hetero_core.model.gguf_cache import ensure_gguf_converted
    from hetero_core.model.source import resolve_model_source

    if settings.model == DEFAULT_MODEL:
        return ensure_embedded_model(settings.cache_dir)
    path = resolve_model_source(settings.model)
    if path.is_file() and path.suffix == ".gguf":
        return ensure_gguf_converted(path, settings.cache_dir)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model {settings.model!r}: expected an HF model directory (with config.json) or a .gguf file"
        )
    return path


def fit_max_model_len(settings: HeteroSettings, model_dir: Path) -> HeteroSettings:
    """Check max_model_len against the model's position limit (config.json, no weights read).

    Set explicitly beyond the limit: refused with both numbers. Left at its default: lowered to it.
    """
    limit = model_position_limit(model_dir)
    if limit is None or settings.max_model_len <= limit:
        return settings
    if "max_model_len" in settings.model_fields_set:
        raise ConfigError(
            f"max_model_len {settings.max_model_len} exceeds the model's position limit of {limit} "
            f"(max_position_embeddings in {model_dir / 'config.json'}); set --max-model-len {limit} or less"
        )
    log.info("settings.max_model_len_lowered", max_model_len=limit, default=settings.max_model_len)
    return settings.model_copy(update={"max_model_len": limit})


def model_position_limit(model_dir: Path) -> int | None:
    """``max_position_embeddings`` from the model's config.json (the lower of the file's and its
    registered architecture's parsed one), or None if it has none."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    limit = config.get("max_position_embeddings") if isinstance(config, dict) else None
    limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
    registered = installed_architectures().names()
    if isinstance(config, dict) and any(name in registered for name in config.get("architectures") or []):
        # as its architecture runs it (e.g. capped at a sliding window it does not implement)
        parsed = ModelConfig.from_dict(config, source=str(path)).max_position_embeddings
        limit = parsed if limit is None else min(limit, parsed)
    return limit


def build_kv_connector(settings: HeteroSettings | None = None, plugins: PluginSet | None = None):
    """The KV connector ``settings.kv_connector`` names (prefill/decode disaggregation), built and checked."""
    settings = settings or load_settings()
    plugins = plugins or load_plugins(allow=settings.plugins)
    component, options = select(settings, plugins, "kv_connector")
    connector = component.factory(KVConnectorContext(options))
    check_components(plugins, {"kv_connector": (component, connector)})
    return connector
