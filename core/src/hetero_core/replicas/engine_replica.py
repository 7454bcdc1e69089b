"""EngineReplica: one engine (``AsyncLLM``) inside a Ray Serve replica.

The frontend calls ``generate`` through a deployment handle, as a stream: the first item is this
replica's id (so the frontend can say who served a request), then the request's ``RequestDelta``s.
Cancelling the stream (a client that went away) cancels the generator, which aborts the request.
``record_routing_stats`` feeds ``FewestQueuedTokensRouter``; ``check_health`` lets Ray Serve's
controller replace a replica whose engine has stopped.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from ray import serve

from hetero_core.async_llm import AsyncLLM, EngineDeadError
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.logging import configure_logging, get_logger
from hetero_core.replicas.client import EngineInfo
from hetero_core.replicas.ledger import QUEUED_TOKENS_KEY, REPORT_TIME_KEY

log = get_logger("hetero.replicas")


class EngineReplica:
    def __init__(self, settings, max_pending_requests: int) -> None:
        configure_logging(
            settings.log_format, settings.log_level
        )  # this process is ours: log as the CLI does
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.llm = AsyncLLM.from_settings(settings, max_pending_requests=max_pending_requests)
        log.info("replica.started", replica=self.replica_id)

    async def generate(
        self,
        *,
        prompt,
        params: SamplingParams | None,
        request_id: str,
        fit_max_tokens: bool = False,
        priority: int | None = None,
        tenant: str | None = None,
    ) -> AsyncIterator:
        yield self.replica_id
        async for delta in self.llm.generate(
            prompt, params, request_id, fit_max_tokens=fit_max_tokens, priority=priority, tenant=tenant
        ):
            yield delta

    def engine_info(self) -> EngineInfo:
        return EngineInfo(
            max_model_len=self.llm.engine.max_model_len, default_params=self.llm.engine.default_params
        )

    def record_routing_stats(self) -> dict:
        return {QUEUED_TOKENS_KEY: self.llm.stats.num_queued_tokens, REPORT_TIME_KEY: time.time()}

    def check_health(self) -> None:
        if not self.llm.is_running:
            raise EngineDeadError(f"the engine of replica {self.replica_id} stopped: {self.llm.dead_reason}")

    def __del__(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.shutdown()
