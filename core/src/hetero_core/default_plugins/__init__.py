"""Core's own components, registered through the same hooks as any installed plugin.

Factories import their heavy dependencies (torch, tokenizers) only when called, so listing plugins
or running the mock executor never imports torch.
"""

from hetero_core.plugin_system.hookspecs import hookimpl


@hookimpl
def register_tokenizers(register):
    from hetero_core.default_plugins.hf_options import HFTokenizerOptions

    register("byte", _create_byte_tokenizer)
    register("hf", _create_hf_tokenizer, options=HFTokenizerOptions)


@hookimpl
def register_scheduler_policies(register):
    register("fcfs", _create_fcfs_policy)
    register("priority", _create_priority_policy)


@hookimpl
def register_kv_allocators(register):
    from hetero_core.default_plugins.contiguous_options import ContiguousAllocatorOptions

    register("paged", _create_paged_allocator)
    register("contiguous", _create_contiguous_allocator, options=ContiguousAllocatorOptions)


@hookimpl
def register_executors(register):
    from hetero_core.default_plugins.torch_options import TorchExecutorOptions

    register(
        "torch",
        _create_torch_executor,
        options=TorchExecutorOptions,
        needs_model=True,
        preflight=_missing_real_model_packages,
        tensor_parallel=True,
        pipeline_parallel=True,
    )


@hookimpl
def register_model_architectures(register):
    from hetero_core.model.llama_architecture import llama_architectures
    from hetero_core.model.mla.architecture import mla_architectures
    from hetero_core.model.moe.architecture import moe_architectures

    for name, architecture in {**llama_architectures(), **moe_architectures(), **mla_architectures()}.items():
        register(name, architecture)


@hookimpl
def register_structured_output_backends(register):
    from hetero_core.default_plugins.xgrammar_options import XGrammarOptions

    register("xgrammar", _create_xgrammar_backend, options=XGrammarOptions)


@hookimpl
def register_kv_connectors(register):
    from hetero_core.default_plugins.socket_connector import SocketConnectorOptions

    register("socket", _create_socket_connector, options=SocketConnectorOptions)


def _create_socket_connector(ctx):
    from hetero_core.default_plugins.socket_connector import create_socket_connector

    return create_socket_connector(ctx)


@hookimpl
def register_speculative_proposers(register):
    from hetero_core.default_plugins.draft_options import DraftProposerOptions
    from hetero_core.default_plugins.ngram_options import NgramOptions

    register("ngram", _create_ngram_proposer, options=NgramOptions)
    register("draft", _create_draft_proposer, options=DraftProposerOptions)


def _create_ngram_proposer(ctx):
    from hetero_core.default_plugins.ngram_proposer import NgramProposer

    return NgramProposer(ctx)


def _create_draft_proposer(ctx):
    from hetero_core.default_plugins.torch_requirements import require_real_model_packages

    require_real_model_packages("the draft proposer")
    from hetero_core.default_plugins.draft import DraftProposer

    return DraftProposer(ctx)


def _create_xgrammar_backend(ctx):
    from hetero_core.default_plugins.xgrammar_backend import create_xgrammar_backend

    return create_xgrammar_backend(ctx)


def _create_byte_tokenizer(ctx):
    from hetero_core.default_plugins.byte_tokenizer import create_byte_tokenizer

    return create_byte_tokenizer(ctx)


def _create_hf_tokenizer(ctx):
    from hetero_core.default_plugins.hf_tokenizer import create_hf_tokenizer
    from hetero_core.default_plugins.torch_requirements import require_real_model_packages

    require_real_model_packages("the hf tokenizer")

    return create_hf_tokenizer(ctx)


def _create_fcfs_policy(options):
    from hetero_core.default_plugins.policies import FcfsPolicy

    return FcfsPolicy()


def _create_priority_policy(options):
    from hetero_core.default_plugins.policies import PriorityPolicy

    return PriorityPolicy()


def _create_paged_allocator(num_blocks, block_size, options):
    from hetero_core.engine.kv.block_allocator import PagedBlockAllocator

    return PagedBlockAllocator(num_blocks, block_size)


def _create_contiguous_allocator(num_blocks, block_size, options):
    from hetero_core.engine.kv.contiguous_allocator import ContiguousBlockAllocator

    return ContiguousBlockAllocator(num_blocks, block_size, options.max_model_len)


def _missing_real_model_packages(options):
    from hetero_core.default_plugins.torch_requirements import missing_real_model_packages

    return missing_real_model_packages()


def _create_torch_executor(ctx):
    from hetero_core.default_plugins.torch_requirements import require_real_model_packages

    require_real_model_packages("the torch executor")
    from hetero_core.model.cpu.threads import choose_openmp_wait

    choose_openmp_wait(ctx.options.device if ctx.options is not None else "cpu")  # before torch loads
    from hetero_core.default_plugins.torch_executor import TorchExecutor

    return TorchExecutor(ctx)
