"""Streamed tool calls, as OpenAI sends them: a delta that opens each call (``index``, ``id``, ``type``,
``function.name``, empty ``arguments``), then ``function.arguments`` in pieces.

A named function streams its arguments as the model writes them; ``required`` (a JSON array of
calls) sends each call whole as soon as its array element is complete; ``auto`` streams content until
a ``<tool_call>`` tag begins (holding back text that may be the start of one), then sends each call
when its ``</tool_call>`` closes, and the text around the calls at the end. A repeated call is sent
once, and the calls completed before a cut are all sent (``hetero_core.openai_api.tools``).
"""

from __future__ import annotations

from hetero_core.openai_api.protocol import ChatCompletionRequest, ChatDelta
from hetero_core.openai_api.tool_protocol import FunctionCallDelta, ToolCallDelta
from hetero_core.openai_api.tools import (
    CLOSE,
    OPEN,
    Call,
    auto_calls,
    calls_from_json,
    calls_of,
    complete_calls,
    new_call_id,
)


class ToolCallStream:
    """One choice's text deltas in, chat deltas out."""

    def __init__(self, body: ChatCompletionRequest, mode: str) -> None:
        self.body, self.mode = body, mode
        self.held = ""  # text not yet sent (auto: a possible tag; required: everything)
        self.num_calls = 0
        self.streaming_content = True

    def feed(self, text: str) -> list[ChatDelta]:
        if not text:
            return []
        if self.mode == "named":
            deltas = (
                []
                if self.num_calls
                else [_open(0, Call(self.body.tool_choice.function.name, "", new_call_id()))]
            )
            self.num_calls = 1
            return deltas + [_arguments(0, text)]
        self.held += text
        if self.mode == "required" or not self.streaming_content:
            return self._send(self._completed()[self.num_calls :])
        start = self.held.find(OPEN)
        if start < 0:
            keep = _partial_tag(self.held)
            content, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
            return [ChatDelta(content=content)] if content else []
        self.streaming_content = False
        content, self.held = self.held[:start], self.held[start:]
        deltas = [ChatDelta(content=content)] if content else []
        return deltas + self._send(self._completed()[self.num_calls :])

    def finish(self) -> list[ChatDelta]:
        """The calls still to send, and any held content."""
        if self.mode == "named":
            return []
        if self.mode == "required":
            calls, content = calls_from_json(self.held, self.body, self.mode), None
        else:
            content, calls = auto_calls(self.held, self.body)
            content = content if calls else self.held
        deltas = [ChatDelta(content=content)] if content else []
        deltas += self._send(calls[self.num_calls :])
        self.held = ""
        return deltas

    def _completed(self) -> list[Call]:
        """The calls complete in the text so far (auto: the blocks up to the last ``</tool_call>``)."""
        if self.mode == "required":
            return calls_of(complete_calls(self.held)[0])
        end = self.held.rfind(CLOSE)
        return auto_calls(self.held[: end + len(CLOSE)], self.body)[1] if end >= 0 else []

    def _send(self, calls: list[Call]) -> list[ChatDelta]:
        deltas = []
        for call in calls:
            deltas += [_open(self.num_calls, call), _arguments(self.num_calls, call.arguments)]
            self.num_calls += 1
        return deltas


def _open(index: int, call: Call) -> ChatDelta:
    return ChatDelta(
        tool_calls=[
            ToolCallDelta(
                index=index,
                id=call.id,
                type="function",
                function=FunctionCallDelta(name=call.name, arguments=""),
            )
        ]
    )


def _arguments(index: int, text: str) -> ChatDelta:
    return ChatDelta(tool_calls=[ToolCallDelta(index=index, function=FunctionCallDelta(arguments=text))])


def _partial_tag(text: str) -> int:
    """The length of the longest end of ``text`` that begins ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0
