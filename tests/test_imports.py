"""The package's import graph, read statically (ast over every vlbench/ and stages/ module, imports inside functions
included, and every string that names a project module, "package.module" or "package.module:function", as the import
it is when a registry resolves it): no cycle between modules, no edge up the layers (`LAYERS`, docs/architecture.md),
and no private name (`_x`) imported from another module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("vlbench", "stages")
# The layers, bottom first (docs/architecture.md, "Layers", lists the same): a module may import (or name in a
# registry string) modules of its own layer and of the layers below, never above. A module's layer is that of the
# longest name here that is it or a package above it; "vlbench" is the package's own __init__ only, so that a new
# module of the package has no layer until it is given one.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("vlbench", "vlbench.errors", "vlbench.io", "vlbench.portable", "vlbench.config"),  # the ground floor
    ("vlbench.features", "vlbench.wordnet", "vlbench.expansion"),
    ("vlbench.datasets",),
    ("vlbench.texts", "vlbench.decoding", "vlbench.models", "vlbench.lazy_imports", "vlbench.results",
     "vlbench.metrics", "vlbench.stats"),
    ("vlbench.knowledge", "vlbench.embed", "vlbench.embed_ray", "vlbench.engines", "vlbench.share"),
    ("vlbench.analyses",),
    ("vlbench.finetune",),
    ("vlbench.reference",),
    ("vlbench.report",),
    ("vlbench.leaderboard", "vlbench.compare_runs"),
    ("stages", "vlbench.pipeline", "vlbench.plan"),
    ("vlbench.cli",),
)
# a string that is a module's dotted name, with or without ":function" (a registry entry)
MODULE_STRING = re.compile(r"^((?:vlbench|stages)(?:\.\w+)+)(?::\w+)?$")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """{dotted module name: file} of every module of the project's packages (a package is its __init__.py)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(target module as written, the name taken from it or None) for each name an import statement binds."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    return [(base, alias.name) for alias in node.names]


def imports(modules: dict[str, Path]) -> list[tuple[str, str, str | None, int]]:
    """(importer, project module imported, name taken from it or None, line) for every import of a project module."""
    found = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target, name in _imported(module, path, node):
                if name and f"{target}.{name}" in modules:  # `from package import submodule`
                    target, name = f"{target}.{name}", None
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != module:
                    found.append((module, target, name, node.lineno))
    return found


def string_imports(modules: dict[str, Path]) -> list[tuple[str, str, None, int]]:
    """(module, project module it names, None, line) for every string literal that is a project module's name or a
    "module:function" (`MODULE_STRING`): an import once a registry resolves it (importlib, a dvc.yaml command)."""
    found = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                match = MODULE_STRING.match(node.value)
                if match and match.group(1) in modules and match.group(1) != module:
                    found.append((module, match.group(1), None, node.lineno))
    return found


def edges(modules: dict[str, Path]) -> list[tuple[str, str, str | None, int]]:
    """Every edge of the import graph: the import statements and the registry strings."""
    return imports(modules) + string_imports(modules)


def import_cycles(modules: dict[str, Path]) -> list[list[str]]:
    """One cycle (a list of modules, the first repeated at the end) per strongly connected group of modules."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for importer, target, _, _ in edges(modules):
        graph[importer].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle through the group's first module (breadth first inside the group)."""
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & group):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    raise AssertionError(f"no cycle through {start}")  # a strongly connected group always has one


def private_imports(modules: dict[str, Path]) -> list[str]:
    return [f"{modules[importer].relative_to(ROOT)}:{line}: imports {name} from {target}"
            for importer, target, name, line in imports(modules)
            if name and name.startswith("_") and not name.startswith("__")]


