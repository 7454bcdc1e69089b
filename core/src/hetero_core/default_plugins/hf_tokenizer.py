"""The Hugging Face tokenizer: a model directory's tokenizer.json and chat template.

Built on the light ``tokenizers`` library and ``jinja2`` (both imported when a tokenizer is
created, not with this module) rather than ``transformers``, whose import alone takes about a
second. It follows what ``transformers.AutoTokenizer`` does for a directory with a tokenizer.json
and a generic tokenizer class:

- ``encode`` adds special tokens as tokenizer.json's post-processor says (transformers ignores
  ``add_bos_token`` / ``add_eos_token`` in tokenizer_config.json when tokenizer.json exists);
  the named special tokens of tokenizer_config.json are registered as special tokens;
- ``decode`` skips special tokens, without transformers' (off by default) space clean-up;
- the EOS is generation_config.json's (of a list, the tokenizer's own if listed), and the rest of that
  list are stop ids (``stop_token_ids``), as vLLM reads it;
- the chat template comes from chat_template.jinja, else tokenizer_config.json's
  ``chat_template``, and renders in a sandboxed jinja2 environment set up like transformers'
  (trim_blocks, lstrip_blocks, loopcontrols, ``tojson``, ``raise_exception``, ``strftime_now``),
  with the special tokens as variables; the result is encoded without adding special tokens.

Model-specific transformers tokenizer classes that rebuild the pipeline in Python are not
mirrored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from hetero_core.default_plugins.hf_options import HFTokenizerOptions
from hetero_core.default_plugins.hf_token_bound import max_token_chars
from hetero_core.errors import ConfigError, InvalidRequestError, ModelLoadError
from hetero_core.tokenizer import TokenizerContext

__all__ = ["HFTokenizer", "HFTokenizerOptions", "create_hf_tokenizer"]

# Longer texts are encoded through encode_batch, which lets other Python threads run meanwhile.
GIL_FREE_ENCODE_CHARS = 4096
SPECIAL_TOKEN_NAMES = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"
)  # fmt: skip


class HFTokenizer:
    """Implements ``hetero_core.tokenizer.Tokenizer`` for a local Hugging Face model directory."""

    def __init__(self, model_dir: Path, options: HFTokenizerOptions | None = None) -> None:
        from tokenizers import AddedToken, Tokenizer

        self.options = options or HFTokenizerOptions()
        model_dir = Path(model_dir)
        tokenizer_file = model_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ModelLoadError(f"the hf tokenizer needs {tokenizer_file}, which does not exist")
        try:
            self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
            raise ModelLoadError(f"cannot read {tokenizer_file}: {exc}") from exc
        config = _read_json(model_dir / "tokenizer_config.json")
        self.special_tokens = {
            name: content
            for name in SPECIAL_TOKEN_NAMES
            if (content := _token_content(config.get(name))) is not None
        }
        named = [AddedToken(c, special=True, normalized=False) for c in self.special_tokens.values()]
        self._tokenizer.add_special_tokens(named)
        self.vocab_size: int = self._tokenizer.get_vocab_size(with_added_tokens=True)
        generation_eos = _read_json(model_dir / "generation_config.json").get("eos_token_id")
        self.eos_token_id: int | None = self._find_eos_token_id(model_dir, generation_eos)
        self.stop_token_ids: tuple[int, ...] = self._find_stop_token_ids(generation_eos)
        self.chat_template: str | None = self._find_chat_template(model_dir, config)
        self._template = _compile_chat_template(self.chat_template) if self.chat_template else None

    @cached_property
    def max_token_chars(self) -> int | None:
        """The most characters one token stands for (None: no bound holds for this pipeline).
        Computed on first use (about 0.1 s), which only a text of max_model_len characters needs."""
        tokenizer = self._tokenizer
        model = tokenizer.model
        spec = {
            "normalizer": json.loads(tokenizer.normalizer.__getstate__()) if tokenizer.normalizer else None,
            "pre_tokenizer": json.loads(tokenizer.pre_tokenizer.__getstate__())
            if tokenizer.pre_tokenizer
            else None,
            "model": {
                "type": type(model).__name__,
                "fuse_unk": getattr(model, "fuse_unk", True),
                "byte_fallback": getattr(model, "byte_fallback", False),
            },
        }
        return max_token_chars(spec, tokenizer.get_vocab(with_added_tokens=True))

    @property
    def backend_tokenizer(self):
        """The ``tokenizers.Tokenizer`` underneath (read by the xgrammar structured-output backend)."""
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        return self._encode(text, self.options.add_special_tokens)

    def decode(
        self,
        token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        """The text of ``token_ids``; special tokens left out unless ``skip_special_tokens=False``,
        then with a space between each and its neighbours unless ``spaces_between_special_tokens=False``
        (transformers' joining of text runs and special tokens)."""
        ids = list(token_ids)
        if skip_special_tokens or not spaces_between_special_tokens:
            return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        parts, run = [], []
        for token_id in ids:
            if token_id in self._special_ids:
                if run:
                    parts.append(self._tokenizer.decode(run, skip_special_tokens=False))
                    run = []
                parts.append(self._tokenizer.id_to_token(token_id))
            else:
                run.append(token_id)
        if run:
            parts.append(self._tokenizer.decode(run, skip_special_tokens=False))
        return " ".join(parts)

    @cached_property
    def _special_ids(self) -> frozenset[int]:
        return frozenset(
            i for i, token in self._tokenizer.get_added_tokens_decoder().items() if token.special
        )

    def encode_chat(
        self,
        messages: list[dict[str, str]],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[int]:
        """The chat template (with the generation prompt unless ``add_generation_prompt=False``),
        encoded (its special tokens included); ``tools`` and ``chat_template_kwargs`` are template
        variables, as in transformers' ``apply_chat_template``."""
        return self._encode(
            self.render_chat(messages, add_generation_prompt, tools, chat_template_kwargs), False
        )

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) > GIL_FREE_ENCODE_CHARS:  # the same ids; encode() would hold the GIL throughout
            return self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def render_chat(
        self,
        messages: list[dict[str, str]],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> str:
        if self._template is None:
            raise InvalidRequestError(
                "this model has no chat template; send a plain prompt, or set the hf tokenizer's "
                "chat_template option to a jinja file"
            )
        if not isinstance(messages, list) or not messages:
            raise InvalidRequestError("a chat request needs a non-empty list of messages")
        if not all(isinstance(m, dict) for m in messages):
            raise InvalidRequestError("each chat message must be an object with 'role' and 'content'")
        # Like transformers: a key whose value is None is left out, not rendered as "None".
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        from jinja2 import TemplateError

        try:
            variables = {
                **self.special_tokens,
                **(chat_template_kwargs or {}),
                "messages": messages,
                "add_generation_prompt": add_generation_prompt,
            }
            if tools is not None:
                variables["tools"] = tools
            return self._template.render(**variables)
        except TemplateError as exc:
            raise InvalidRequestError(f"the chat template rejected the messages: {exc}") from exc

    def _find_eos_token_id(self, model_dir: Path, generation_eos: Any) -> int | None:
        """generation_config.json's eos_token_id (of a list, the tokenizer's own eos if listed,
        else the first), else the eos_token of tokenizer_config.json or special_tokens_map.json.
        """
        eos_content = self.special_tokens.get("eos_token") or _token_content(
            _read_json(model_dir / "special_tokens_map.json").get("eos_token")
        )
        tokenizer_eos = self._tokenizer.token_to_id(eos_content) if eos_content else None
        if isinstance(generation_eos, int):
            return generation_eos
        if isinstance(generation_eos, list) and generation_eos:
            return tokenizer_eos if tokenizer_eos in generation_eos else generation_eos[0]
        return tokenizer_eos

    def _find_stop_token_ids(self, listed: Any) -> tuple[int, ...]:
        """The other ids of generation_config.json's ``eos_token_id`` list (Llama 3's ``<|eot_id|>`` and
        ``<|eom_id|>`` beside its EOS; a converted GGUF's end-of-generation tokens): they end a request
        as EOS does, as vLLM adds them to every request's stop ids."""
        if not isinstance(listed, list):
            return ()
        ids = [
            i for i in listed if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.vocab_size
        ]
        return tuple(dict.fromkeys(i for i in ids if i != self.eos_token_id))

    def _find_chat_template(self, model_dir: Path, config: dict[str, Any]) -> str | None:
        if self.options.chat_template is not None:
            path = Path(self.options.chat_template).expanduser()
            if not path.is_file():
                raise ConfigError(f"hf tokenizer option chat_template: no such file: {path}")
            return path.read_text(encoding="utf-8")
        template_file = model_dir / "chat_template.jinja"
        if template_file.is_file():
            return template_file.read_text(encoding="utf-8")
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return template if isinstance(template, str) and template else None


def create_hf_tokenizer(ctx: TokenizerContext) -> HFTokenizer:
    """Factory for the ``hf`` tokenizer: reads the model directory the executor runs."""
    if ctx.model_dir is None:
        raise ConfigError(
            "the hf tokenizer needs a model directory, and the selected executor runs no model; "
            "choose an executor with a model, or the 'byte' tokenizer"
        )
    return HFTokenizer(ctx.model_dir, ctx.options)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _compile_chat_template(source: str):
    """Compile ``source`` in a sandbox set up like transformers' chat template environment."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}`` (assistant-mask markers): body as is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"the chat template does not compile: {exc}") from exc
