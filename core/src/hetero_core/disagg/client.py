"""DisaggregatedClient: what the OpenAI app needs of ``AsyncLLM``, served by a prefill and a decode role.

A request: ``POST /disagg/prefill`` to the prefill role (first token, prompt token ids, where its KV
blocks wait), then ``POST /disagg/decode`` to the decode role, whose stream of ``RequestDelta`` frames
is yielded as ``AsyncLLM.generate`` yields them. A role that cannot be reached, answers 5xx, or stops
mid-stream fails the requests it was serving with ``RoleLostError`` (503, naming the role and its URL);
nothing waits longer than ``timeout_s`` for a role that went silent. A thread polls both roles'
``/health``: ``is_running`` is False and ``dead_reason`` names the role while one is down (the app's
``/health`` answers 503 with it); requests in flight on the other role are not touched.
``shutdown`` (the server's stop, after its drain) aborts the requests still running, as
``AsyncLLM.shutdown`` does: each fails with ``EngineDeadError``, a stream with an error event.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from hetero_core.async_llm.errors import EngineDeadError
from hetero_core.disagg.wire import CONTENT_TYPE, FrameReader, RemoteError, RoleLostError, frame, loads
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.logging import get_logger

log = get_logger("hetero.disagg")
HEALTH_INTERVAL_S = 0.5
ABORTED = "the front end was shut down; the request was aborted"
_END = object()
# The KV transfer timings of the HTTP request being handled, one dict per choice (``frontend.py`` sends them
# as the ``x-hetero-kv-transfer`` header).
request_timings: contextvars.ContextVar[list[dict] | None] = contextvars.ContextVar(
    "hetero_kv_timings", default=None
)


@dataclass(frozen=True)
class EngineInfo:
    """What the app reads of an engine (the decode role's): its length limit and default params; no
    tokenizer in the front end (chat-template options, /tokenize and /detokenize refuse by name)."""

    max_model_len: int
    default_params: SamplingParams
    tokenizer: None = None


@dataclass
class FrontendStats:
    num_pending: int = 0


class DisaggregatedClient:
    def __init__(self, prefill_url: str, decode_url: str, *, timeout_s: float = 30.0) -> None:
        self.urls = {"prefill": prefill_url.rstrip("/"), "decode": decode_url.rstrip("/")}
        self.timeout_s = timeout_s
        info = loads(self._get("decode", "/disagg/info").content)
        self.engine = EngineInfo(info["max_model_len"], info["default_params"])
        self.num_started: Counter[str] = Counter()
        self.num_lost: Counter[str] = Counter()
        self.timings: list[dict] = []  # per finished request: prefill_s, transfer_s (the last 1000)
        self._pending = 0
        self._running: dict[asyncio.Future, asyncio.Queue] = {}  # each request's relay task and its deltas
        self._http: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None
        self._down: dict[str, str] = {}
        self._closed = False
        self._watcher = threading.Thread(target=self._watch, name="hetero-disagg-health", daemon=True)
        self._watcher.start()

    # -- what the app uses ------------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        return not self._closed and not self._down

    @property
    def dead_reason(self) -> str | None:
        if self._closed:
            return "shut down"
        return "; ".join(self._down.values()) or None

    @property
    def stats(self) -> FrontendStats:
        return FrontendStats(num_pending=self._pending)

    async def generate(
        self,
        prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        fit_max_tokens: bool = False,
        priority: int | None = None,
        tenant: str | None = None,
    ) -> AsyncIterator:
        """The request's deltas. Its HTTP exchanges with the roles run in a task of their own, which
        ``shutdown`` cancels (the request then fails with ``EngineDeadError``, as ``AsyncLLM``'s do)."""
        if self._closed:
            raise EngineDeadError("the front end was shut down before the request started")
        params = params or self.engine.default_params
        inbox: asyncio.Queue = asyncio.Queue()
        request = dict(
            prompt=prompt,
            params=params,
            request_id=request_id,
            priority=priority,
            tenant=tenant,
            fit_max_tokens=fit_max_tokens,
        )
        worker = asyncio.ensure_future(self._relay(request, inbox))
        self._running[worker] = inbox
        self._pending += 1
        try:
            while (item := await inbox.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._pending -= 1
            self._running.pop(worker, None)
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)

    async def _relay(self, request: dict, inbox: asyncio.Queue) -> None:
        """Prefill, then decode: each delta, then ``_END`` (or the error) into ``inbox``."""
        try:
            http = self._http_client()
            body = {k: request[k] for k in ("prompt", "params", "request_id", "priority", "tenant")}
            handoff = await self._prefill(http, body)
            body = dict(
                handoff=handoff,
                **{k: request[k] for k in ("params", "request_id", "fit_max_tokens", "priority", "tenant")},
            )
            async for delta in self._decode(http, body):
                inbox.put_nowait(delta)
        except Exception as exc:
            inbox.put_nowait(exc)
        else:
            inbox.put_nowait(_END)

    def _http_client(self) -> httpx.AsyncClient:
        """One pooled client per event loop (a connection per request would cost more than the transfer)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http[0] is not loop:
            self._http = (
                loop,
                httpx.AsyncClient(
                    timeout=httpx.Timeout(self.timeout_s, connect=5.0),
                    limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                ),
            )
        return self._http[1]

    def shutdown(self, timeout: float = 30.0) -> None:
        """Refuse new requests and abort the running ones: each fails with ``EngineDeadError`` (a stream
        ends with an error event and ``[DONE]``), and closing its stream to the decode role aborts it
        there too. Safe from any thread (the server calls it from an executor's)."""
        self._closed = True
        if self._http is None:
            return
        loop = self._http[0]
        try:
            running_here = asyncio.get_running_loop() is loop
        except RuntimeError:
            running_here = False
        if running_here:
            self._abort_running()
            return
        try:
            loop.call_soon_threadsafe(self._abort_running)
        except RuntimeError:  # the loop is closed: nothing can be running on it
            pass

    def _abort_running(self) -> None:
        for worker, inbox in list(self._running.items()):
            worker.cancel()
            inbox.put_nowait(EngineDeadError(ABORTED))

    # -- the two roles ----------------------------------------------------------------------------
    async def _prefill(self, http: httpx.AsyncClient, body: dict) -> dict:
        self.num_started["prefill"] += 1
        try:
            response = await http.post(
                self.urls["prefill"] + "/disagg/prefill",
                content=frame(body),
                headers={"content-type": CONTENT_TYPE},
            )
        except httpx.HTTPError as exc:
            raise self._lost("prefill", body["request_id"], exc) from None
        if response.status_code != 200:
            raise self._lost("prefill", body["request_id"], f"HTTP {response.status_code}")
        answer = loads(response.content)
        if "error" in answer:
            raise answer["error"].exception("prefill")
        return answer

    async def _decode(self, http: httpx.AsyncClient, body: dict) -> AsyncIterator:
        self.num_started["decode"] += 1
        reader, finished = FrameReader(), False
        try:
            async with http.stream(
                "POST",
                self.urls["decode"] + "/disagg/decode",
                content=frame(body),
                headers={"content-type": CONTENT_TYPE},
            ) as response:
                if response.status_code != 200:
                    raise self._lost("decode", body["request_id"], f"HTTP {response.status_code}")
                async for chunk in response.aiter_raw():
                    for item in reader.feed(chunk):
                        if isinstance(item, RemoteError):
                            raise item.exception("decode")
                        if isinstance(item, dict):  # the transfer's timings, before the first delta
                            self.timings = [*self.timings[-999:], item]
                            timings = request_timings.get()
                            if timings is not None:
                                timings.append(item)
                            continue
                        finished = item.finished
                        yield item
        except httpx.HTTPError as exc:
            raise self._lost("decode", body["request_id"], exc) from None
        if not finished:
            raise self._lost("decode", body["request_id"], "the stream ended before the request finished")

    def _lost(self, role: str, request_id, why) -> RoleLostError:
        self.num_lost[role] += 1
        why = why if isinstance(why, str) else f"{type(why).__name__}: {why}"
        log.warning("disagg.request_lost", role=role, request_id=request_id, error=why)
        return RoleLostError(
            f"the {role} engine ({self.urls[role]}) failed request {request_id}: {why}; "
            "the request was lost, retry it"
        )

    # -- health -----------------------------------------------------------------------------------
    def _get(self, role: str, path: str) -> httpx.Response:
        response = httpx.get(self.urls[role] + path, timeout=self.timeout_s)
        response.raise_for_status()
        return response

    def _watch(self) -> None:
        while not self._closed:
            for role, url in self.urls.items():
                try:
                    httpx.get(url + "/health", timeout=2.0).raise_for_status()
                    if self._down.pop(role, None):
                        log.info("disagg.role_back", role=role, url=url)
                except httpx.HTTPError as exc:
                    if role not in self._down:
                        log.warning("disagg.role_down", role=role, url=url, error=str(exc))
                    self._down[role] = f"the {role} engine ({url}) is not answering: {type(exc).__name__}"
            time.sleep(HEALTH_INTERVAL_S)
