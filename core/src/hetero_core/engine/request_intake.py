"""RequestIntake: the requests a caller adds, checked and queued (the first part of ``Engine``).

``add_request`` / ``add_requests`` turn prompts into sequences (or, for n > 1 completions, a
``ParallelRequest`` of them; ``parallel_sampling``), give them ids, check them against the engine's
limits and queue them into the ``EngineState`` (its request table, detokenizers and counters);
``abort`` ends one. Requests end through the ``Postprocessor`` (``finish``), as those a step ends.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

from hetero_core.engine.kv.kv_transfer import KVHandoff, kv_import_error
from hetero_core.engine.postprocess import Postprocessor, queued_tokens
from hetero_core.engine.requests.detokenizer import IncrementalDetokenizer
from hetero_core.engine.requests.parallel_sampling import ParallelRequest, child_params, child_request_id
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.requests.processor import EngineRequest
from hetero_core.engine.requests.prompts import Prompt, as_prompt_list, prompt_text
from hetero_core.engine.requests.sequence import FinishReason, Sequence
from hetero_core.engine.state import EngineState
from hetero_core.errors import InvalidRequestError
from hetero_core.logging import get_logger

__all__ = ["Params", "RequestIntake"]
log = get_logger("hetero.engine")
Params = SamplingParams | dict | None


class RequestIntake:
    def __init__(self, state: EngineState, postprocessor: Postprocessor) -> None:
        self.state = state
        self.postprocessor = postprocessor  # ends requests (finish) and checks a handed-over first token

    def add_request(
        self,
        prompt: Prompt | EngineRequest,
        params: Params = None,
        request_id: str | None = None,
        *,
        priority: int = 0,
        tenant: str | None = None,
        stream: bool = True,
        kv_transfer: KVHandoff | None = None,
        export_kv: bool = False,
    ) -> str:
        """Queue a request and return its id (the options and errors: ``Engine.add_request``)."""
        if request_id is not None and not isinstance(request_id, str):
            raise InvalidRequestError(f"request_id must be a string, got {type(request_id).__name__}")
        if isinstance(prompt, EngineRequest):
            if params is not None or priority != 0 or tenant is not None:
                raise InvalidRequestError("an EngineRequest carries its own params, priority and tenant")
            request = prompt
        else:
            request = self.state.processor.process(prompt, params, priority=priority, tenant=tenant)
        if kv_transfer is not None or export_kv:
            request = replace(request, kv_transfer=kv_transfer, export_kv=export_kv)
        return self._queue_entry(self._new_entry(request, request_id), stream)

    def add_requests(
        self,
        prompts: Iterable[Prompt] | Prompt,
        params: Params | list[Params] = None,
        *,
        priority: int = 0,
        tenant: str | None = None,
        stream: bool = True,
    ) -> list[str]:
        """Check every request, then queue them all; their ids in order (``Engine.add_requests``)."""
        prompts = as_prompt_list(prompts)
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise InvalidRequestError(f"got {len(params_list)} sampling params for {len(prompts)} prompts")
        checked: list[tuple[Sequence, IncrementalDetokenizer] | ParallelRequest | str] = []
        for prompt, p in zip(prompts, params_list):
            try:
                request = self.state.processor.process(prompt, p, priority=priority, tenant=tenant)
                checked.append(self._new_entry(request, None))
            except InvalidRequestError as exc:
                checked.append(str(exc))
        ids = []
        for prompt, item in zip(prompts, checked):
            if isinstance(item, str):
                ids.append(self._reject(prompt, item))
            else:
                ids.append(self._queue_entry(item, stream))
        return ids

    def abort(self, request_id: str) -> bool:
        """Stop a request; its blocks are freed at once. False if unknown or already done."""
        if request_id in self.state.parallel:
            return self._abort_parallel(request_id)
        seq = self.state.seqs.get(request_id) if isinstance(request_id, str) else None
        if seq is None or seq.status.is_done:
            return False
        self.postprocessor.finish(seq, reason=FinishReason.ABORT)
        return True

    def _new_entry(self, request: EngineRequest, request_id: str | None):
        """The request's sequence, or for n > 1 completions its ``ParallelRequest``; nothing is queued."""
        if request.params.num_samples == 1:
            return self._new_sequence(request, request_id)
        if request.kv_transfer is not None or request.export_kv:
            raise InvalidRequestError(
                "KV transfer (prefill/decode disaggregation) takes one completion per "
                "request (n = 1); send n requests instead"
            )
        if request_id is None:
            request_id = self._auto_request_id(next(self.state.seq_ids))
        elif self._id_in_use(request_id):
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        children = [
            self._new_sequence(
                replace(request, params=child_params(request.params, i)), child_request_id(request_id, i)
            )
            for i in range(request.params.num_samples)
        ]
        scheduler = self.state.scheduler
        share_prompt = (
            scheduler.prefix_caching and len(request.prompt_token_ids) > scheduler.allocator.block_size
        )
        return ParallelRequest(request_id, request.params, children, share_prompt)

    def _queue_entry(self, entry, stream: bool = True) -> str:
        """Queue a sequence (or the first children of a ``ParallelRequest``); ``stream``: as for
        ``add_request``, for every child."""
        if isinstance(entry, ParallelRequest):
            for seq, _ in entry.children:
                seq.stream = stream
            self.state.parallel.add(entry)
            for seq, detokenizer in entry.to_queue():
                self.queue(seq, detokenizer)
            return entry.request_id
        entry[0].stream = stream
        self.queue(*entry)
        return entry[0].request_id

    def _abort_parallel(self, request_id: str) -> bool:
        live = [seq for seq, _ in self.state.parallel.get(request_id).children if not seq.status.is_done]
        for seq in live:
            self.postprocessor.finish(seq, reason=FinishReason.ABORT)
        return bool(live)

    def _id_in_use(self, request_id: str) -> bool:
        state = self.state
        return request_id in state.seqs or request_id in state.held_outputs or state.parallel.owns(request_id)

    def _new_sequence(
        self, request: EngineRequest, request_id: str | None
    ) -> tuple[Sequence, IncrementalDetokenizer]:
        """The request's sequence, checked against the engine's limits; nothing is queued yet."""
        state = self.state
        if request_id is not None and self._id_in_use(request_id):
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        seq_id = next(state.seq_ids)
        request_id = request_id if request_id is not None else self._auto_request_id(seq_id)
        seq = Sequence(
            seq_id,
            request_id,
            request.prompt,
            list(request.prompt_token_ids),
            request.params,
            time.time(),
            priority=request.priority,
            tenant=request.tenant,
        )
        if request.grammar is not None:
            seq.grammar = state.structured_output.new_state(request.grammar)
        seq.export_kv = request.export_kv
        if request.kv_transfer is not None:
            seq.kv_import = request.kv_transfer
            reason = kv_import_error(seq, state.scheduler, state.executor)
            if reason is not None:
                raise InvalidRequestError(reason)
        reason = state.scheduler.admission_error(seq)
        if reason is not None:
            raise InvalidRequestError(reason)
        tokenizer = state.tokenizer
        texts = state.token_texts.of(tokenizer)
        return seq, IncrementalDetokenizer(tokenizer, seq.prompt_token_ids, seq.params, texts)

    def queue(self, seq: Sequence, detokenizer: IncrementalDetokenizer) -> None:
        """Hand a checked sequence to the scheduler; the engine holds it until its final output."""
        state = self.state
        state.seqs[seq.request_id] = seq
        state.detokenizers[seq.seq_id] = detokenizer
        state.scheduler.add(seq)
        state.num_queued_tokens += queued_tokens(seq)
        state.num_constrained += seq.grammar is not None
        log.info("request.admitted", request_id=seq.request_id, num_prompt_tokens=seq.num_prompt_tokens)
        if seq.kv_import is not None:
            self._add_first_token(seq, seq.kv_import)

    def _add_first_token(self, seq: Sequence, handoff: KVHandoff) -> None:
        """The token the prefill engine sampled, appended and checked as if this engine had sampled it."""
        token_id = handoff.first_token_id
        seq.first_token_time = time.time()
        seq.output_token_ids.append(token_id)
        self.state.num_queued_tokens -= 1
        if seq.params.logprobs is not None:
            seq.output_logprobs.append(handoff.first_logprobs)
        if seq.grammar is not None and not seq.grammar.accept_token(token_id):
            self.postprocessor.finish(
                seq,
                error=f"the prefill engine's first token {token_id} is not "
                "allowed by the request's guided decoding",
            )
            return
        self.postprocessor.check_stop(seq, token_id, self.state.tokenizer.eos_token_id)

    def _reject(self, prompt, error: str) -> str:
        """A failed output for a prompt that ``add_requests()`` could not queue."""
        seq_id = next(self.state.seq_ids)
        params = self.state.processor.default_params
        seq = Sequence(seq_id, self._auto_request_id(seq_id), prompt_text(prompt), [], params, time.time())
        self.state.seqs[seq.request_id] = seq
        self.postprocessor.finish(seq, error=error)
        return seq.request_id

    def _auto_request_id(self, seq_id: int) -> str:
        """The sequence number as an id, suffixed if a caller already chose that id."""
        request_id, n = str(seq_id), 0
        while self._id_in_use(request_id):
            n += 1
            request_id = f"{seq_id}-{n}"
        return request_id
