"""``distributed_executor_backend`` and ``ray_address`` as settings and flags: validated at the edge, in
one line; ``ray`` needs ranks to place (tensor_parallel_size x pipeline_parallel_size > 1: refused
otherwise, since one process has nothing to place); without Ray installed, choosing it says what to
install; ``mp`` imports no Ray. None of these start a worker or a Ray instance."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from hetero_core.builder import build_engine
from hetero_core.cli.main import main
from hetero_core.distributed.worker_launcher import RAY_EXTRA_HINT, launcher_for
from hetero_core.errors import ConfigError
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import load_settings


def test_the_default_backend_is_local_processes():
    settings = load_settings()
    assert settings.distributed_executor_backend == "mp" and settings.ray_address is None


def test_an_unknown_backend_is_refused_naming_the_choices():
    with pytest.raises(ConfigError) as error:
        load_settings(distributed_executor_backend="rya", tensor_parallel_size=2)
    assert "distributed_executor_backend: Input should be 'mp' or 'ray' (got 'rya')" in str(error.value)


def test_an_unknown_backend_flag_is_a_usage_error_with_the_closest_name(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--executor", "mock", "--distributed-executor-backend", "rya", "hi"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'rya' (choose from 'mp', 'ray'); did you mean 'ray'?" in err
    assert "Traceback" not in err


def test_ray_with_one_rank_is_refused():
    with pytest.raises(ConfigError) as error:
        load_settings(distributed_executor_backend="ray")
    message = str(error.value)
    assert "distributed_executor_backend 'ray' places the ranks of tensor_parallel_size x" in message
    assert "set one of them > 1, or distributed_executor_backend = 'mp'" in message
    assert "\n" not in message


def test_ray_with_several_ranks_is_accepted_from_the_environment(monkeypatch):
    monkeypatch.setenv("HETERO_DISTRIBUTED_EXECUTOR_BACKEND", "ray")
    monkeypatch.setenv("HETERO_RAY_ADDRESS", "10.0.0.5:6379")
    settings = load_settings(pipeline_parallel_size=2)
    assert settings.distributed_executor_backend == "ray" and settings.ray_address == "10.0.0.5:6379"


def test_a_ray_address_the_local_backend_would_ignore_is_refused():
    settings = load_settings(executor="mock", ray_address="10.0.0.5:6379")
    with pytest.raises(ConfigError) as error:
        build_engine(settings, load_plugins(entry_points=[]))
    assert str(error.value).startswith(
        "ray_address '10.0.0.5:6379' is the Ray cluster distributed_executor_backend 'ray' places the "
        "ranks on"
    )


def test_ray_without_ray_installed_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # importing it raises ImportError naming it
    for module in ("hetero_core.distributed.ray_launcher", "hetero_core.distributed.ray_rank"):
        monkeypatch.delitem(sys.modules, module, raising=False)  # imported afresh, without Ray
    settings = load_settings(distributed_executor_backend="ray", pipeline_parallel_size=2)
    ctx = SimpleNamespace(settings=settings, options=None)
    with pytest.raises(ConfigError) as error:
        launcher_for(ctx)
    assert str(error.value) == RAY_EXTRA_HINT
    assert "pip install 'hetero-core[ray]'" in RAY_EXTRA_HINT


def test_the_local_backend_imports_no_ray():
    code = (
        "import sys; from types import SimpleNamespace; from hetero_core.settings import load_settings; "
        "from hetero_core.distributed.worker_launcher import launcher_for; "
        "launcher_for(SimpleNamespace(settings=load_settings(tensor_parallel_size=2), options=None)); "
        "print('ray' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
