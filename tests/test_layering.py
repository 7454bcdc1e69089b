"""The import graph has no circle and no arrow running back up (read from the sources: every import
counts, function-level ones too). Rooms around the model code, bottom to top: the model core
(``hetero_core.model``), the CPU runtime built on it (``model.cpu``), core's default plugins, and
the executor plugins, which build on core and never on each other or on ``default_plugins``."""

from __future__ import annotations

from tests.import_graph import MODEL_ROOMS, circles, core_rooms, import_graph, room_arrows

GRAPH = import_graph()
ARROWS = room_arrows(GRAPH, MODEL_ROOMS)
PLUGINS = ("hetero_plugins_triton", "hetero_plugins_cuda", "hetero_plugins_mock")
OUTSIDE_CORE = (*PLUGINS, "hetero_bench")


def test_no_import_circle_anywhere():
    assert circles(GRAPH) == []


def test_core_rooms_form_no_circle():
    """Folders and root modules of hetero_core as rooms: no two rooms import each other, even
    through others (an arrow running back up makes such a circle)."""
    assert circles(core_rooms(GRAPH)) == []


def test_core_never_imports_a_plugin_package_or_the_benchmarks():
    wrong = [
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        for b in targets
        if a.startswith("hetero_core") and b.startswith(OUTSIDE_CORE)
    ]
    assert wrong == []


def test_the_model_core_never_imports_the_cpu_runtime():
    assert ARROWS.get(("hetero_core.model", "hetero_core.model.cpu"), []) == []


def test_the_model_code_never_imports_an_executor():
    upward = [
        line
        for (a, b), lines in ARROWS.items()
        for line in lines
        if a in ("hetero_core.model", "hetero_core.model.cpu")
        and b not in ("hetero_core.model", "hetero_core.model.cpu")
    ]
    assert upward == []


def test_executor_plugins_build_on_core_alone():
    wrong = [
        line
        for (a, b), lines in ARROWS.items()
        for line in lines
        if a in PLUGINS and (b in PLUGINS or b == "hetero_core.default_plugins")
    ]
    assert wrong == []


def test_the_walker_sees_function_level_imports():
    # default_plugins imports the torch executor only inside its factory.
    assert "hetero_core.default_plugins.torch_executor" in GRAPH["hetero_core.default_plugins"]
