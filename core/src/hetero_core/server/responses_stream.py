"""A streamed response's events, in the order OpenAI sends them: ``response.created`` and
``response.in_progress``; per output item ``response.output_item.added``, then for a message
``response.content_part.added``, ``response.output_text.delta``s, ``response.output_text.done`` and
``response.content_part.done``, for a function call ``response.function_call_arguments.delta``s and
``.done``; ``response.output_item.done``; at the end ``response.completed`` with the whole response
(its ``status`` is ``incomplete`` when ``max_output_tokens`` cut it). Each event is ``event: <type>``
and ``data: <json>`` with a ``sequence_number`` counting from 0.
"""

from __future__ import annotations

import json

from hetero_core.openai_api.protocol import ChatDelta
from hetero_core.openai_api.responses_convert import item_id
from hetero_core.openai_api.responses_output import (
    FunctionCallOutput,
    IncompleteDetails,
    OutputMessage,
    OutputText,
    Response,
    ResponseError,
    ResponseUsage,
)


def finish_response(response: Response, status: str, usage: ResponseUsage) -> None:
    response.status, response.usage = status, usage
    if status == "incomplete":
        response.incomplete_details = IncompleteDetails(reason="max_output_tokens")


class ResponseEvents:
    """Chat deltas in, Responses events (SSE text) out; ``response`` is filled in as the items finish."""

    def __init__(self, response: Response) -> None:
        self.response = response
        self._sequence = 0
        self._open: OutputMessage | FunctionCallOutput | None = None

    def event(self, type_: str, **fields) -> str:
        payload = {"type": type_, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {type_}\ndata: {json.dumps(payload)}\n\n"

    def start(self) -> list[str]:
        self.response.status = "in_progress"
        snapshot = self.response.model_dump(mode="json")
        return [
            self.event("response.created", response=snapshot),
            self.event("response.in_progress", response=snapshot),
        ]

    def delta(self, delta: ChatDelta, logprobs: list | None = None) -> list[str]:
        events = []
        if delta.content:
            events += self.text(delta.content, logprobs or [])
        for call in delta.tool_calls or []:
            if call.id is not None:
                item = FunctionCallOutput(
                    id=item_id("fc"), call_id=call.id, name=call.function.name, status="in_progress"
                )
                events += self._add(item)
            if call.function.arguments:
                self._open.arguments += call.function.arguments
                events.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        item_id=self._open.id,
                        output_index=self._index,
                        delta=call.function.arguments,
                    )
                )
        return events

    def text(self, text: str, logprobs: list) -> list[str]:
        events = []
        if not isinstance(self._open, OutputMessage):
            events += self._add(OutputMessage(id=item_id("msg"), status="in_progress"))
            self._open.content.append(OutputText(logprobs=[] if logprobs else None))
            events.append(
                self.event(
                    "response.content_part.added",
                    item_id=self._open.id,
                    output_index=self._index,
                    content_index=0,
                    part=OutputText().model_dump(mode="json"),
                )
            )
        part = self._open.content[0]
        part.text += text
        if part.logprobs is not None:
            part.logprobs += logprobs
        events.append(
            self.event(
                "response.output_text.delta",
                item_id=self._open.id,
                output_index=self._index,
                content_index=0,
                delta=text,
                logprobs=logprobs,
            )
        )
        return events

    def finish(self, status: str, usage) -> list[str]:
        """Close the open item and complete the response."""
        events = self._close()
        finish_response(self.response, status, usage)
        return events + [self.event("response.completed", response=self.response.model_dump(mode="json"))]

    def fail(self, code: str, message: str, param: str | None) -> list[str]:
        self.response.status = "failed"
        self.response.error = ResponseError(code=code, message=message)
        return [
            self.event("error", code=code, message=message, param=param),
            self.event("response.failed", response=self.response.model_dump(mode="json")),
        ]

    @property
    def _index(self) -> int:
        return len(self.response.output) - 1

    def _add(self, item) -> list[str]:
        events = self._close()
        self.response.output.append(item)
        self._open = item
        return events + [
            self.event(
                "response.output_item.added", output_index=self._index, item=item.model_dump(mode="json")
            )
        ]

    def _close(self) -> list[str]:
        item, self._open = self._open, None
        if item is None:
            return []
        item.status = "completed"
        if isinstance(item, OutputMessage):
            part = item.content[0]
            events = [
                self.event(
                    "response.output_text.done",
                    item_id=item.id,
                    output_index=self._index,
                    content_index=0,
                    text=part.text,
                    logprobs=part.logprobs or [],
                ),
                self.event(
                    "response.content_part.done",
                    item_id=item.id,
                    output_index=self._index,
                    content_index=0,
                    part=part.model_dump(mode="json"),
                ),
            ]
        else:
            events = [
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item.id,
                    output_index=self._index,
                    name=item.name,
                    arguments=item.arguments,
                )
            ]
        return events + [
            self.event(
                "response.output_item.done", output_index=self._index, item=item.model_dump(mode="json")
            )
        ]
