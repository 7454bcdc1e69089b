"""``hetero run``: answer prompts. One prompt streams to stdout as tokens arrive; several print each
when finished, in input order, labelled. Logs and the stats line go to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from hetero_core.cli.batch import add_batch_arguments, batch_command, check_batch_arguments
from hetero_core.cli.run_output import end_line, label, report_failure
from hetero_core.cli.settings_args import add_reuse_server_argument, load_cli_settings
from hetero_core.cli.speculation_line import speculation_line
from hetero_core.errors import HeteroError, InvalidRequestError

EXIT_REQUEST_FAILED = 1


def add_run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "prompts",
        nargs="*",
        metavar="PROMPT",
        help="prompt text; '-' (or no PROMPT with a piped stdin) reads it from stdin",
    )
    run.add_argument("--input", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)")
    chat = run.add_mutually_exclusive_group()
    chat.add_argument(
        "--chat",
        dest="chat",
        action="store_true",
        default=None,
        help="apply the model's chat template (default: when the model has one)",
    )
    chat.add_argument(
        "--no-chat",
        "--raw",
        dest="chat",
        action="store_false",
        help="raw completion: send the prompt text as is",
    )
    run.add_argument(
        "-s", "--system", metavar="TEXT", help="a system message before each prompt (chat template)"
    )
    run.add_argument("--stop", action="append", default=None, metavar="TEXT", help="stop string (repeatable)")
    run.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS")
    run.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="INT",
        help="request priority for the scheduler policy (lower runs first; default 0)",
    )
    run.add_argument(
        "--tenant", default=None, metavar="NAME", help="who sends the requests (read by policies)"
    )
    add_reuse_server_argument(
        run,
        "answer through a running hetero serve of this model and these settings, when there is one, "
        "instead of loading the model",
    )
    add_batch_arguments(run)


def run_command(args: argparse.Namespace) -> int:
    from hetero_core.logging import configure_logging
    from hetero_core.sampling_defaults import default_sampling_params

    check_batch_arguments(args)
    if args.input_file is not None:
        return batch_command(args)
    prompts = read_prompts(list(args.prompts) + list(args.input), sys.stdin)
    settings = load_cli_settings(args)
    # Below info, a failed request is reported once, by this command (not also as a log event).
    quiet = ("request.failed",) if settings.log_level in ("warning", "error") else ()
    configure_logging(settings.log_format, settings.log_level, quiet_events=quiet)
    params = default_sampling_params(settings, stop=args.stop, ignore_eos=args.ignore_eos or None)
    who = {"priority": args.priority, "tenant": args.tenant}
    # Decided before torch is imported: a running `hetero serve` of this model and settings answers.
    code = _run_on_server(settings, prompts, args.system, params, who) if settings.reuse_server else None
    if code is None:
        code = _run_locally(settings, prompts, args.system, params, who)
    args.skip_teardown = True  # all written to stdout/stderr, the engine shut down: cli.main may exit at once
    return code


def _run_on_server(settings, prompts: list[str], system: str | None, params, who: dict) -> int | None:
    """The exit status of the prompts answered by a matching running ``hetero serve``; None when there
    is none or it could not answer (nothing printed then)."""
    from hetero_core.cli.run_on_server import reusable_server, run_on_server

    record = reusable_server(settings)
    if record is None:
        return None
    chat = settings.chat if settings.chat is not None else record.has_chat_template
    inputs = prompt_inputs(prompts, system, chat)
    return run_on_server(record, inputs, prompts, chat, params, sys.stdout, sys.stderr, **who)


def _run_locally(settings, prompts: list[str], system: str | None, params, who: dict) -> int:
    from hetero_core.llm import LLM

    started = time.perf_counter()
    llm = LLM.from_settings(settings)
    loaded = time.perf_counter()
    try:
        chat = settings.chat if settings.chat is not None else llm.has_chat_template
        inputs = prompt_inputs(prompts, system, chat)
        if len(inputs) == 1:
            outputs = [stream_one(llm.engine, inputs[0], params, sys.stdout, **who)]
        else:
            outputs = print_each_when_done(llm.engine, inputs, prompts, params, sys.stdout, **who)
        stats = llm.engine.stats()
    finally:
        llm.shutdown()
    print_stats(outputs, loaded - started, time.perf_counter() - loaded, sys.stderr)
    print_scheduler_stats(stats, sys.stderr, speculating=settings.num_speculative_tokens > 0)
    return EXIT_REQUEST_FAILED if any(o.failed for o in outputs) else 0


def prompt_inputs(prompts: list[str], system: str | None, chat: bool) -> list:
    """What each prompt is sent as: its chat messages (with ``system``) or its text."""
    if system is not None and not chat:
        raise HeteroError("--system needs the chat template: leave out --no-chat (or --raw)")
    return [chat_messages(p, system) if chat else p for p in prompts]


def read_prompts(prompts: list[str], stdin: TextIO) -> list[str]:
    """The prompts, with '-' (or, when none is given and stdin is not a terminal, all of stdin)."""
    if not prompts and stdin is not None and not stdin.isatty():
        prompts = ["-"]
    if "-" in prompts:
        text = _read_all(stdin).rstrip("\r\n")
        if not text.strip():
            raise HeteroError("no prompt given: stdin was empty")
        prompts = [text if p == "-" else p for p in prompts]
    if not prompts:
        raise HeteroError("no prompt given; pass PROMPT, --input TEXT, or '-' to read stdin")
    empty = [str(i + 1) for i, p in enumerate(prompts) if not p.strip()]
    if empty:
        which = f"prompt {empty[0]} is" if len(prompts) > 1 else "the prompt is"
        raise HeteroError(f"{which} empty; give some text")
    return prompts


def chat_messages(prompt: str, system: str | None, history: list | None = None) -> list[dict[str, str]]:
    """The messages of one chat turn: the system message (if any), earlier turns, then ``prompt``."""
    head = [{"role": "system", "content": system}] if system is not None else []
    return head + list(history or []) + [{"role": "user", "content": prompt}]


def stream_one(engine, prompt, params, out: TextIO, **request):
    """Run one request, writing its text as it grows; returns its final RequestOutput.
    ``request``: add_request's keyword arguments (priority, tenant)."""
    try:
        request_id = engine.add_request(prompt, params, **request)
    except InvalidRequestError as exc:  # a request the engine can never run fails alone (exit 1)
        rejected = _Rejected(str(exc))
        report_failure(rejected, 0)
        return rejected
    # Text that may still turn out to be the start of a stop string is held back until it is not.
    holdback = max((len(s) for s in params.stop), default=1) - 1
    num_printed, text = 0, ""
    while True:
        outputs = engine.step()
        _check_progress(engine, outputs)
        for output in outputs:
            if output.request_id != request_id:
                continue
            text = output.text
            visible = len(text) if output.finished else max(num_printed, len(text) - holdback)
            if visible > num_printed:
                out.write(text[num_printed:visible])
                out.flush()
                num_printed = visible
            if output.finished:
                end_line(out, text[:num_printed])
                report_failure(output, 0)
                return output


