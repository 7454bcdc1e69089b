"""The project's own import graph, read from the sources (no module is imported).

Every ``import`` and ``from ... import`` counts wherever it stands: at module level, inside a function
(a function-level import that only hides a circle is the circle) or under ``if TYPE_CHECKING``.
``python tests/import_graph.py`` prints the arrows between the model code's rooms and the executors.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Import root -> the folder that holds it.
PACKAGES = {
    "hetero_core": ROOT / "core" / "src",
    "hetero_plugins_mock": ROOT / "hetero_plugins_mock" / "src",
    "hetero_plugins_triton": ROOT / "hetero_plugins_triton" / "src",
    "hetero_plugins_cuda": ROOT / "hetero_plugins_cuda" / "src",
    "hetero_bench": ROOT / "bench" / "src",
}


def module_files() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of ``PACKAGES``."""
    modules = {}
    for package, folder in PACKAGES.items():
        for path in sorted((folder / package).rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (submodules named in ``from pkg import mod`` included)."""
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, name, is_package):
                found = _known(target, modules)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def _known(target: str, modules: dict[str, Path]) -> str | None:
    """``target`` or its nearest enclosing package that is a project module (None: not ours)."""
    parts = target.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def room(module: str, rooms: tuple[str, ...]) -> str | None:
    """The longest of ``rooms`` (dotted prefixes) that holds ``module``."""
    held = [r for r in rooms if module == r or module.startswith(r + ".")]
    return max(held, key=len) if held else None


def room_arrows(graph: dict[str, set[str]], rooms: tuple[str, ...]) -> dict[tuple[str, str], list[str]]:
    """(from room, to room) -> the module arrows that make it, between different rooms."""
    arrows = defaultdict(list)
    for source, targets in graph.items():
        for target in targets:
            a, b = room(source, rooms), room(target, rooms)
            if a is not None and b is not None and a != b:
                arrows[(a, b)].append(f"{source} -> {target}")
    return dict(arrows)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def core_rooms(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Core's rooms (a subpackage such as ``hetero_core.engine``, or a module at the package root) and
    the rooms each imports; the package face ``hetero_core`` (lazy public re-exports) is left out."""

    def room_of(module: str) -> str | None:
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "hetero_core" and len(parts) > 1 else None

    rooms: dict[str, set[str]] = defaultdict(set)
    for source, targets in graph.items():
        a = room_of(source)
        if a is None:
            continue
        rooms[a]
        for target in targets:
            b = room_of(target)
            if b is not None and b != a:
                rooms[a].add(b)
    return dict(rooms)


# The rooms around the model code, bottom to top as the tests read them.
MODEL_ROOMS = (
    "hetero_core.model",
    "hetero_core.model.cpu",
    "hetero_core.default_plugins",
    "hetero_core.distributed",
    "hetero_plugins_triton",
    "hetero_plugins_cuda",
    "hetero_plugins_mock",
)

if __name__ == "__main__":
    graph = import_graph()
    for (a, b), lines in sorted(room_arrows(graph, MODEL_ROOMS).items()):
        print(f"{a} -> {b}  ({len(lines)})")
        for line in sorted(lines):
            print(f"    {line}")
    print("circles:", circles(graph) or "none")
