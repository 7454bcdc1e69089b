"""The architecture plugin packages in plugins/: discovered through their entry point, their
architecture registered, their own tests (ArchitectureContract against transformers) run here too;
tests/test_plugin_imports.py checks they import only public hetero_core modules."""

import sys
from pathlib import Path

from fake_distributions import FakeDistribution
from hetero_core.plugin_system.discovery import load_plugins

PHI3 = Path(__file__).resolve().parent.parent / "plugins" / "hetero-model-phi3"
sys.path.insert(0, str(PHI3 / "src"))  # as if pip-installed
sys.path.insert(0, str(PHI3 / "tests"))

from test_phi3 import (TestPhi3, TestPhi3PartialRotaryLongRope,  # noqa: E402,F401  (collected here as well)
                       test_configs_it_cannot_run_are_refused_by_name,
                       test_longrope_and_sliding_window_cap_the_context_where_the_results_stay_exact)


def test_phi3_is_found_through_its_entry_point_and_registers_its_architecture():
    dist = FakeDistribution.from_pyproject(PHI3)
    plugin_set = load_plugins(entry_points=list(dist.entry_points))
    info = {p.name: p for p in plugin_set.plugins}["phi3"]
    assert (info.distribution, info.status, info.components) == (
        "hetero-model-phi3", "loaded", {"architecture": ["Phi3ForCausalLM"]})
    architectures = plugin_set.registry.architectures
    assert architectures.plugin_of("Phi3ForCausalLM") == "phi3" and not architectures.get("Phi3ForCausalLM").tensor_parallel
