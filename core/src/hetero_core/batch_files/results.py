"""The records of a batch run's output, one per line of the input (``batch_output`` writes them).

Hetero's format: ``{"id", "text", "num_prompt_tokens", "num_output_tokens", "finish_reason"}``,
plus ``"logprobs"`` when the line asked for them (one ``{"token", "token_id", "logprob",
"top_logprobs"}`` per output token), ``"prompt_logprobs"`` when it asked for those (vLLM's shape:
null, then ``{token id: {"logprob", "rank", "decoded_token"}}`` per prompt token) and ``"error"``
when the request failed. OpenAI's (as vLLM's ``run-batch`` writes it): ``{"id", "custom_id",
"response": {"status_code", "request_id", "body"}, "error"}``, the body built from the server's own
response models, logprobs included. A malformed
line's record has the same fields (the id null when the line has no valid one), an error, and
``"line"``, its line number: the one field no other record has.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from hetero_core.batch_files.input_file import NATIVE, BatchRequest, Malformed


def result_record(
    batch_format: str, request: BatchRequest, outputs: list, model_name: str, tokenizer=None
) -> dict[str, Any]:
    """The record of a finished request; ``outputs``: one per choice, in order (a refused choice is
    an object with ``error`` set). ``tokenizer``: to write logprobs' tokens as text (needed when a
    request asked for logprobs)."""
    if batch_format == NATIVE:
        return _native(request, outputs[0], tokenizer)
    outputs = [one for output in outputs for one in completions(output)]
    logprobs = [_logprobs(output, tokenizer) for output in outputs]
    return _openai(request, outputs, model_name, logprobs, tokenizer)


def completions(output) -> list:
    """A request's output as one output per completion (``SamplingParams(n=...)``), in order."""
    if output.error is not None or len(getattr(output, "outputs", ())) < 2:
        return [output]
    return [
        replace(
            output,
            output_token_ids=c.token_ids,
            text=c.text,
            logprobs=c.logprobs,
            finish_reason=c.finish_reason,
            outputs=[c],
        )
        for c in output.outputs
    ]


def malformed_record(batch_format: str, bad: Malformed) -> dict[str, Any]:
    """The record of a line that was not run: its id (or null), its line number and why."""
    if batch_format == NATIVE:
        return {
            "id": bad.id,
            "line": bad.line_number,
            "text": "",
            "num_prompt_tokens": 0,
            "num_output_tokens": 0,
            "finish_reason": None,
            "error": bad.reason,
        }
    return {
        "id": f"hetero-{uuid.uuid4().hex}",
        "custom_id": bad.id,
        "line": bad.line_number,
        "response": {"status_code": 400, "request_id": f"hetero-batch-{uuid.uuid4().hex}", "body": None},
        "error": _error(bad.reason, 400),
    }


def _error(message: str, status: int) -> dict[str, Any]:
    kind = "BadRequestError" if status == 400 else "InternalServerError"
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def _logprobs(output, tokenizer) -> list | None:
    """The output's logprobs as ``TokenLogprob``s, or None when its request asked for none."""
    from hetero_core.async_llm.request_stream import token_logprobs

    entries = getattr(output, "logprobs", None)
    if entries is None or output.error is not None:
        return None
    return token_logprobs(tokenizer, output.output_token_ids, entries)


def _native(request: BatchRequest, output, tokenizer) -> dict[str, Any]:
    record = {
        "id": request.id,
        "text": output.text,
        "num_prompt_tokens": len(output.prompt_token_ids),
        "num_output_tokens": len(output.output_token_ids),
        "finish_reason": output.finish_reason,
    }
    if getattr(output, "prompt_logprobs", None) is not None and output.error is None:
        from hetero_core.openai_api.convert import prompt_logprobs_out

        record["prompt_logprobs"] = prompt_logprobs_out(output)
    if getattr(output, "logprobs", None) is not None and output.error is None:
        record["logprobs"] = [
            _native_logprob(tokenizer, token_id, lp)
            for token_id, lp in zip(output.output_token_ids, output.logprobs)
        ]
    if output.error is not None:
        record["error"] = output.error
    return record


