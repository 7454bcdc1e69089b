"""``hetero chat``: an interactive chat in the terminal. Each answer streams as it is generated; the
conversation (``-s/--system`` first) is kept for the session; Ctrl-D (or an empty line at EOF)
leaves, Ctrl-C stops the answer being written. Line editing and history come from readline where
Python has it. Messages go through the tokenizer's chat template (the byte tokenizer's plain
``role: content`` lines on the mock executor).
"""

from __future__ import annotations

import argparse
import sys

from hetero_core.cli.run import chat_messages, stream_one
from hetero_core.cli.settings_args import add_settings_arguments, load_cli_settings

PROMPT = ">>> "


def add_chat_command(commands, *, with_arguments: bool = True) -> None:
    chat = commands.add_parser("chat", help="chat with the model in the terminal (Ctrl-D leaves)")
    if with_arguments:
        chat.add_argument("-s", "--system", metavar="TEXT", help="the system message of the conversation")
        add_settings_arguments(chat)
    chat.set_defaults(handler=chat_command)


def chat_command(args: argparse.Namespace) -> int:
    from hetero_core.llm import LLM
    from hetero_core.logging import configure_logging
    from hetero_core.sampling_defaults import default_sampling_params

    settings = load_cli_settings(args)
    configure_logging(settings.log_format, settings.log_level, quiet_events=("request.failed",))
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    params = default_sampling_params(settings)
    llm = LLM.from_settings(settings)
    try:
        return converse(llm.engine, params, args.system, sys.stdin, sys.stdout)
    finally:
        llm.shutdown()


def converse(engine, params, system: str | None, stdin, out) -> int:
    """Read a line, answer it (streamed), keep both; until end of input. Returns the exit status."""
    history: list[dict[str, str]] = []
    interactive = stdin.isatty()
    while True:
        try:
            line = input(PROMPT) if interactive and stdin is sys.stdin else _read_line(stdin)
        except EOFError:
            if interactive:
                out.write("\n")
            return 0
        if not line.strip():
            continue
        messages = chat_messages(line, system, history)
        try:
            output = stream_one(engine, messages, params, out)
        except KeyboardInterrupt:  # stop this answer, keep the session
            out.write("\n")
            for request_id in engine.running_request_ids():
                engine.abort(request_id)
            engine.step()
            continue
        if not output.failed:
            history += [{"role": "user", "content": line}, {"role": "assistant", "content": output.text}]


def _read_line(stdin) -> str:
    line = stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\n")
