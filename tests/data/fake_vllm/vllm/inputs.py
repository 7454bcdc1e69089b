"""``vllm.inputs.TokensPrompt``: a dict with ``prompt_token_ids`` (as vLLM's TypedDict)."""


def TokensPrompt(prompt_token_ids):  # noqa: N802 (vLLM's name)
    return {"prompt_token_ids": list(prompt_token_ids)}