def _native_logprob(tokenizer, token_id: int, lp) -> dict[str, Any]:
    """One output token: its text, id and logprob (None when the executor gave no logits), and
    its top alternatives, best first."""

    def token(tid: int) -> dict[str, Any]:
        return {"token": tokenizer.decode([tid]), "token_id": tid}

    if lp is None:
        return {**token(token_id), "logprob": None, "top_logprobs": []}
    return {
        **token(token_id),
        "logprob": lp.logprob,
        "top_logprobs": [{**token(tid), "logprob": value} for tid, value in lp.top],
    }


def _openai(
    request: BatchRequest, outputs: list, model_name: str, logprobs: list, tokenizer=None
) -> dict[str, Any]:
    from hetero_core.openai_api.convert import chat_logprobs, finish_reason, prompt_logprobs_out, usage
    from hetero_core.openai_api.echo import completion_choice, echo_usage
    from hetero_core.openai_api.protocol import (
        ChatChoice,
        ChatCompletionResponse,
        ChatMessageOut,
        CompletionResponse,
    )
    from hetero_core.openai_api.tools import answer, tool_call_out, tool_mode

    request_id = f"hetero-batch-{uuid.uuid4().hex}"
    failed = [o for o in outputs if o.error is not None]
    record = {"id": f"hetero-{uuid.uuid4().hex}", "custom_id": request.id}
    if failed:
        status = 400 if any(getattr(o, "refused", False) for o in failed) else 500
        record["response"] = {"status_code": status, "request_id": request_id, "body": None}
        record["error"] = _error(failed[0].error, status)
        return record
    n = request.body.n
    if request.url == "/v1/completions":

        def decode(token_id: int) -> str:
            return tokenizer.decode([token_id])

        choices = [
            completion_choice(request.body, i, o, o.text, lp or [], True, True, decode)
            for i, (o, lp) in enumerate(zip(outputs, logprobs))
        ]
        body = CompletionResponse(
            id=f"cmpl-{uuid.uuid4().hex}",
            model=model_name,
            choices=choices,
            usage=echo_usage(usage(outputs, n), request.body.generates),
        )
    else:
        mode = tool_mode(request.body)
        choices = []
        for i, (o, lp) in enumerate(zip(outputs, logprobs)):
            content, calls = answer(o.text, request.body, mode)  # the server's tool-call parsing
            message = ChatMessageOut(content=content, tool_calls=[tool_call_out(c) for c in calls])
            choices.append(
                ChatChoice(
                    index=i,
                    message=message,
                    finish_reason="tool_calls" if calls else finish_reason(o),
                    logprobs=None if lp is None else chat_logprobs(lp),
                )
            )
        body = ChatCompletionResponse(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            model=model_name,
            choices=choices,
            usage=usage(outputs, n),
            prompt_logprobs=prompt_logprobs_out(outputs[0]),
        )
    data = body.model_dump(mode="json", exclude_none=True)
    for choice, dumped in zip(body.choices, data["choices"]):  # logprobs whole: a null logprob is a value
        if choice.logprobs is not None:
            dumped["logprobs"] = choice.logprobs.model_dump(mode="json")
        if getattr(choice, "prompt_logprobs", None) is not None:  # its first entry is null
            shown = request.body.prompt_logprobs  # a completion's echo may have run more
            dumped["prompt_logprobs"] = prompt_logprobs_out(outputs[choice.index], shown)
    if getattr(body, "prompt_logprobs", None) is not None:
        data["prompt_logprobs"] = prompt_logprobs_out(outputs[0])
    record["response"] = {"status_code": 200, "request_id": request_id, "body": data}
    record["error"] = None
    return record
