"""What the builder does for ``tensor_parallel_size > 1`` or ``pipeline_parallel_size > 1``.
Imports no torch until workers start.

An executor supports tensor parallelism when it is registered with the trait
``tensor_parallel=True`` (``register("torch", factory, tensor_parallel=True)``): its factory then
receives ``ctx.tensor_parallel_rank`` / ``ctx.tensor_parallel_size`` with the default process group
up, builds that rank's shard, and must be picklable (a module-level function of an importable
module, not ``__main__``), since the workers' processes call it too. Pipeline parallelism is the
same with the trait ``pipeline_parallel=True``: the factory also receives
``ctx.pipeline_parallel_rank`` / ``ctx.pipeline_parallel_size`` and builds that stage's layers only.
The group has ``tensor_parallel_size * pipeline_parallel_size`` ranks.
"""

from __future__ import annotations

from pathlib import Path

from hetero_core.errors import ConfigError

TRAIT = "tensor_parallel"
PIPELINE_TRAIT = "pipeline_parallel"


def supports_tensor_parallel(component) -> bool:
    return bool(component.traits.get(TRAIT))


def check_executor(component, registry, size: int, pipeline_size: int = 1) -> None:
    """Refuse an executor that does not declare tensor- (or pipeline-) parallel support, in one line."""
    for trait, what, setting, value in (
        (TRAIT, "tensor parallelism", "tensor_parallel_size", size),
        (PIPELINE_TRAIT, "pipeline parallelism", "pipeline_parallel_size", pipeline_size),
    ):
        if value == 1 or component.traits.get(trait):
            continue
        able = [name for name in registry.names("executor") if _supports(registry, name, trait)]
        hint = f"use --executor {' / '.join(able)} or" if able else "use"
        raise ConfigError(
            f"executor '{component.name}' does not support {what} ({setting} {value}); {hint} {setting} 1"
        )


def check_backend(settings) -> None:
    """Refuse a ``ray_address`` the engine would not use (the ``mp`` backend runs no Ray), in one line."""
    if settings.ray_address is not None and settings.distributed_executor_backend != "ray":
        raise ConfigError(
            f"ray_address {settings.ray_address!r} is the Ray cluster distributed_executor_backend 'ray' "
            "places the ranks on; set distributed_executor_backend = 'ray' (--distributed-executor-backend "
            "ray) or leave ray_address out (hetero serve --replicas takes it for its replicas)"
        )


def check_model(model_dir: Path, size: int, expert_parallel: bool = False, pipeline_size: int = 1) -> None:
    """Refuse a size that does not divide the model's heads, KV heads, MLP or vocabulary (config.json),
    expert parallelism on one rank, on a model without experts or over a size that does not
    divide its experts, and more pipeline stages than the model has layers."""
    if pipeline_size > 1:
        from hetero_core.model.config import ModelConfig
        from hetero_core.model.pipeline_plan import check_pipeline_parallel_size

        check_pipeline_parallel_size(ModelConfig.from_dir(model_dir), pipeline_size)
    if size == 1 and not expert_parallel:
        return
    if size == 1:
        raise ConfigError(
            "enable_expert_parallel splits a model's experts across the tensor_parallel_size ranks; "
            "set tensor_parallel_size > 1 or turn enable_expert_parallel off"
        )
    from hetero_core.model.config import ModelConfig
    from hetero_core.model.tensor_parallel_plan import check_tensor_parallel_size

    config = ModelConfig.from_dir(model_dir)
    check_tensor_parallel_size(config, size)
    if expert_parallel:
        from hetero_core.model.moe.config import check_expert_parallel

        check_expert_parallel(config, size)
    else:
        from hetero_core.model.moe.sharded_experts import check_sharded_experts

        check_sharded_experts(config, size)


def create_executor(component, ctx):
    """The executor for ``ctx``: the component's own for one rank, else rank 0 plus workers."""
    if ctx.tensor_parallel_size == 1 and ctx.pipeline_parallel_size == 1:
        return component.factory(ctx)
    from hetero_core.model.cpu.threads import choose_openmp_wait

    # Before torch loads here; the workers rank 0 starts inherit the environment.
    choose_openmp_wait(getattr(ctx.options, "device", "cpu"))
    from hetero_core.distributed.tensor_parallel_executor import TensorParallelExecutor
    from hetero_core.distributed.worker_launcher import launcher_for

    ctx = pin_auto_dtype(ctx)
    return TensorParallelExecutor(component.factory, ctx, component.name, launcher_for(ctx))


def pin_auto_dtype(ctx):
    """``ctx`` with a ``dtype = "auto"`` option resolved here, once, so every rank runs the dtype
    rank 0 chose (and a worker never resolves it differently)."""
    options = ctx.options
    if getattr(options, "dtype", None) != "auto":
        return ctx
    from dataclasses import replace

    import torch

    from hetero_core.model.cpu.compute_dtype import resolve_dtype

    dtype = resolve_dtype("auto", torch.device(getattr(options, "device", "cpu")))
    return replace(ctx, options=options.model_copy(update={"dtype": str(dtype).removeprefix("torch.")}))


def _supports(registry, name: str, trait: str = TRAIT) -> bool:
    try:
        return bool(registry.get("executor", name).traits.get(trait))
    except Exception:  # a conflicted or failed name: not a suggestion
        return False
