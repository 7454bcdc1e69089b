"""The third-party-style policy packages in plugins/: discovered through their entry point, selectable
by settings, conformant (the kit), and importing only public hetero_core modules."""

import ast
import sys
from pathlib import Path

import pytest

from fake_distributions import FakeDistribution
from hetero_core.testing.policy_contract import SchedulerPolicyContract

PLUGINS = Path(__file__).resolve().parent.parent / "plugins"
FAIR_SHARE = PLUGINS / "hetero-policy-fair-share"
PUBLIC_MODULES = {"hetero_core", "hetero_core.policy", "hetero_core.plugin_system.hookspecs", "hetero_core.testing",
                  "hetero_core.testing.policy_contract"}
sys.path.insert(0, str(FAIR_SHARE / "src"))  # as if pip-installed

from hetero_policy_fair_share import FairShareOptions, FairSharePolicy  # noqa: E402




def test_fair_share_is_found_through_its_entry_point_and_selected_by_settings():
    import hetero_plugins_mock

    from hetero_core.builder import build_engine
    from hetero_core.engine.params import SamplingParams
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.settings import load_settings

    dist = FakeDistribution.from_pyproject(FAIR_SHARE)
    plugin_set = load_plugins(entry_points=list(dist.entry_points), extra_plugins=[("mock", hetero_plugins_mock)])
    info = {p.name: p for p in plugin_set.plugins}["fair-share"]
    assert (info.distribution, info.status, info.components) == (
        "hetero-policy-fair-share", "loaded", {"scheduler_policy": ["fair-share"]})
    policy = {"name": "fair-share", "fair-share": {"max_running_per_tenant": 1, "weights": {"alice": 2}}}
    engine = build_engine(load_settings(executor="mock", scheduler_policy=policy), plugin_set)
    assert engine.scheduler.policy.options == FairShareOptions(max_running_per_tenant=1, weights={"alice": 2.0})
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for tenant in ("alice", "alice", "bob"):
        engine.add_request("hello", params, tenant=tenant)
    engine.step()
    assert [s.tenant for s in engine.scheduler.running] == ["alice", "bob"]  # alice's second is held back
    while engine.has_unfinished_requests():
        engine.step()


def test_a_bad_option_names_the_plugin_section():
    from hetero_core.errors import ConfigError
    from hetero_core.plugin_system.registry import Component

    component = Component("scheduler_policy", "fair-share", FairSharePolicy, "fair-share", FairShareOptions)
    with pytest.raises(ConfigError, match="scheduler_policy.fair-share: max_running_per_tenant"):
        component.validate_options({"max_running_per_tenant": 0})


class TestFairShareConforms(SchedulerPolicyContract):
    def make_policy(self):
        return FairSharePolicy(FairShareOptions(max_running_per_tenant=2))


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


@pytest.mark.parametrize("source", sorted(PLUGINS.glob("*/**/*.py")), ids=lambda p: str(p.relative_to(PLUGINS)))
def test_plugins_import_only_public_hetero_core_modules(source):
    private = {m for m in imported_modules(source) if m.split(".")[0] == "hetero_core" and m not in PUBLIC_MODULES}
    assert not private, f"{source.name} imports private hetero_core modules {sorted(private)}; use hetero_core.policy"


def test_the_public_import_check_would_catch_a_private_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from hetero_core.engine.scheduler import Scheduler\nimport hetero_core.policy\n")
    assert {m for m in imported_modules(bad) if m not in PUBLIC_MODULES} == {"hetero_core.engine.scheduler"}
