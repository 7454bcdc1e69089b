"""docs/configuration.md is the reference generated from the settings models: a setting or a built-in
component option added without regenerating it fails here."""

from __future__ import annotations

from pathlib import Path

import hetero_plugins_cuda
import hetero_plugins_mock
import hetero_plugins_triton
from hetero_core.cli.config_reference import render
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import HeteroSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def rendered() -> str:
    plugins = load_plugins(
        entry_points=[],
        extra_plugins=[
            ("mock", hetero_plugins_mock),
            ("triton", hetero_plugins_triton),
            ("cuda", hetero_plugins_cuda),
        ],
    )
    return render(plugins.registry)


def test_the_committed_reference_is_up_to_date():
    assert DOC.read_text() == rendered(), (
        "docs/configuration.md is stale: run "
        "`python -m hetero_core.cli.config_reference > docs/configuration.md`"
    )


def test_every_setting_and_built_in_option_is_documented():
    text = rendered()
    for name in HeteroSettings.model_fields:
        assert f"| `{name}` |" in text and f"`HETERO_{name.upper()}`" in text
    for section, option in [
        ("executor.torch", "num_threads"),
        ("executor.mock", "eos_after"),
        ("executor.triton", "num_splits"),
        ("executor.cuda", "cuda_graphs"),
    ]:
        assert f"## `[{section}]`" in text
        assert f"| `{option}` |" in text.split(f"## `[{section}]`")[1]
