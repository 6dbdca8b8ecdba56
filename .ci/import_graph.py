"""The import graph of tfrbeam: its layers, the imports between them, and what breaks the layering.

    python .ci/import_graph.py            # the package graph, then every problem found
    python .ci/import_graph.py --modules  # the module graph as well

Every ``import`` counts, at the top of a module or inside a function (a function-level import is
still a dependency, only a later one). The rules, each checked by tests/test_layering.py:
- a package imports only packages of a lower layer, or itself (no upward import);
- no circle of modules;
- no module imports a private name (``_name``) of another module, nor a private module of another package.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tfrbeam"

# Lowest first. A package may import itself and any package listed before it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("tfrbeam", "tfrbeam.errors"),  # the facade (lazy names only) and our error classes
    ("tfrbeam.base",),
    ("tfrbeam.tfrecord",),
    ("tfrbeam.codec",),
    ("tfrbeam.layout",),
    ("tfrbeam.dataset",),
    ("tfrbeam.stats",),
    ("tfrbeam.beam",),
    # The builder's rooms, lowest first: what a column becomes, the config, reading inputs (and counting progress),
    # the shuffle, the pipeline (plan, graph, commit, runners) and running it; the package's own face above them.
    ("tfrbeam.builder.features",),
    ("tfrbeam.builder.config",),
    ("tfrbeam.builder.inputs",),
    ("tfrbeam.builder.shuffle",),
    ("tfrbeam.builder.pipeline",),
    ("tfrbeam.builder.running",),
    ("tfrbeam.builder",),
    ("tfrbeam.cli",),
)
ENTRY_POINTS = ("__main__",)  # `python -m tfrbeam.builder` starts the CLI: an entry point, not a layer


@dataclass(frozen=True)
class Import:
    """One import of a tfrbeam module by another: which names it takes (empty for ``import x``)."""

    importer: str
    imported: str
    names: tuple[str, ...]
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    """Every module of the package, generated protobuf code left out (it imports only protobuf)."""
    modules = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        if not path.name.endswith("_pb2.py"):
            modules[module_name(path)] = path
    return modules


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield Import(name, _known(alias.name, modules), (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, is_package, node)
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in modules:  # `from tfrbeam.codec import example`: the module itself
                    yield Import(name, submodule, (), node.lineno)
                else:
                    yield Import(name, _known(target, modules), (alias.name,), node.lineno)


def _known(dotted: str, modules: dict[str, Path]) -> str:
    """The longest prefix of ``dotted`` that is one of our modules (``tfrbeam.x.y.attr`` -> ``tfrbeam.x.y``)."""
    parts = dotted.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or dotted


def all_imports() -> list[Import]:
    modules = source_modules()
    return [found for name, path in modules.items() for found in imports_of(name, path, modules)
            if found.imported != name]


def layer_of(module: str) -> tuple[int, str] | None:
    """(rank, package) of a module: the longest package prefix named in LAYERS."""
    best: tuple[int, str] | None = None
    for rank, packages in enumerate(LAYERS):
        for package in packages:
            if (module == package or module.startswith(package + ".")) and (best is None or len(package) > len(best[1])):
                best = (rank, package)
    if best and best[1] == PACKAGE and module != PACKAGE:
        return None  # a top-level module not placed in a layer
    return best


def upward_imports(imports: list[Import]) -> list[str]:
    problems = []
    for found in imports:
        if found.importer.rsplit(".", 1)[-1] in ENTRY_POINTS or found.importer == PACKAGE:
            continue  # entry points, and the facade, whose lazy table names modules of every layer
        importer, imported = layer_of(found.importer), layer_of(found.imported)
        if importer is None:
            problems.append(f"{found.importer}: a module in no layer (place it in a package)")
        elif imported is not None and imported[0] > importer[0]:
            problems.append(f"{found.importer}:{found.line} imports {found.imported}: upward "
                            f"({importer[1]} is below {imported[1]})")
    return sorted(set(problems))


def circles(imports: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for found in imports:
        graph[found.importer].add(found.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def private_reach_ins(imports: list[Import]) -> list[str]:
    """Imports of another module's ``_name``, or of a ``_module`` of another package."""
    problems = []
    for found in imports:
        for name in found.names:
            if name.startswith("_") and not name.startswith("__"):
                problems.append(f"{found.importer}:{found.line} imports {found.imported}.{name}")
        private_parts = [part for part in found.imported.split(".") if part.startswith("_") and part != "__main__"]
        if private_parts:
            owner = found.imported.rsplit(".", 1)[0]
            if not found.importer.startswith(owner + "."):
                problems.append(f"{found.importer}:{found.line} imports {found.imported}, private to {owner}")
    return sorted(set(problems))


def package_graph(imports: list[Import]) -> dict[tuple[str, str], int]:
    edges: dict[tuple[str, str], int] = defaultdict(int)
    for found in imports:
        source, target = _package(found.importer), _package(found.imported)
        if source != target:
            edges[(source, target)] += 1
    return dict(edges)


def _package(module: str) -> str:
    placed = layer_of(module)
    return placed[1] if placed and placed[1] != PACKAGE else module


def main(argv: list[str]) -> int:
    imports = all_imports()
    print("package -> package (imports)")
    for (source, target), count in sorted(package_graph(imports).items()):
        print(f"  {source} -> {target} ({count})")
    if "--modules" in argv:
        print("module -> module")
        for found in sorted({(f.importer, f.imported) for f in imports}):
            print(f"  {found[0]} -> {found[1]}")
    problems = {"upward imports": upward_imports(imports), "private names": private_reach_ins(imports),
                "circles": [" <-> ".join(component) for component in circles(imports)]}
    for title, found in problems.items():
        print(f"{title}: {len(found)}")
        for problem in found:
            print(f"  {problem}")
    return 1 if any(problems.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
