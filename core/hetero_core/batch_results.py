"""Result lines of a batch file, and reading back the ids an earlier run already wrote (``--resume``).

Hetero's format: ``{"id", "text", "num_prompt_tokens", "num_output_tokens", "finish_reason"}``,
plus ``"logprobs"`` when the line asked for them (one ``{"token", "token_id", "logprob",
"top_logprobs"}`` per output token) and ``"error"`` when the request failed. OpenAI's (as vLLM's
``run-batch`` writes it): ``{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error"}``, the body built from the server's own response models, logprobs included.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from hetero_core.batch_file import NATIVE, BatchRequest, id_key
from hetero_core.errors import HeteroError


def result_line(batch_format: str, request: BatchRequest, outputs: list, model_name: str, tokenizer=None) -> str:
    """One JSON line (no newline) for a finished request; ``outputs``: one per choice, in order
    (a refused choice is an object with ``error`` set). ``tokenizer``: to write logprobs' tokens as
    text (needed when a request asked for logprobs)."""
    if batch_format == NATIVE:
        record = _native(request, outputs[0], tokenizer)
    else:
        record = _openai(request, outputs, model_name, [_logprobs(output, tokenizer) for output in outputs])
    return json.dumps(record, ensure_ascii=False)


def _logprobs(output, tokenizer) -> list | None:
    """The output's logprobs as ``TokenLogprob``s, or None when its request asked for none."""
    from hetero_core.request_stream import token_logprobs

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
    if getattr(output, "logprobs", None) is not None and output.error is None:
        record["logprobs"] = [_native_logprob(tokenizer, token_id, lp)
                              for token_id, lp in zip(output.output_token_ids, output.logprobs)]
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
    return {**token(token_id), "logprob": lp.logprob,
            "top_logprobs": [{**token(tid), "logprob": value} for tid, value in lp.top]}


def _openai(request: BatchRequest, outputs: list, model_name: str, logprobs: list) -> dict[str, Any]:
    from hetero_core.server.convert import chat_logprobs, completion_logprobs, finish_reason, usage
    from hetero_core.server.protocol import (
        ChatChoice,
        ChatCompletionResponse,
        ChatMessageOut,
        CompletionChoice,
        CompletionResponse,
    )

    request_id = f"hetero-batch-{uuid.uuid4().hex}"
    failed = [o for o in outputs if o.error is not None]
    record = {"id": f"hetero-{uuid.uuid4().hex}", "custom_id": request.id}
    if failed:
        refused = any(getattr(o, "refused", False) for o in failed)
        status, kind = (400, "BadRequestError") if refused else (500, "InternalServerError")
        record["response"] = {"status_code": status, "request_id": request_id, "body": None}
        record["error"] = {"object": "error", "message": failed[0].error, "type": kind, "param": None,
                           "code": status}
        return record
    n = request.body.n
    if request.url == "/v1/completions":
        choices = [CompletionChoice(index=i, text=o.text, finish_reason=finish_reason(o),
                                    logprobs=None if lp is None else completion_logprobs(lp))
                   for i, (o, lp) in enumerate(zip(outputs, logprobs))]
        body = CompletionResponse(id=f"cmpl-{uuid.uuid4().hex}", model=model_name, choices=choices,
                                  usage=usage(outputs, n))
    else:
        choices = [ChatChoice(index=i, message=ChatMessageOut(content=o.text), finish_reason=finish_reason(o),
                              logprobs=None if lp is None else chat_logprobs(lp))
                   for i, (o, lp) in enumerate(zip(outputs, logprobs))]
        body = ChatCompletionResponse(id=f"chatcmpl-{uuid.uuid4().hex}", model=model_name, choices=choices,
                                      usage=usage(outputs, n))
    data = body.model_dump(mode="json", exclude_none=True)
    for choice, dumped in zip(body.choices, data["choices"]):  # logprobs whole: a null logprob is a value
        if choice.logprobs is not None:
            dumped["logprobs"] = choice.logprobs.model_dump(mode="json")
    record["response"] = {"status_code": 200, "request_id": request_id, "body": data}
    record["error"] = None
    return record


def read_done_ids(path: str) -> set[str]:
    """The id keys of complete result lines in ``path`` (none if it does not exist). A last line cut
    short (a run killed mid-write) is removed, so appending continues a valid file."""
    if not os.path.exists(path):
        return set()
    with open(path, "rb") as f:
        data = f.read()
    done, end = set(), 0
    for raw in data.splitlines(keepends=True):
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            if raw.endswith(b"\n"):
                raise HeteroError(f"cannot resume: {path} holds a line that is not JSON at byte {end}; "
                                  "is it a results file?") from None
            break  # the cut-off last line
        if not isinstance(record, dict) or not ("custom_id" in record or "id" in record):
            raise HeteroError(f"cannot resume: {path} holds a line without 'id' or 'custom_id' at byte {end}")
        done.add(id_key(record["custom_id"] if "custom_id" in record else record["id"]))
        end += len(raw)
    if end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
    elif data and not data.endswith(b"\n"):
        with open(path, "ab") as f:
            f.write(b"\n")
    return done
