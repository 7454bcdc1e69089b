"""The progress bar of ``LLM.generate`` / ``chat`` (``use_tqdm``), as vLLM draws it.

    Processed prompts: 100%|██████████| 4/4 [00:01<00:00,  3.2it/s,
        est. speed input: 25.6 toks/s, output: 409.6 toks/s]

One tick per completion (``n`` per prompt), on stderr; the postfix counts the prompt tokens once
per completion and every output token, over the seconds since the bar started. ``use_tqdm`` may
also be a callable that makes the bar (``functools.partial(tqdm, leave=False)``), as in vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class GenerateProgress:
    def __init__(self, use_tqdm: bool | Callable[..., Any], total: int) -> None:
        self._bar = None
        if use_tqdm:
            make = use_tqdm if callable(use_tqdm) else _tqdm()
            self._bar = make(
                total=total,
                desc="Processed prompts",
                dynamic_ncols=True,
                postfix=f"est. speed input: {0:.2f} toks/s, output: {0:.2f} toks/s",
            )
        self._input_tokens = self._output_tokens = 0

    def update(self, outputs: list) -> None:
        """Tick for the requests that finished (``RequestOutput``s)."""
        if self._bar is None or not outputs:
            return
        ticks = 0
        for out in outputs:
            completions = out.outputs or [out]
            ticks += len(completions)
            self._input_tokens += len(out.prompt_token_ids) * len(completions)
            self._output_tokens += sum(
                len(getattr(c, "token_ids", out.output_token_ids)) for c in completions
            )
        elapsed = self._bar.format_dict.get("elapsed") or 0.0
        if elapsed > 0:
            self._bar.postfix = (
                f"est. speed input: {self._input_tokens / elapsed:.2f} toks/s, "
                f"output: {self._output_tokens / elapsed:.2f} toks/s"
            )
        self._bar.update(ticks)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _tqdm():
    from tqdm.auto import tqdm

    return tqdm
