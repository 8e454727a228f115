"""The project's import graph, read from the source (every import: top-level, inside
functions and under TYPE_CHECKING), for the layering test (tests/unit/test_layers.py)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGES = ("pipeline", "consumers", "models")


def modules(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the packages."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imported(module: str, is_package: bool, tree: ast.AST) -> Iterable[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, up level-1 more
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            # `from a.b import c`: the submodule a.b.c when there is one, else a.b
            yield from (f"{name}.{alias.name}" for alias in node.names)


def edges(root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports (a name imported from a package that is
    a submodule counts as that submodule)."""
    known = modules(root)

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        for name in _imported(module, path.name == "__init__.py", tree):
            target = owner(name)
            # `from pipeline.config import X` inside pipeline.config.* names the package
            # itself; a submodule never needs its own package's __init__ for that.
            if target and target != module:
                graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found