def test_no_import_cycle_between_modules():
    cycles = [" -> ".join(cycle) for cycle in import_cycles(project_modules())]
    assert not cycles, "import cycles (function-level imports included): " + "; ".join(cycles)


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the longest name there that is `module` or a package above it; None when none is."""
    names = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    if module == "vlbench":
        return names[module]
    parts = module.split(".")
    covering = (".".join(parts[:n]) for n in range(len(parts), 0, -1))
    return next((names[name] for name in covering if name in names and name != "vlbench"), None)


def upward_edges(modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    found = []
    for importer, target, _, line in edges(modules):
        if layer_of(target) > layer_of(importer):
            found.append(f"{modules[importer].relative_to(root)}:{line}: {importer} (layer {layer_of(importer)}) -> "
                         f"{target} (layer {layer_of(target)})")
    return found


def test_every_module_has_a_layer():
    assert [m for m in project_modules() if layer_of(m) is None] == []


def test_no_module_imports_or_names_a_module_of_a_layer_above_its_own():
    found = upward_edges(project_modules())
    assert not found, "edges up the layers (imports and registry strings): " + "; ".join(found)


def documented_layers(text: str) -> list[list[str]]:
    """The numbered list of the "Imports" paragraph of docs/architecture.md: per item, the module names in backticks
    outside parentheses (a parenthesis describes, it does not place a module)."""
    paragraph = text.split("- **Imports**", 1)[1].split("\n- **", 1)[0].split("\n## ", 1)[0]
    items = re.split(r"\n  \d+\. ", paragraph)[1:]
    return [sorted(re.findall(r"`((?:vlbench|stages)(?:\.\w+)*)`", re.sub(r"\([^()]*\)", "", item))) for item in items]


def test_docs_list_the_layers_the_test_checks():
    assert documented_layers((ROOT / "docs/architecture.md").read_text()) == [sorted(layer) for layer in LAYERS]


def test_no_private_name_is_imported_from_another_module():
    found = private_imports(project_modules())
    assert not found, "private names imported across modules (make them public or move them): " + "; ".join(found)


@pytest.fixture
def tiny_package(tmp_path):
    """A package of four modules: a -> b (inside a function) -> c -> a, and d taking a private name from c."""
    pkg = tmp_path / "vlbench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from vlbench import b\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text("import vlbench.a\n_hidden = 1\n")
    (pkg / "d.py").write_text("from vlbench.c import _hidden, __doc__\n")
    return tmp_path


def test_the_checks_find_a_cycle_through_a_function_level_import_and_a_private_import(tiny_package):
    modules = project_modules(tiny_package)
    assert import_cycles(modules) == [["vlbench.a", "vlbench.b", "vlbench.c", "vlbench.a"]]
    assert [(i, t, n) for i, t, n, _ in imports(modules) if i == "vlbench.d"] == [
        ("vlbench.d", "vlbench.c", "_hidden"), ("vlbench.d", "vlbench.c", "__doc__")]


def test_a_registry_string_is_an_edge_of_the_graph(tmp_path):
    """A lower layer's table naming a report function by string: an edge up the layers, and with the report importing
    the table, a cycle; a string naming no project module is no edge."""
    pkg = tmp_path / "vlbench"
    (pkg / "analyses").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "analyses" / "__init__.py").write_text('CHARTS = ("vlbench.report.plots:bars",)\nKEY = "vlbench.text_set"\n')
    (pkg / "report").mkdir()
    (pkg / "report" / "__init__.py").write_text("")
    (pkg / "report" / "plots.py").write_text("from vlbench.analyses import CHARTS\n")
    modules = project_modules(tmp_path)
    assert string_imports(modules) == [("vlbench.analyses", "vlbench.report.plots", None, 1)]
    assert import_cycles(modules) == [["vlbench.analyses", "vlbench.report.plots", "vlbench.analyses"]]
    assert upward_edges(modules, tmp_path) == [
        f"{Path('vlbench/analyses/__init__.py')}:1: vlbench.analyses (layer {layer_of('vlbench.analyses')}) -> "
        f"vlbench.report.plots (layer {layer_of('vlbench.report')})"]
    assert layer_of("vlbench.not_placed") is None and layer_of("vlbench") == 0


def test_the_dataset_sources_import_nothing_from_the_layers_above_them():
    """vlbench.datasets (the sources, their leaf wnids and ImageNet-1k's class list) sits below the knowledge, the
    analyses and the reports; WordNet is read through vlbench.wordnet, below all of them."""
    above = ("vlbench.knowledge", "vlbench.analyses", "vlbench.report", "vlbench.finetune")
    found = [f"{importer} -> {target} (line {line})" for importer, target, _, line in imports(project_modules())
             if importer.startswith("vlbench.datasets") and target.startswith(above)]
    assert not found, "dataset modules import from layers above them: " + "; ".join(found)
