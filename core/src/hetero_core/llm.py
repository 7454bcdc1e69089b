"""LLM: the public facade, shaped after vLLM's ``LLM``. The one top-level place that builds an engine.

    from hetero_core import LLM, SamplingParams

    llm = LLM(executor="mock")                       # or LLM() for the embedded model on the CPU
    for out in llm.generate(["Hello", "The sky is"], SamplingParams(max_tokens=16)):
        print(out.finish_reason, out.text)
    print(llm.chat([{"role": "user", "content": "Hi!"}])[0].text)

``generate`` and ``chat`` are safe from several threads: their requests join the same batches and
each call gets its own outputs (``SharedEngine``). ``llm.engine`` is the underlying ``Engine``
(``add_request`` / ``step`` / ``abort``) for callers that drive the loop themselves, e.g. to stream;
it is single-threaded, and refuses (``ConcurrentEngineUseError``) a thread that drives it while
another thread is inside it or while ``generate`` / ``chat`` calls are running.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hetero_core.builder import build_engine, resolve_model_dir
from hetero_core.engine.engine import Engine
from hetero_core.engine.requests.chat_options import chat_options, encode_chat
from hetero_core.engine.requests.outputs import RequestOutput
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.requests.prompts import as_prompt_list
from hetero_core.engine.shared_engine import SharedEngine
from hetero_core.errors import InvalidRequestError
from hetero_core.llm_progress import GenerateProgress
from hetero_core.plugin_system.discovery import PluginSet, load_plugins
from hetero_core.settings import HeteroSettings, load_settings
from hetero_core.speculative_config import speculative_settings

# text, token ids, or a vLLM prompt dict: {"prompt": text} / {"prompt_token_ids": ids}
PromptInput = str | list[int] | dict[str, Any]
Messages = list[dict[str, Any]]
ParamsInput = SamplingParams | Sequence[SamplingParams | None] | None


class LLM:
    """An engine built from settings, with batch ``generate`` and ``chat`` (safe from several threads).

    ``model``: the embedded model's name (default), a local HF directory, a .gguf file or a hub id.
    ``executor``: an executor name ("torch" unless settings say otherwise: ``HETERO_EXECUTOR``, the
    settings file) or a table with options (``{"name": "mock", "mock": {"eos_after": 5}}``).
    ``**settings``: any setting of ``HeteroSettings`` (``max_num_blocks=256``, ``temperature=0.7``);
    an unknown keyword is a ConfigError naming the closest setting. ``config_file``: a TOML/JSON
    settings file. ``plugin_set``: a ``load_plugins(...)`` result to use instead of discovery.
    ``speculative_config``: vLLM's dict (``{"method": "ngram", "num_speculative_tokens": 3,
    "prompt_lookup_max": 4}``), the same as the settings ``num_speculative_tokens`` and
    ``speculative_proposer`` (``speculative_config.py``).
    """

    def __init__(
        self,
        model: str | None = None,
        executor: str | dict | None = None,
        *,
        config_file: str | Path | None = None,
        plugin_set: PluginSet | None = None,
        speculative_config: dict[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        if speculative_config is not None:
            settings.update(speculative_settings(speculative_config))
        if model is not None:
            settings["model"] = model
        if executor is not None:
            settings["executor"] = executor
        self._start(load_settings(config_file, **settings), plugin_set)

    @classmethod
    def from_settings(cls, settings: HeteroSettings, plugin_set: PluginSet | None = None) -> LLM:
        """An LLM for settings already loaded (the CLI loads them from flags)."""
        llm = cls.__new__(cls)
        llm._start(settings, plugin_set)
        return llm

    def _start(self, settings: HeteroSettings, plugin_set: PluginSet | None) -> None:
        self.settings = settings
        self._plugin_set = plugin_set or load_plugins(allow=settings.plugins)
        self.engine: Engine = build_engine(settings, self._plugin_set)
        self._shared = SharedEngine(self.engine)

    # -- generation -------------------------------------------------------------------------------
    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: ParamsInput = None,
        use_tqdm: bool | Callable[..., Any] = True,
    ) -> list[RequestOutput]:
        """Complete each prompt; outputs in input order. A bad prompt fails alone (``out.error``).

        ``prompts``: one prompt or a list; a prompt is a string, a list of token ids, or a dict
        with "prompt" or "prompt_token_ids". ``sampling_params``: one for all, one per prompt,
        or None for the settings' defaults. Every prompt is checked before any is queued. Safe to
        call from several threads at once. ``use_tqdm``: a progress bar on stderr as vLLM's
        (``llm_progress``), or a callable that makes the tqdm bar.
        """
        prompt_list = as_prompt_list(prompts)
        return self._run(prompt_list, _params_per_prompt(sampling_params, len(prompt_list)), use_tqdm)

    def chat(
        self,
        messages: Messages | Sequence[Messages],
        sampling_params: ParamsInput = None,
        use_tqdm: bool | Callable[..., Any] = True,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict] | None = None,
    ) -> list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"} messages) or a list of them,
        through the model's chat template; outputs in input order. As in vLLM: ``add_generation_prompt``
        (False: the template's assistant header is left out), ``chat_template_kwargs`` (more variables
        for the template, e.g. ``{"enable_thinking": False}``) and ``tools`` (OpenAI-style tool
        definitions, passed to the template as ``tools``) go to the tokenizer's ``encode_chat``."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise InvalidRequestError("chat takes a non-empty list of messages, or a list of conversations")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        for i, conversation in enumerate(conversations):
            if not isinstance(conversation, (list, tuple)):
                raise InvalidRequestError(
                    f"conversation {i} must be a list of messages, got {type(conversation).__name__}"
                )
        prompts = [list(c) for c in conversations]
        options = chat_options(add_generation_prompt, chat_template_kwargs, tools)
        if options:  # rendered here, with the options; the engine gets the token ids
            prompts = [{"prompt_token_ids": encode_chat(self.engine.tokenizer, c, options)} for c in prompts]
        return self._run(prompts, _params_per_prompt(sampling_params, len(prompts)), use_tqdm)

    def _run(self, prompts: list, params: list, use_tqdm) -> list[RequestOutput]:
        progress = GenerateProgress(use_tqdm, sum(p.num_samples if p else 1 for p in params))
        try:
            return self._shared.run(prompts, params, on_finished=progress.update)
        finally:
            progress.close()

    # -- the rest ---------------------------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        """Whether the model's tokenizer has a chat template (the byte tokenizer has none)."""
        return getattr(self.engine.tokenizer, "chat_template", None) is not None

    @property
    def model_dir(self) -> Path | None:
        """The local HF directory of the model the executor runs (the embedded model or a .gguf as
        converted once, in the cache); None when the executor runs no model (mock)."""
        executor = self._plugin_set.registry.get("executor", self.settings.component_name("executor"))
        return resolve_model_dir(self.settings) if executor.traits.get("needs_model") else None

    def get_tokenizer(self):
        return self.engine.tokenizer

    def shutdown(self) -> None:
        """Release the executor (its KV cache and model); the LLM cannot generate afterwards. Calls
        still running in other threads end with their requests aborted."""
        self._shared.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"LLM(model={self.settings.model!r}, executor={self.settings.executor.name!r})"


def _params_per_prompt(params: ParamsInput, num_prompts: int) -> list[SamplingParams | None]:
    if params is None or isinstance(params, SamplingParams):
        return [params] * num_prompts
    if not isinstance(params, (list, tuple)):
        raise InvalidRequestError(
            f"sampling_params must be a SamplingParams, a list of them, or None; got {type(params).__name__}"
        )
    if len(params) != num_prompts:
        raise InvalidRequestError(f"got {len(params)} sampling params for {num_prompts} prompts")
    for i, p in enumerate(params):
        if p is not None and not isinstance(p, SamplingParams):
            raise InvalidRequestError(
                f"sampling_params[{i}] must be a SamplingParams, got {type(p).__name__}"
            )
    return list(params)
