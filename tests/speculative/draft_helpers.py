"""A draft proposer over the embedded SmolLM2 for the tests, and the inputs it takes."""

from __future__ import annotations

from hetero_core.speculative import ProposalInput as Item  # noqa: F401 (Item: the tests import it from here)
from hetero_core.speculative import ProposerContext


def proposer_context(model_dir, k: int = 4, block_size: int = 16, **settings):
    from hetero_core.default_plugins.draft_options import DraftProposerOptions
    from hetero_core.executor import ExecutorContext
    from hetero_core.settings import load_settings

    options = settings.pop("options", None) or DraftProposerOptions(dtype="float32")
    target_settings = load_settings(executor="torch", **settings)
    target = ExecutorContext(  # the target's context, as the builder makes it
        settings=target_settings,
        options=None,
        model_dir=model_dir,
        num_blocks=target_settings.max_num_blocks,
        block_size=block_size,
        max_model_len=2048,
        max_num_batched_tokens=target_settings.max_total_tokens,
        max_num_seqs=8,
        eos_token_id=None,
        vocab_size=49152,
    )
    return ProposerContext(
        options=options,
        num_speculative_tokens=k,
        vocab_size=49152,
        model_dir=model_dir,
        executor="torch",
        block_size=block_size,
        max_model_len=2048,
        max_num_seqs=8,
        cache_dir=target_settings.cache_dir,
        target_executor=target,
    )


def make_draft_proposer(model_dir, **kw):
    from hetero_core.default_plugins.draft import DraftProposer

    return DraftProposer(proposer_context(model_dir, **kw))