def print_each_when_done(engine, inputs, prompts, params, out: TextIO, **request):
    """Run all requests in one batch; print each, labelled, once it and all before it are done."""
    ids, outputs = [], {}
    for i, prompt in enumerate(inputs):
        try:
            ids.append(engine.add_request(prompt, params, stream=False, **request))
        except InvalidRequestError as exc:
            ids.append(None)
            outputs[i] = _Rejected(str(exc))
    index_of = {request_id: i for i, request_id in enumerate(ids) if request_id is not None}
    next_to_print = 0
    while True:
        while next_to_print in outputs:
            output = outputs[next_to_print]
            out.write(f"=== [{next_to_print + 1}] {label(prompts[next_to_print])}\n")
            out.write(output.text)
            end_line(out, output.text)
            out.flush()
            report_failure(output, next_to_print + 1)
            next_to_print += 1
        if next_to_print == len(inputs):
            break
        step_outputs = engine.step()
        _check_progress(engine, step_outputs)
        for output in step_outputs:
            if output.finished and output.request_id in index_of:
                outputs[index_of[output.request_id]] = output
    return [outputs[i] for i in range(len(inputs))]


def print_stats(outputs, load_seconds: float, run_seconds: float, err: TextIO) -> None:
    num_tokens = sum(len(o.output_token_ids) for o in outputs)
    rate = num_tokens / run_seconds if run_seconds > 0 else 0.0
    line = (
        f"--- {num_tokens} tokens in {run_seconds:.2f}s ({rate:.1f} tokens/s), "
        f"{len(outputs)} request(s), load {load_seconds:.2f}s"
    )
    first = outputs[0].metrics.time_to_first_token if len(outputs) == 1 and not outputs[0].failed else None
    if first is not None:
        line += f", first token {first:.2f}s"
    print(line, file=err)


def print_scheduler_stats(stats, err: TextIO, speculating: bool = False) -> None:
    print(
        f"--- prefix cache {stats.prefix_cache_hit_tokens}/{stats.prefix_cache_queried_tokens} tokens hit "
        f"({stats.prefix_cache_hit_rate:.0%}), {stats.num_preemptions} preemption(s) "
        f"({stats.num_swap_preemptions} swapped)",
        file=err,
    )
    if speculating:
        print(speculation_line(stats), file=err)


class _Rejected:
    """Stands in for the output of a prompt the engine refused to queue."""

    def __init__(self, error: str) -> None:
        self.error, self.text, self.output_token_ids, self.failed = error, "", [], True


def _check_progress(engine, step_outputs) -> None:
    if not step_outputs and not engine.has_unfinished_requests():
        raise HeteroError("the engine went idle before every request finished (an engine bug)")


def _read_all(stdin: TextIO) -> str:
    try:
        return stdin.read()
    except UnicodeDecodeError as exc:
        raise HeteroError(f"stdin is not valid UTF-8 text: {exc}") from None
