"""The argument parser of every ``hetero`` command (plugins' commands too: ``commands.add_parser``
makes one). A mistake is reported by the command it was made in, under that command's usage, with
the closest name, as the settings file, ``HETERO_*`` variables and ``LLM(...)`` report theirs:
``hetero run: error: unrecognized arguments: --max-tokns; did you mean --max-tokens?``, and
``invalid choice: 'runn' (...); did you mean 'run'?`` for a command or a flag's choice. Exit 2.

Flags are never abbreviated (argparse's ``allow_abbrev`` is off): ``--max-tok`` is a mistake whose
fix is named, not a prefix that would start meaning another flag the day a new setting begins with it.
"""

from __future__ import annotations

import argparse

from hetero_core.suggest import closest, did_you_mean, meant


class HeteroParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that knows every argument it may be given: an unknown one is an error of
    this parser (a subcommand's, not the top level's) naming the closest flag."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:  # a subcommand's would otherwise reach the top level, which would print its own usage
            self.error(self.unrecognized(extras, namespace))
        return namespace, extras

    def unrecognized(self, extras: list[str], namespace: argparse.Namespace) -> str:
        """``unrecognized arguments: ...`` and the flag meant by each misspelt one."""
        message = "unrecognized arguments: " + " ".join(extras)
        flags = [arg.split("=", 1)[0] for arg in extras if len(arg) > 1 and arg[0] in self.prefix_chars]
        command = self._chosen_command(namespace)
        for flag in flags:  # `hetero -v run`: a flag of the command, given before it
            if command is not None and flag in command._option_string_actions:
                return f"{message}; {flag} is an option of `{command.prog}`: put it after the command"
        matches = {flag: self._flag_meant(flag) for flag in flags}
        matches = {flag: match for flag, match in matches.items() if match is not None}
        if len(matches) == 1:
            (match,) = matches.values()
            return message + meant(match, quote=False)
        if matches:
            return message + "; did you mean " + ", ".join(f"{m} for {f}" for f, m in matches.items()) + "?"
        return message

    def _check_value(self, action: argparse.Action, value) -> None:
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            names = [c for c in action.choices if isinstance(c, str)]
            hint = did_you_mean(value, names) if isinstance(value, str) else ""
            raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from {choices}){hint}")

    def _flag_meant(self, flag: str) -> str | None:
        """The flag of this parser closest to ``flag``, compared without their dashes (which every
        flag shares): ``--long`` ones for ``--x``, all for ``-x``."""
        flags = [f for f in self._option_string_actions if f.startswith("--") or not flag.startswith("--")]
        bare = {f.lstrip(self.prefix_chars): f for f in flags}
        match = closest(flag.lstrip(self.prefix_chars), bare)
        return bare[match] if match is not None else None

    def _chosen_command(self, namespace: argparse.Namespace) -> argparse.ArgumentParser | None:
        """The subcommand's parser ``namespace`` chose, if this parser has subcommands."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and action.dest is not argparse.SUPPRESS:
                return action.choices.get(getattr(namespace, action.dest, None))
        return None
