"""Build an Engine from settings: pick each seam's component by name and hand it its options."""

from __future__ import annotations

from pathlib import Path

from hetero_core.engine.block_transfer import block_transfer_options
from hetero_core.engine.engine import Engine
from hetero_core.engine.params import SamplingParams
from hetero_core.engine.scheduler import Scheduler, SchedulerLimits
from hetero_core.errors import ConfigError, InvalidRequestError, PluginError
from hetero_core.executor import ExecutorContext
from hetero_core.plugins import PluginSet, load_plugins
from hetero_core.registry import SEAMS, Component, Registry
from hetero_core.settings import DEFAULT_MODEL, HeteroSettings, load_settings
from hetero_core.tokenizer import TokenizerContext


def build_engine(settings: HeteroSettings | None = None, plugins: PluginSet | None = None) -> Engine:
    settings = settings or load_settings()
    plugins = plugins or load_plugins(allow=settings.plugins)
    registry = plugins.registry
    check_sections(settings, registry)

    executor_c, executor_options = select(settings, registry, "executor")
    preflight = executor_c.traits.get("preflight")
    reasons = preflight() if preflight else []
    if reasons:
        raise PluginError(f"executor '{executor_c.name}' cannot run here: " + "; ".join(reasons))
    model_dir = resolve_model_dir(settings) if executor_c.traits.get("needs_model") else None

    tokenizer_name = settings.tokenizer.name
    if tokenizer_name == "auto":
        tokenizer_name = "hf" if model_dir is not None else "byte"
    tokenizer_c, tokenizer_options = select(settings, registry, "tokenizer", tokenizer_name)
    tokenizer = tokenizer_c.factory(TokenizerContext(settings, tokenizer_options, model_dir))

    policy_c, policy_options = select(settings, registry, "scheduler_policy")
    policy = policy_c.factory(policy_options)
    allocator_c, allocator_options = select(settings, registry, "kv_allocator")
    executor = executor_c.factory(
        ExecutorContext(
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
        )
    )
    # An executor that sizes its KV pool itself (e.g. from GPU memory) says so in num_kv_blocks.
    num_blocks = getattr(executor, "num_kv_blocks", settings.max_num_blocks)
    allocator = allocator_c.factory(num_blocks, settings.block_size, allocator_options)
    limits = SchedulerLimits(
        max_batch_size=settings.max_batch_size,
        max_num_seqs=settings.max_num_seqs,
        max_total_tokens=settings.max_total_tokens,
        max_model_len=settings.max_model_len,
        memory_threshold=settings.memory_threshold,
        max_prefill_chunk=settings.max_prefill_chunk,
    )
    scheduler = Scheduler(policy, allocator, limits, policy_name=policy_c.name,
                          prefix_caching=settings.enable_prefix_caching,
                          **block_transfer_options(executor, executor_c.name, settings))
    return Engine(
        tokenizer=tokenizer,
        executor=executor,
        scheduler=scheduler,
        max_model_len=settings.max_model_len,
        default_params=default_sampling_params(settings),
        sampler_seed=settings.seed,
    )


def default_sampling_params(settings: HeteroSettings, **overrides) -> SamplingParams:
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


def select(settings: HeteroSettings, registry: Registry, seam: str, name: str | None = None):
    """The component chosen for ``seam`` (or ``name``) and its validated options section."""
    component = registry.get(seam, name or settings.component_name(seam))
    return component, component.validate_options(getattr(settings, seam).section(component.name))


def check_sections(settings: HeteroSettings, registry: Registry) -> None:
    """Every options section must name a known component and pass that component's model."""
    for seam in SEAMS:
        for name, section in getattr(settings, seam).sections().items():
            if not isinstance(section, dict):
                raise ConfigError(f"{seam}.{name}: expected a table of options, got {section!r}")
            if name in registry.names(seam):
                component: Component = registry.get(seam, name)
                component.validate_options(section)
            elif not any(f.plugin == name for f in registry.failures):
                available = ", ".join(registry.names(seam))
                raise ConfigError(f"settings section [{seam}.{name}]: unknown {seam} '{name}'; available: {available}")


def resolve_model_dir(settings: HeteroSettings) -> Path:
    """The local HF-layout directory for ``settings.model`` (converting or downloading once)."""
    from hetero_core.model.embedded import ensure_embedded_model
    from hetero_core.model.gguf_cache import ensure_gguf_converted
    from hetero_core.model.loader import resolve_model_source

    if settings.model == DEFAULT_MODEL:
        return ensure_embedded_model(settings.cache_dir)
    path = resolve_model_source(settings.model)
    if path.is_file() and path.suffix == ".gguf":
        return ensure_gguf_converted(path, settings.cache_dir)
    if not (path / "config.json").is_file():
        raise ConfigError(f"model {settings.model!r}: expected an HF model directory (with config.json) or a .gguf file")
    return path
