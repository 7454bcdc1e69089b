"""The architecture plugin packages in plugins/: discovered through their entry point, their
architecture registered; their own tests (ArchitectureContract against transformers) run in the same
pytest run (the root pyproject's testpaths);
tests/plugin_system/test_plugin_imports.py checks they import only public hetero_core modules."""

from pathlib import Path

from hetero_core.plugin_system.discovery import load_plugins
from tests.fake_distributions import FakeDistribution

PHI3 = Path(__file__).resolve().parents[2] / "plugins" / "hetero-model-phi3"


def test_phi3_is_found_through_its_entry_point_and_registers_its_architecture():
    dist = FakeDistribution.from_pyproject(PHI3)
    plugin_set = load_plugins(entry_points=list(dist.entry_points))
    info = {p.name: p for p in plugin_set.plugins}["phi3"]
    assert (info.distribution, info.status, info.components) == (
        "hetero-model-phi3",
        "loaded",
        {"architecture": ["Phi3ForCausalLM"]},
    )
    architectures = plugin_set.registry.architectures
    assert (
        architectures.plugin_of("Phi3ForCausalLM") == "phi3"
        and not architectures.get("Phi3ForCausalLM").tensor_parallel
    )
