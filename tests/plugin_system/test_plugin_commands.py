"""The ``register_commands`` hook: plugins add ``hetero`` subcommands (hetero-bench adds ``bench``).
Core's own commands never load them; a command that is missing, broken or added twice is one line
and exit 2; discovery shows a plugin's commands and fails a plugin whose commands do not build."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hetero_core.cli.main import build_parser, main
from hetero_core.plugin_system import discovery
from hetero_core.plugin_system.discovery import load_plugins
from tests.fake_distributions import FakeDistribution

REPO = Path(__file__).resolve().parents[2]

HELLO = """
from hetero_core import HeteroError, hookimpl


def hello(args):
    if args.name == "nobody":
        raise HeteroError("hello: say hello to somebody")
    print(f"hello {args.name}")
    return 0


@hookimpl
def register_commands(commands):
    parser = commands.add_parser("hello", help="say hello")
    parser.add_argument("name")
    parser.set_defaults(handler=hello)
"""


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """install(dist_name, {entry point name: module source}): fake distributions that discovery finds
    (their modules written to a directory on sys.path); returns the number of discoveries so far."""
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_points, calls = [], []

    def discover():
        calls.append(1)
        return list(entry_points)

    def install(distribution: str, plugins: dict[str, str]):
        for name, source in plugins.items():
            (tmp_path / f"{name}_plugin.py").write_text(textwrap.dedent(source))
        fake = FakeDistribution(distribution, "1.0", {name: f"{name}_plugin" for name in plugins})
        entry_points.extend(fake.entry_points)

    monkeypatch.setattr(discovery, "_discover", discover)
    install.calls = calls
    return install


def test_a_plugin_adds_a_command_that_runs_like_cores(installed, capsys):
    installed("hetero-hello", {"hello": HELLO})
    assert main(["hello", "world"]) == 0
    assert capsys.readouterr().out == "hello world\n"
    assert main(["hello", "nobody"]) == 2
    assert capsys.readouterr().err == "hetero: error: hello: say hello to somebody\n"
    assert main(["plugins"]) == 0
    assert "hello (hetero-hello 1.0): loaded\n    command: hello\n" in capsys.readouterr().out


def test_core_commands_never_load_the_plugins_commands(installed):
    installed("hetero-hello", {"hello": HELLO})
    for command in ("run", "plugins", "serve"):
        assert "hello" not in build_parser(only=command)._subparsers._group_actions[0].choices
    assert installed.calls == []
    assert "hello" in build_parser(only="hello")._subparsers._group_actions[0].choices


@pytest.mark.parametrize(
    "name, source, error",
    [
        (
            "raises",
            """
     from hetero_core import hookimpl

     @hookimpl
     def register_commands(commands):
         raise ValueError("no parser today")
     """,
            "register_commands raised ValueError: no parser today",
        ),
        (
            "idle",
            """
     from hetero_core import hookimpl

     @hookimpl
     def register_commands(commands):
         commands.add_parser("idle")
     """,
            "register_commands: command 'idle' has no handler; call set_defaults(handler=fn) on its parser",
        ),
    ],
)
def test_a_command_that_does_not_build_fails_its_plugin(installed, capsys, name, source, error):
    installed(f"hetero-{name}", {name: source})
    info = {p.name: p for p in load_plugins().plugins}[name]
    assert info.status == "failed" and info.error == error
    assert main(["plugins"]) == 0
    assert f"{name} (hetero-{name} 1.0): failed\n    error: {error}" in capsys.readouterr().out


def test_bench_without_hetero_bench_says_what_to_install(installed, capsys):
    for argv in (["bench"], ["bench", "offline", "--executor", "mock"], ["bench", "--help"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err == (
            "hetero: error: `hetero bench` comes with the hetero-bench package, which is not installed: "
            "pip install ./bench in a checkout of Hetero (./scripts/setup.sh installs it)\n"
        )


def test_bench_whose_plugin_failed_says_why(installed, capsys):
    installed("hetero-bench", {"bench": "raise ImportError('half installed')"})
    assert main(["bench"]) == 2
    assert capsys.readouterr().err == (
        "hetero: error: `hetero bench` is unavailable: plugin 'bench' (hetero-bench "
        "1.0) failed to load: ImportError: half installed\n"
    )


def test_a_command_added_by_two_plugins_names_both(installed, capsys):
    installed("hetero-hello", {"hello": HELLO})
    installed("hetero-hello-too", {"hellotoo": HELLO})
    assert main(["hello", "world"]) == 2
    assert capsys.readouterr().err == (
        "hetero: error: command 'hello' is added by more than one plugin: 'hello' and "
        "'hellotoo'; uninstall one of them\n"
    )


def test_a_plugin_cannot_replace_a_core_command(installed, capsys):
    installed("hetero-usurper", {"usurper": HELLO.replace('"hello"', '"run"')})
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    assert "--executor" in run._option_string_actions  # core's, not the plugin's
    assert capsys.readouterr().err == (
        "hetero: warning: plugin 'usurper' adds the command 'run', which is core's; "
        "the plugin's commands are left out\n"
    )


def test_hetero_bench_declares_its_command_through_an_entry_point():
    dist = FakeDistribution.from_pyproject(REPO / "bench")
    bench = {p.name: p for p in load_plugins(entry_points=dist.entry_points).plugins}["bench"]
    assert (bench.distribution, bench.status, bench.components) == (
        "hetero-bench",
        "loaded",
        {"command": ["bench"]},
    )


def test_the_installed_hetero_bench_adds_bench():
    bench = {p.name: p for p in load_plugins().plugins}.get("bench")
    assert bench is not None, "hetero-bench is not installed: ./scripts/setup.sh installs it"
    assert bench.components == {"command": ["bench"]}
