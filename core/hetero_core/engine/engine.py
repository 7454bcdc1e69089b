"""Engine: requests in, tokens out. ``step()`` is schedule, execute, postprocess."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable

from hetero_core.detokenizer import IncrementalDetokenizer
from hetero_core.engine.outputs import RequestOutput
from hetero_core.engine.params import SamplingParams
from hetero_core.engine.block_transfer import apply_block_transfers
from hetero_core.engine.scheduler import ScheduledStep, Scheduler, SchedulerStats
from hetero_core.engine.sequence import FinishReason, Sequence, SequenceStatus, check_priority_and_tenant
from hetero_core.engine.stop_checker import check_length, check_stop_string, check_stop_token
from hetero_core.errors import InvalidRequestError
from hetero_core.logging import get_logger

log = get_logger("hetero.engine")
Prompt = str | list[int] | list[dict[str, str]]  # text, token ids, or chat messages


class Engine:
    def __init__(self, *, tokenizer, executor, scheduler: Scheduler, max_model_len: int,
                 default_params: SamplingParams | None = None, sampler_seed: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.executor = executor
        self.scheduler = scheduler
        self.max_model_len = max_model_len
        self.default_params = default_params or SamplingParams()
        self._sampler_seed = sampler_seed
        self._sampler = None  # created on first logits output (imports torch)
        self._seqs: dict[str, Sequence] = {}
        self._detokenizers: dict[int, IncrementalDetokenizer] = {}
        self._seq_counter = itertools.count()
        self._finished_outputs: list[RequestOutput] = []
        self.num_steps = 0

    @classmethod
    def from_settings(cls, settings=None, plugins=None) -> Engine:
        from hetero_core.builder import build_engine

        return build_engine(settings, plugins)

    # -- requests ---------------------------------------------------------------------------------
    def add_request(self, prompt: Prompt, params: SamplingParams | None = None,
                    request_id: str | None = None, *, priority: int = 0, tenant: str | None = None) -> str:
        """Queue a request. Invalid input raises InvalidRequestError; a request that can never fit
        the limits is accepted and fails at admission (see its RequestOutput.error).
        ``priority`` (lower first) and ``tenant`` are read by the scheduler policy."""
        params = params or self.default_params
        check_priority_and_tenant(priority, tenant)
        token_ids = self._tokenize(prompt)
        seq_id = next(self._seq_counter)
        if request_id is None:
            request_id = self._auto_request_id(seq_id)
        elif request_id in self._seqs:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        text = prompt if isinstance(prompt, str) else self.tokenizer.decode(token_ids)
        seq = Sequence(seq_id, request_id, text, token_ids, params, time.time(), priority=priority, tenant=tenant)
        self._seqs[request_id] = seq
        reason = self.scheduler.admission_error(seq)
        if reason is not None:
            self._finish(seq, error=reason)
            return request_id
        self._detokenizers[seq_id] = IncrementalDetokenizer(self.tokenizer, token_ids)
        self.scheduler.add(seq)
        log.info("request.admitted", request_id=request_id, num_prompt_tokens=len(token_ids))
        return request_id

    def abort(self, request_id: str) -> bool:
        """Stop a request; its blocks are freed at once. False if unknown or already done."""
        seq = self._seqs.get(request_id)
        if seq is None or seq.status.is_done:
            return False
        self._finish(seq, reason=FinishReason.ABORT)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work

    # -- the loop ---------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step; return outputs of requests that progressed or ended since the last step."""
        scheduled = self.scheduler.schedule()
        if scheduled is not None:
            apply_block_transfers(self.executor, scheduled)
            output = self.executor.execute(scheduled.batch)
            self._postprocess(scheduled, self._next_tokens(scheduled, output))
        outputs, self._finished_outputs = self._finished_outputs, []
        for out in outputs:  # reported once; the engine forgets finished requests
            self._seqs.pop(out.request_id, None)
        if scheduled is not None:
            outputs += [RequestOutput.from_sequence(s) for s in scheduled.seqs if not s.status.is_done]
        return outputs

    def generate(self, prompts: Iterable[Prompt], params: SamplingParams | list[SamplingParams] | None = None,
                 *, priority: int = 0, tenant: str | None = None) -> list[RequestOutput]:
        """Run prompts to completion; outputs in prompt order. A bad prompt fails alone."""
        prompts = list(prompts)
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise InvalidRequestError(f"got {len(params_list)} sampling params for {len(prompts)} prompts")
        ids = []
        for prompt, p in zip(prompts, params_list):
            try:
                ids.append(self.add_request(prompt, p, priority=priority, tenant=tenant))
            except InvalidRequestError as exc:
                ids.append(self._reject(prompt, p, str(exc)))
        finished: dict[str, RequestOutput] = {}
        while self.has_unfinished_requests() or self._finished_outputs:
            finished.update((o.request_id, o) for o in self.step() if o.finished)
        return [finished[i] for i in ids]

    def stats(self) -> SchedulerStats:
        """Scheduler counters: preemptions (by mode), prefix-cache hit / queried tokens, steps."""
        return self.scheduler.stats()

    def shutdown(self) -> None:
        self.executor.shutdown()

    # -- internals --------------------------------------------------------------------------------
    def _tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt)
        elif prompt and all(isinstance(m, dict) for m in prompt):
            token_ids = self.tokenizer.encode_chat(prompt)
        elif all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            token_ids = list(prompt)
            bad = [t for t in token_ids if not 0 <= t < self.tokenizer.vocab_size]
            if bad:
                raise InvalidRequestError(
                    f"prompt token ids out of range [0, {self.tokenizer.vocab_size}): {bad[:5]}"
                )
        else:
            raise InvalidRequestError("a prompt is a string, a list of token ids or a list of chat messages")
        if not token_ids:
            raise InvalidRequestError("the prompt is empty")
        return token_ids

    def _reject(self, prompt: Prompt, params: SamplingParams | None, error: str) -> str:
        seq_id = next(self._seq_counter)
        text = prompt if isinstance(prompt, str) else ""
        seq = Sequence(seq_id, self._auto_request_id(seq_id), text, [], params or self.default_params, time.time())
        self._seqs[seq.request_id] = seq
        self._finish(seq, error=error)
        return seq.request_id

    def _auto_request_id(self, seq_id: int) -> str:
        """The sequence number as an id, suffixed if a caller already chose that id."""
        request_id, n = str(seq_id), 0
        while request_id in self._seqs:
            n += 1
            request_id = f"{seq_id}-{n}"
        return request_id

    def _next_tokens(self, scheduled: ScheduledStep, output) -> tuple[list[int], list]:
        if output.token_ids is not None:
            return list(output.token_ids), [None] * len(output.token_ids)
        from hetero_core.engine.sampler import Sampler, SamplingRow

        if self._sampler is None:
            self._sampler = Sampler(seed=self._sampler_seed)
        rows = [
            SamplingRow(s.params, s.prompt_token_ids, s.output_token_ids)
            for s, flag in zip(scheduled.seqs, scheduled.batch.sample) if flag
        ]
        result = self._sampler.sample(output.logits, rows)
        return result.token_ids, result.logprobs

    def _postprocess(self, scheduled: ScheduledStep, sampled: tuple[list[int], list]) -> None:
        tokens = iter(zip(*sampled))
        now = time.time()
        for seq, num_new, sample in zip(scheduled.seqs, scheduled.num_new_tokens, scheduled.batch.sample):
            seq.num_computed_tokens += num_new
            if not sample:
                continue
            token_id, logprobs = next(tokens)
            seq.status = SequenceStatus.DECODE
            seq.first_token_time = seq.first_token_time or now
            seq.output_token_ids.append(token_id)
            if seq.params.logprobs is not None:
                seq.output_logprobs.append(logprobs)
            reason = check_stop_token(seq, token_id, self.tokenizer.eos_token_id)
            if reason is None:
                delta = self._detokenizers[seq.seq_id].add(token_id)
                seq.output_text += delta
                reason = check_stop_string(seq, len(delta)) or check_length(seq, self.max_model_len)
            if reason is not None:
                self._finish(seq, reason=reason)
        self.num_steps += 1
        log.debug("engine.step", step=self.num_steps, num_seqs=scheduled.batch.num_seqs,
                  num_tokens=scheduled.batch.num_tokens, num_preempted=len(scheduled.preempted),
                  num_free_blocks=self.scheduler.allocator.num_free_blocks)

    def _finish(self, seq: Sequence, reason: FinishReason | None = None, error: str | None = None) -> None:
        if seq.seq_id in self._detokenizers:
            self.scheduler.remove(seq)
            seq.output_text += self._detokenizers.pop(seq.seq_id).flush() if reason != FinishReason.STOP else ""
        seq.status = SequenceStatus.FAILED if error else SequenceStatus.FINISHED
        seq.finish_reason, seq.error, seq.finish_time = reason, error, time.time()
        self._finished_outputs.append(RequestOutput.from_sequence(seq))
        if error:
            log.warning("request.failed", request_id=seq.request_id, reason=error)
        else:
            log.info("request.finished", request_id=seq.request_id, finish_reason=reason.value,
                     num_output_tokens=seq.num_output_tokens, num_preemptions=seq.num_preemptions)
