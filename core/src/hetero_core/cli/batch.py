"""``hetero run --input-file FILE --output FILE``: run a batch file through one engine.

Every valid line is submitted at once (``Engine.add_request``), so continuous batching fills the
batch; ``step()`` runs until all are done and each result is written, as one complete JSON line,
the moment its request finishes (``batch_output.ResultWriter``). Ctrl-C stops after the current
step: the lines written so far form a valid file and the command exits 130; ``--resume`` then runs
only the ids the output file does not hold yet, appending to it. A malformed line is reported,
not run, and gets an error row (exit 1). The input or output failing (unreadable, a directory, a
full disk) stops the run with one line and exit 2; the lines already written stay, each complete.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import TextIO

from hetero_core.cli.settings_args import load_cli_settings
from hetero_core.cli.speculation_line import speculation_line
from hetero_core.errors import HeteroError, InvalidRequestError

EXIT_SOME_FAILED = 1


def add_batch_arguments(run: argparse.ArgumentParser) -> None:
    batch = run.add_argument_group("batch files (see docs/batch.md)")
    batch.add_argument(
        "--input-file",
        metavar="FILE",
        help="run every request of a JSONL file (Hetero's or OpenAI's batch format)",
    )
    batch.add_argument(
        "--output",
        metavar="FILE",
        help="with --input-file: where results go, one JSON line each ('-': stdout)",
    )
    batch.add_argument(
        "--resume",
        action="store_true",
        help="with --input-file: skip ids the --output file already holds and append to it",
    )


def check_batch_arguments(args: argparse.Namespace) -> None:
    if args.input_file is None:
        if args.output is not None or args.resume:
            raise HeteroError("--output and --resume go with --input-file FILE (a batch file)")
        return
    if args.prompts or args.input:
        raise HeteroError("give prompts either as arguments or in --input-file, not both")
    if args.output is None:
        raise HeteroError("--input-file needs --output FILE for the results ('-' for stdout)")
    if args.resume and args.output == "-":
        raise HeteroError("--resume needs an output file to read back; '-' (stdout) cannot be resumed")
    if args.output != "-" and _same_file(args.input_file, args.output):
        raise HeteroError(
            f"--output {args.output} is the --input-file: writing there would overwrite the "
            "requests; choose another file"
        )
    if getattr(args, "system", None) is not None:
        raise HeteroError("--system goes with prompts, not --input-file (put system messages in the file)")


def _same_file(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.abspath(a) == os.path.abspath(b)


def batch_command(args: argparse.Namespace) -> int:
    from hetero_core.batch_files.input_file import read_batch_file
    from hetero_core.batch_files.output_file import ResultWriter, check_output, resume_output
    from hetero_core.batch_files.results import malformed_record
    from hetero_core.llm import LLM
    from hetero_core.logging import configure_logging
    from hetero_core.sampling_defaults import default_sampling_params

    settings = load_cli_settings(args)
    quiet = ("request.failed",) if settings.log_level in ("warning", "error") else ()
    configure_logging(settings.log_format, settings.log_level, quiet_events=quiet)
    params = default_sampling_params(settings, stop=args.stop, ignore_eos=args.ignore_eos or None)
    lines = _read_input(args.input_file)  # file mistakes show before the model loads
    check_output(args.output)
    done = resume_output(args.output) if args.resume else set()
    llm = LLM.from_settings(settings)
    try:
        chat = settings.chat if settings.chat is not None else llm.has_chat_template
        batch = read_batch_file(
            lines,
            params,
            chat=chat,
            max_model_len=llm.engine.max_model_len,
            count_tokens=_token_counter(llm.engine.tokenizer),
            tokenizer=llm.engine.tokenizer,
        )
        for bad in batch.malformed:
            print(f"hetero: {args.input_file}:{bad.line_number}: skipped: {bad.reason}", file=sys.stderr)
        pending = [r for r in batch.requests if r.key not in done]
        if done:
            print(
                f"hetero: resuming: {len(batch.requests) - len(pending)} of {len(batch.requests)} "
                f"requests already in {args.output}",
                file=sys.stderr,
            )
        runner = BatchRunner(llm.engine, batch.format, settings.model, sys.stderr)
        with ResultWriter(args.output, append=args.resume) as out, _DeferredInterrupt() as interrupt:
            for bad in batch.malformed:
                out.write(malformed_record(batch.format, bad))
            num_failed = runner.run(pending, out, interrupt)
    finally:
        llm.shutdown()
    return EXIT_SOME_FAILED if num_failed or batch.malformed else 0


class BatchRunner:
    def __init__(self, engine, batch_format: str, model_name: str, err: TextIO) -> None:
        self.engine, self.format, self.model_name, self.err = engine, batch_format, model_name, err

    def run(self, requests: list, out, interrupt=None) -> int:
        """Run ``requests``, writing each result's record to ``out`` (a ``ResultWriter``) as it
        finishes; the number that failed."""
        from hetero_core.batch_files.progress import Progress

        progress = Progress(len(requests), self.err)
        started, num_failed = time.perf_counter(), 0
        outputs: dict[int, list] = {}
        owner: dict[str, tuple[int, int]] = {}
        for index, request in enumerate(requests):
            outputs[index] = [None] * len(request.choices)
            for choice, (prompt, params) in enumerate(request.choices):
                request_id = f"{index}-{choice}"
                try:
                    self.engine.add_request(
                        prompt,
                        params,
                        request_id,
                        priority=request.priority,
                        tenant=request.tenant,
                        stream=False,
                    )
                    owner[request_id] = (index, choice)
                except InvalidRequestError as exc:  # the engine refuses it: this request fails alone
                    outputs[index][choice] = _Refused(str(exc))
        try:
            finished = [i for i, outs in outputs.items() if all(o is not None for o in outs)]
            while True:
                for index in finished:
                    num_failed += self._write(requests[index], outputs.pop(index), out, progress)
                if not outputs:
                    break
                if interrupt is not None and interrupt.requested:
                    raise KeyboardInterrupt
                step_outputs = self.engine.step()
                if not step_outputs and not self.engine.has_unfinished_requests():
                    raise HeteroError("the engine went idle before every request finished (an engine bug)")
                finished = []
                for output in step_outputs:
                    if output.finished and output.request_id in owner:
                        index, choice = owner.pop(output.request_id)
                        outputs[index][choice] = output
                        if all(o is not None for o in outputs[index]):
                            finished.append(index)
        finally:
            progress.close()
            for request_id in owner:  # interrupted: free what still runs
                self.engine.abort(request_id)
        elapsed = time.perf_counter() - started
        print(
            f"--- {len(requests)} request(s), {progress.num_tokens} tokens in {elapsed:.2f}s "
            f"({progress.tokens_per_second:.1f} tokens/s), {num_failed} failed",
            file=self.err,
        )
        if getattr(self.engine, "speculation", None) is not None:
            print(speculation_line(self.engine.stats()), file=self.err)
        return num_failed

    def _write(self, request, outputs: list, out, progress) -> int:
        from hetero_core.batch_files.input_file import show
        from hetero_core.batch_files.results import completions, result_record

        out.write(result_record(self.format, request, outputs, self.model_name, self.engine.tokenizer))
        failed = [o for o in outputs if o.error is not None]
        if failed:
            print(
                f"hetero: line {request.line_number} (id {show(request.id)}) failed: {failed[0].error}",
                file=self.err,
            )
        progress.update(1, sum(len(c.output_token_ids) for o in outputs for c in completions(o)))
        return 1 if failed else 0


class _Refused:
    """Stands in for the output of a choice the engine refused to queue."""

    refused = True

    def __init__(self, error: str) -> None:
        self.error, self.text, self.finish_reason = error, "", None
        self.prompt_token_ids, self.output_token_ids = [], []


class _DeferredInterrupt:
    """The first Ctrl-C only sets ``requested`` (the loop stops between steps, never mid-write);
    a second one interrupts at once."""

    def __init__(self) -> None:
        self.requested, self._previous = False, None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _token_counter(tokenizer):
    from hetero_core.engine.requests.prompts import tokenize_prompt

    def count(prompt) -> int:
        try:
            return len(tokenize_prompt(tokenizer, prompt))
        except Exception:  # the engine reports a bad prompt when it is added
            return 0

    return count


def _read_input(path: str) -> list[bytes]:
    try:
        with open(path, "rb") as f:
            return f.readlines()
    except OSError as exc:
        raise HeteroError(f"cannot read --input-file {path}: {exc.strerror}") from None
