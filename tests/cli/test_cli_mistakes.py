"""Mistakes on the ``hetero`` command line (issue 34, items 5 and 6): a misspelt flag, command or choice
is reported by the command it was made in, under that command's usage, with the closest name, exit 2;
numbers in the errors are shown as numbers. ``main(argv)`` in-process; one subprocess for the real
console script."""

from __future__ import annotations

import pytest

from hetero_core.cli.main import main
from hetero_core.cli.parser import HeteroParser
from hetero_core.validation import as_number, is_number_field
from tests.cli_helpers import hetero


def fails(capsys, *argv: str) -> list[str]:
    """stderr's lines of ``hetero ARGV``, which must exit 2 (argparse's status for a usage mistake)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()


@pytest.mark.parametrize(
    "argv, usage, message",
    [
        (
            ["run", "--max-tokns", "5", "hi"],
            "usage: hetero run ",
            "hetero run: error: unrecognized arguments: --max-tokns; did you mean --max-tokens?",
        ),
        (
            ["run", "--max-tokns=5", "hi"],
            "usage: hetero run ",
            "hetero run: error: unrecognized arguments: --max-tokns=5; did you mean --max-tokens?",
        ),
        (
            ["serve", "--executor", "mock", "--prot", "9"],
            "usage: hetero serve ",
            "hetero serve: error: unrecognized arguments: --prot 9; did you mean --port?",
        ),
        (
            ["chat", "--sytem", "be brief"],
            "usage: hetero chat ",
            "hetero chat: error: unrecognized arguments: --sytem be brief; did you mean --system?",
        ),
        (
            ["plugins", "--jsn"],
            "usage: hetero plugins ",
            "hetero plugins: error: unrecognized arguments: --jsn; did you mean --json?",
        ),
        (
            ["settings", "--executr", "mock"],
            "usage: hetero settings ",
            "hetero settings: error: unrecognized arguments: --executr mock; did you mean --executor?",
        ),
    ],
)
def test_a_misspelt_flag_is_named_under_its_commands_usage(capsys, argv, usage, message):
    lines = fails(capsys, *argv)
    assert lines[0].startswith(usage)  # the command's usage, not `usage: hetero [-h] [--version] COMMAND`
    assert lines[-1] == message


def test_several_misspelt_flags_are_each_matched(capsys):
    lines = fails(capsys, "run", "--max-tokns", "5", "--tempature", "0", "hi")
    assert lines[-1].endswith("did you mean --max-tokens for --max-tokns, --temperature for --tempature?")


def test_a_flag_far_from_every_flag_gets_no_guess(capsys):
    assert fails(capsys, "plugins", "--zzzz")[-1] == "hetero plugins: error: unrecognized arguments: --zzzz"


def test_an_abbreviated_flag_is_a_mistake_that_names_the_flag(capsys):
    # argparse would take --max-tok for --max-tokens until a new setting also began with it
    assert fails(capsys, "run", "--max-tok", "5", "hi")[-1].endswith(
        "unrecognized arguments: --max-tok; did you mean --max-tokens?"
    )


def test_a_misspelt_command_names_the_command(capsys):
    lines = fails(capsys, "runn", "hi")
    assert lines[0].startswith("usage: hetero ")
    assert lines[-1].startswith("hetero: error: argument COMMAND: invalid choice: 'runn' (choose from 'run',")
    assert lines[-1].endswith("; did you mean 'run'?")


def test_a_misspelt_choice_names_the_choice(capsys):
    assert fails(capsys, "run", "--log-format", "jsn", "hi")[-1] == (
        "hetero run: error: argument --log-format: invalid choice: 'jsn' (choose from 'console', 'json'); "
        "did you mean 'json'?"
    )


def test_a_commands_flag_given_before_the_command_says_where_it_goes(capsys):
    assert fails(capsys, "-v", "run", "hi")[-1] == (
        "hetero: error: unrecognized arguments: -v; -v is an option of `hetero run`: put it after the command"
    )


def test_a_benchmarks_misspelt_flag_is_one_line_naming_the_flag(capsys):
    assert main(["bench", "offline", "--executr", "mock"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "hetero: error: hetero bench offline: unrecognized arguments: --executr mock; "
        "did you mean --executor?\n"
    )


def test_a_plugins_own_subcommands_report_their_mistakes_themselves(capsys):
    """What ``register_commands`` gets (``commands.add_parser``) makes HeteroParsers, nested ones too."""
    parser = HeteroParser(prog="hetero")
    commands = parser.add_subparsers(dest="command")
    tool = commands.add_parser("tool")
    actions = tool.add_subparsers(dest="action")
    actions.add_parser("sync").add_argument("--dry-run", action="store_true")
    assert parser.parse_args(["tool", "sync", "--dry-run"]).dry_run is True
    with pytest.raises(SystemExit):
        parser.parse_args(["tool", "sync", "--dryrun"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("usage: hetero tool sync ")
    assert err[-1] == "hetero tool sync: error: unrecognized arguments: --dryrun; did you mean --dry-run?"


def test_the_console_script_exits_2_with_the_suggestion():
    result = hetero("run", "--max-tokns", "5", "hi")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("usage: hetero run ")
    assert result.stderr.strip().endswith("did you mean --max-tokens?")


# -- numbers are shown as numbers ------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, shown",
    [
        (["--max-tokens", "-4"], "max_tokens: Input should be greater than or equal to 1 (got -4)"),
        (["--temperature", "-0.5"], "temperature: Input should be greater than or equal to 0 (got -0.5)"),
        (
            ["--max-prefill-chunk", "0"],
            "max_prefill_chunk: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            ["--max-tokens", "x"],
            "max_tokens: Input should be a valid integer, unable to parse string as an integer (got 'x')",
        ),  # text the user typed stays text
    ],
)
def test_a_number_given_as_a_flag_is_shown_as_a_number(capsys, argv, shown):
    assert main(["run", *argv, "hi"]) == 2
    assert capsys.readouterr().err == f"hetero: error: invalid settings: {shown}\n"


def test_a_number_given_in_a_variable_is_shown_as_a_number(capsys, monkeypatch):
    monkeypatch.setenv("HETERO_MAX_TOKENS", "-4")
    assert main(["run", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("max_tokens: Input should be greater than or equal to 1 (got -4)\n")


def test_a_string_in_a_settings_file_stays_quoted(capsys, tmp_path):
    config = tmp_path / "hetero.toml"
    config.write_text('max_tokens = "-4"\n')
    assert main(["run", "--config", str(config), "hi"]) == 2
    assert capsys.readouterr().err.endswith("(got '-4')\n")


def test_a_benchmarks_number_out_of_range_is_shown_as_a_number(capsys):
    assert main(["bench", "offline", "--num-requests", "0"]) == 2
    assert "argument --num-requests: expected a positive integer, got 0\n" in capsys.readouterr().err


def test_text_spelling_a_number_becomes_that_number_for_a_number_setting_only():
    assert [as_number(t) for t in ("-4", "0.5", "1e3", "x", "")] == [-4, 0.5, 1000.0, "x", ""]
    assert is_number_field(int) and is_number_field(float) and is_number_field(int | None)
    assert not is_number_field(bool) and not is_number_field(str) and not is_number_field(int | str)


def test_a_number_in_a_server_variable_is_shown_as_a_number(capsys, monkeypatch):
    monkeypatch.setenv("HETERO_PORT", "-4")
    assert main(["serve", "--executor", "mock"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "hetero: error: invalid server settings: port: Input should be greater than or equal to 0 (got -4)\n"
    )
