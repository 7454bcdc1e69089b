"""One table of seams: settings fields, CLI flags, hooks, the registry and messages all read it."""

import pytest

from hetero_core.cli.main import build_parser
from hetero_core.errors import UnknownComponentError
from hetero_core.plugin_system import hookspecs
from hetero_core.plugin_system.discovery import HOOK_FOR_SEAM, load_plugins
from hetero_core.plugin_system.registry import Registry
from hetero_core.plugin_system.seams import SEAM_TABLE, SEAMS
from hetero_core.settings import HeteroSettings, load_settings


def test_every_seam_has_a_hook_spec_and_every_hook_spec_a_seam():
    specs = {name for name in dir(hookspecs) if name.startswith("register_")}
    # the hooks that are no seam: commands, and architectures (chosen by config.json, not by settings)
    assert specs == {seam.hook for seam in SEAM_TABLE} | {"register_commands", "register_model_architectures"}
    assert HOOK_FOR_SEAM == {seam.name: seam.hook for seam in SEAM_TABLE}


def test_every_seam_is_a_setting_with_its_default_and_a_cli_flag():
    settings = load_settings()
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    for seam in SEAM_TABLE:
        assert seam.name in HeteroSettings.model_fields
        assert settings.component_name(seam.name) == seam.default
        flag = "--" + seam.name.replace("_", "-")
        assert flag in run._option_string_actions
        assert load_settings(**{seam.name: "x"}).component_name(seam.name) == "x"


def test_every_seam_has_a_registry_bucket_and_a_label_in_messages():
    registry = load_plugins(entry_points=[]).registry
    assert set(Registry()._components) == set(SEAMS)
    for seam in SEAM_TABLE:
        assert registry.names(seam.name), seam.name  # core registers a component for every seam
        with pytest.raises(UnknownComponentError) as err:
            registry.get(seam.name, "no-such-thing")
        assert str(err.value).startswith(f"unknown {seam.label} 'no-such-thing'")
