"""The third-party-style policy packages in plugins/: discovered through their entry point, selectable
by settings and conformant (the kit); tests/plugin_system/test_plugin_imports.py checks they import
only public hetero_core modules."""

from pathlib import Path

import pytest

from hetero_core.testing import SchedulerPolicyContract
from hetero_policy_fair_share import FairShareOptions, FairSharePolicy  # installed by scripts/setup.sh
from tests.fake_distributions import FakeDistribution

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
FAIR_SHARE = PLUGINS / "hetero-policy-fair-share"


def test_fair_share_is_found_through_its_entry_point_and_selected_by_settings():
    import hetero_plugins_mock
    from hetero_core.builder import build_engine
    from hetero_core.engine.requests.params import SamplingParams
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.settings import load_settings

    dist = FakeDistribution.from_pyproject(FAIR_SHARE)
    plugin_set = load_plugins(
        entry_points=list(dist.entry_points), extra_plugins=[("mock", hetero_plugins_mock)]
    )
    info = {p.name: p for p in plugin_set.plugins}["fair-share"]
    assert (info.distribution, info.status, info.components) == (
        "hetero-policy-fair-share",
        "loaded",
        {"scheduler_policy": ["fair-share"]},
    )
    policy = {"name": "fair-share", "fair-share": {"max_running_per_tenant": 1, "weights": {"alice": 2}}}
    engine = build_engine(load_settings(executor="mock", scheduler_policy=policy), plugin_set)
    assert engine.scheduler.policy.options == FairShareOptions(
        max_running_per_tenant=1, weights={"alice": 2.0}
    )
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
