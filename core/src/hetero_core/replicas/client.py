"""ReplicaClient: what the OpenAI app needs of ``AsyncLLM``, served by engine replicas through a Ray
Serve deployment handle. The app's routes are the single-process server's, unchanged.

Each engine request is one streaming call to ``EngineReplica.generate``, routed by
``FewestQueuedTokensRouter``. Errors come back as the engine's own (a 400 stays a 400); a replica that
dies while serving a request ends it with ``ReplicaLostError`` (503, naming the replica). Requests
that had not reached it are routed to the others by Ray Serve and never see the failure.
"""

from __future__ import annotations

import contextvars
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ray.exceptions import RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from hetero_core.async_llm import EngineDeadError, EngineOverloadedError
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.logging import get_logger

log = get_logger("hetero.replicas")
# The replicas that served the HTTP request being handled (the frontend's response header says them).
served_by: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("hetero_served_by", default=None)


class ReplicaLostError(EngineDeadError):
    """The replica serving the request stopped before the request finished."""


@dataclass(frozen=True)
class EngineInfo:
    """What the app reads of an engine: its length limit and default sampling parameters. The
    frontend holds no tokenizer (the replicas do): chat-template options, /tokenize and /detokenize
    answer with an error naming that."""

    max_model_len: int
    default_params: SamplingParams
    tokenizer: None = None


class ReplicaClient:
    """What ``create_app`` uses of ``AsyncLLM`` (``generate``, ``engine``, ``is_running``, ``dead_reason``,
    ``shutdown``), over ``EngineReplica`` replicas; it counts requests per replica for /metrics."""

    def __init__(self, handle, engine: EngineInfo) -> None:
        self.handle = handle.options(stream=True)
        self.engine = engine
        self.dead_reason: str | None = None
        self.num_started: Counter[str] = Counter()  # per replica id
        self.num_lost: Counter[str] = Counter()
        self.num_running: Counter[str] = Counter()
        self._closed = False

    @property
    def is_running(self) -> bool:
        return not self._closed

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
        response = self.handle.generate.remote(
            prompt=prompt,
            params=params,
            request_id=request_id,
            fit_max_tokens=fit_max_tokens,
            priority=priority,
            tenant=tenant,
        )
        replica, finished = None, False
        try:
            async for item in response:
                if replica is None:  # the replica's first item is its id
                    replica = item
                    self._started(replica)
                    continue
                finished = item.finished
                yield item
        except RayTaskError as exc:  # the engine's own error, raised in the replica
            raise _unwrap(exc) from None
        except RayActorError as exc:
            if replica is not None:
                self.num_lost[replica] += 1
            log.warning(
                "replica.request_lost", replica=replica, request_id=request_id, error=type(exc).__name__
            )
            raise ReplicaLostError(
                f"replica {replica or '(unknown)'} stopped while serving request {request_id} "
                f"({type(exc).__name__}); the request was lost, retry it"
            ) from None
        except BackPressureError:
            raise EngineOverloadedError(
                "every replica is at its limit of pending requests and the queue "
                "in front of them is full (max_pending_requests); retry later"
            ) from None
        except DeploymentUnavailableError as exc:
            raise EngineDeadError(f"no engine replica is available: {exc}") from None
        finally:
            if replica is not None:
                self.num_running[replica] -= 1
            if not finished:
                response.cancel()

    def _started(self, replica: str) -> None:
        self.num_started[replica] += 1
        self.num_running[replica] += 1
        replicas = served_by.get()
        if replicas is not None and replica not in replicas:
            replicas.append(replica)

    def shutdown(self, timeout: float = 30.0) -> None:
        self._closed = True


def _unwrap(exc: RayTaskError) -> Exception:
    """The exception the replica raised (an engine error keeps its status; others become a 500)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else RuntimeError(str(exc).splitlines()[0])
