"""The import graph has no circle and no arrow running back up (read from the sources: every import
counts, function-level ones too). Rooms around the model code, bottom to top: the model core
(``hetero_core.model``), the CPU runtime built on it (``model.cpu``), core's default plugins, and
the executor plugins, which build on core and never on each other or on ``default_plugins``."""

from __future__ import annotations

from import_graph import MODEL_ROOMS, circles, import_graph, room_arrows

GRAPH = import_graph()
ARROWS = room_arrows(GRAPH, MODEL_ROOMS)
PLUGINS = ("hetero_plugins_triton", "hetero_plugins_cuda", "hetero_plugins_mock")


def test_no_import_circle_anywhere():
    assert circles(GRAPH) == []


def test_the_model_core_never_imports_the_cpu_runtime():
    assert ARROWS.get(("hetero_core.model", "hetero_core.model.cpu"), []) == []


def test_the_model_code_never_imports_an_executor():
    upward = [line for (a, b), lines in ARROWS.items() for line in lines
              if a in ("hetero_core.model", "hetero_core.model.cpu") and b not in ("hetero_core.model",
                                                                                   "hetero_core.model.cpu")]
    assert upward == []


def test_executor_plugins_build_on_core_alone():
    wrong = [line for (a, b), lines in ARROWS.items() for line in lines
             if a in PLUGINS and (b in PLUGINS or b == "hetero_core.default_plugins")]
    assert wrong == []


def test_the_model_code_and_core_executors_never_import_a_plugin_package():
    core_rooms = ("hetero_core.model", "hetero_core.default_plugins", "hetero_core.distributed")
    wrong = [f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
             if a.startswith(core_rooms) and b.startswith(PLUGINS)]
    assert wrong == []


def test_the_walker_sees_function_level_imports():
    # default_plugins imports the torch executor only inside its factory.
    assert "hetero_core.default_plugins.torch_executor" in GRAPH["hetero_core.default_plugins"]
