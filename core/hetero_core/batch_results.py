"""Result lines of a batch file, and reading back the ids an earlier run already wrote (``--resume``).

Hetero's format: ``{"id", "text", "num_prompt_tokens", "num_output_tokens", "finish_reason"}``,
plus ``"error"`` when the request failed. OpenAI's (as vLLM's ``run-batch`` writes it): ``{"id",
"custom_id", "response": {"status_code", "request_id", "body"}, "error"}``, the body built from the
server's own response models.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from hetero_core.batch_file import NATIVE, BatchRequest, id_key
from hetero_core.errors import HeteroError


def result_line(batch_format: str, request: BatchRequest, outputs: list, model_name: str) -> str:
    """One JSON line (no newline) for a finished request; ``outputs``: one per choice, in order
    (a refused choice is an object with ``error`` set)."""
    if batch_format == NATIVE:
        record = _native(request, outputs[0])
    else:
        record = _openai(request, outputs, model_name)
    return json.dumps(record, ensure_ascii=False)


def _native(request: BatchRequest, output) -> dict[str, Any]:
    record = {
        "id": request.id,
        "text": output.text,
        "num_prompt_tokens": len(output.prompt_token_ids),
        "num_output_tokens": len(output.output_token_ids),
        "finish_reason": output.finish_reason,
    }
    if output.error is not None:
        record["error"] = output.error
    return record


def _openai(request: BatchRequest, outputs: list, model_name: str) -> dict[str, Any]:
    from hetero_core.server.convert import finish_reason, usage
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
        choices = [CompletionChoice(index=i, text=o.text, finish_reason=finish_reason(o)) for i, o in enumerate(outputs)]
        body = CompletionResponse(id=f"cmpl-{uuid.uuid4().hex}", model=model_name, choices=choices,
                                  usage=usage(outputs, n))
    else:
        choices = [ChatChoice(index=i, message=ChatMessageOut(content=o.text), finish_reason=finish_reason(o))
                   for i, o in enumerate(outputs)]
        body = ChatCompletionResponse(id=f"chatcmpl-{uuid.uuid4().hex}", model=model_name, choices=choices,
                                      usage=usage(outputs, n))
    record["response"] = {"status_code": 200, "request_id": request_id,
                          "body": body.model_dump(mode="json", exclude_none=True)}
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
