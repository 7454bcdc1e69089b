"""``hetero run`` answered by a running ``hetero serve`` of the same model and settings, as ollama's
``run`` uses its server: no torch imported, no model loaded (docs/quickstart.md#reusing-a-running-server).

``reusable_server`` finds one: a live record in the cache (``cache/serve_registry.py``) whose identity
matches this run's settings (the rule: ``serve_identity``), and which this run can call (a server with
an API key needs ``HETERO_API_KEY``). ``run_on_server`` then sends the prompts: one streams to stdout as
it arrives; several run at once and print, labelled, in input order, each once it and all before it are
done. What is printed is what the local run prints (the same text, the same ``hetero: request failed``
lines and exit 1), and the stats line names the server instead of the load time. A server that cannot
answer before anything was printed (gone, overloaded, refusing the key) leaves the run to load the model
itself, with one info event (``run.server_unavailable``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TextIO

from hetero_core.cache.serve_registry import ServerRecord, live_servers
from hetero_core.cli.run_output import end_line, label, report_failure
from hetero_core.cli.serve_identity import matches
from hetero_core.cli.serve_record import registry_cache_dir
from hetero_core.cli.server_client import (
    RequestRefused,
    ServerAnswer,
    ServerUnavailable,
    fetch,
    request_body,
    stream,
)
from hetero_core.logging import get_logger

API_KEY_ENV = "HETERO_API_KEY"
MAX_IN_FLIGHT = 16  # requests of one run sent at once (the server batches them, as the local engine would)
EXIT_REQUEST_FAILED = 1

log = get_logger("hetero.run")


def reusable_server(settings) -> ServerRecord | None:
    """The oldest live server whose answers are this run's own, or None."""
    for record in live_servers(registry_cache_dir(settings)):
        if not matches(record.identity, settings):
            continue
        if record.needs_api_key and not os.environ.get(API_KEY_ENV):
            log.info("run.server_needs_api_key", url=record.url, hint=f"set {API_KEY_ENV}")
            continue
        return record
    return None


def run_on_server(record: ServerRecord, inputs, prompts, chat: bool, params, out: TextIO, err: TextIO, **who):
    """Answer ``inputs`` (chat messages or texts; ``prompts``: their texts, for labels) on ``record``'s
    server; the exit status, or None when it could not answer and nothing was printed. ``who``: the
    request's ``priority`` and ``tenant``."""
    log.info("run.reusing_server", url=record.url, pid=record.pid)
    bodies = [request_body(p, chat, params, record.model_name, len(inputs) == 1, **who) for p in inputs]
    api_key = os.environ.get(API_KEY_ENV)
    started = time.perf_counter()
    try:
        if len(bodies) == 1:
            answers = [_stream_one(record, bodies[0], api_key, out)]
        else:
            answers = _each_when_done(record, bodies, prompts, api_key, out)
    except ServerUnavailable as exc:
        log.info("run.server_unavailable", url=record.url, reason=str(exc), action="running locally")
        return None
    seconds = time.perf_counter() - started
    num_tokens = sum(a.num_tokens for a in answers)
    line = (
        f"--- {num_tokens} tokens in {seconds:.2f}s ({num_tokens / seconds if seconds > 0 else 0.0:.1f} "
        f"tokens/s), {len(answers)} request(s), answered by hetero serve at {record.url} (pid {record.pid})"
    )
    if len(answers) == 1 and not answers[0].failed and answers[0].first_token_s is not None:
        line += f", first token {answers[0].first_token_s:.2f}s"
    print(line, file=err)
    return EXIT_REQUEST_FAILED if any(a.failed for a in answers) else 0


def _stream_one(record, body: dict, api_key, out: TextIO) -> ServerAnswer:
    answer = ServerAnswer()
    try:
        stream(record, body, api_key, out, answer)
    except RequestRefused as exc:
        answer.error = str(exc)
    except ServerUnavailable as exc:
        if not exc.printed:
            raise
        answer.error = f"hetero serve at {record.url} stopped answering: {exc}"
    end_line(out, answer.text)
    report_failure(answer, 0)
    return answer


def _each_when_done(record, bodies: list[dict], prompts, api_key, out: TextIO) -> list[ServerAnswer]:
    """Every request at once (at most ``MAX_IN_FLIGHT``), printed in input order; a server unable to
    answer the first raises ``ServerUnavailable`` (nothing printed), a later one fails that request."""
    results: list = [None] * len(bodies)
    done = [threading.Event() for _ in bodies]
    slots = threading.Semaphore(MAX_IN_FLIGHT)

    def ask(i: int) -> None:
        with slots:
            try:
                results[i] = fetch(record, bodies[i], api_key)
            except RequestRefused as exc:
                results[i] = ServerAnswer(error=str(exc))
            except ServerUnavailable as exc:
                results[i] = exc
            except BaseException as exc:  # noqa: BLE001 (handed to the printing thread)
                results[i] = exc
        done[i].set()

    for i in range(len(bodies)):  # daemon threads: falling back to the local run does not wait for them
        threading.Thread(target=ask, args=(i,), daemon=True).start()
    answers = []
    for i in range(len(bodies)):
        done[i].wait()
        answer = results[i]
        if isinstance(answer, ServerUnavailable):
            if i == 0:
                raise answer
            answer = ServerAnswer(error=f"hetero serve at {record.url} stopped answering: {answer}")
        elif isinstance(answer, BaseException):
            raise answer
        out.write(f"=== [{i + 1}] {label(prompts[i])}\n")
        out.write(answer.text)
        end_line(out, answer.text)
        out.flush()
        report_failure(answer, i + 1)
        answers.append(answer)
    return answers
