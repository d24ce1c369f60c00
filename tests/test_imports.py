"""The package's import graph, read statically (ast over every vlbench/ and stages/ module, imports inside functions
included, and every string that names a project module, "package.module" or "package.module:function", as the import
it is when a registry resolves it): no cycle between modules, no edge up the layers (`LAYERS`, docs/architecture.md),
no private name (`_x`) of another module imported or reached as an attribute (`module._x`), and private names of
third-party libraries used only in their adapters (`vlbench/adapters/`)."""

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
    ("vlbench", "vlbench.errors", "vlbench.io", "vlbench.portable", "vlbench.params", "vlbench.paths",
     "vlbench.adapters"),  # ground floor
    ("vlbench.features", "vlbench.wordnet", "vlbench.conf", "vlbench.dataset_entries", "vlbench.data_root"),
    ("vlbench.datasets",),
    ("vlbench.texts", "vlbench.decoding", "vlbench.models", "vlbench.lazy_imports", "vlbench.results",
     "vlbench.metrics", "vlbench.stats"),
    ("vlbench.knowledge", "vlbench.embed", "vlbench.embed_ray", "vlbench.engines", "vlbench.share"),
    ("vlbench.analyses",),
    ("vlbench.finetune",),
    ("vlbench.reference",),
    ("vlbench.report",),
    ("vlbench.leaderboard", "vlbench.compare_runs"),
    ("stages", "vlbench.pipeline", "vlbench.plan", "vlbench.compose"),
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


def module_aliases(module: str, path: Path, tree: ast.Module, modules: dict[str, Path]) -> dict[str, str]:
    """{local name: the project module it is bound to} for the module's imports of project modules (`import a.b as c`,
    `from a import b`; a plain `import a.b` binds `a`, and attribute chains from it are resolved in `dotted`)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    aliases[alias.asname] = alias.name
                elif not alias.asname and alias.name.split(".")[0] in PACKAGES:
                    aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for (target, name), alias in zip(_imported(module, path, node), node.names):
                if f"{target}.{name}" in modules:
                    aliases[alias.asname or name] = f"{target}.{name}"
    return aliases


def dotted(node: ast.expr) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def private_attributes(modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    """`module._x` where `module` is another project module (bound by an import): a private name reached without an
    import statement."""
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases = module_aliases(module, path, tree, modules)
        for node in ast.walk(tree):
            parts = dotted(node) if isinstance(node, ast.Attribute) else None
            if not parts or parts[0] not in aliases:
                continue
            target, rest = aliases[parts[0]], parts[1:]
            while rest and f"{target}.{rest[0]}" in modules:  # vlbench.finetune.fewtrans_episodic._check
                target, rest = f"{target}.{rest[0]}", rest[1:]
            if len(rest) == 1 and _private(rest[0]) and target != module:
                found.append(f"{path.relative_to(root)}:{node.lineno}: uses {rest[0]} of {target}")
    return found


ADAPTERS = "vlbench.adapters"  # the one place a library's private names are used (vlbench/adapters/__init__.py)
PUBLIC_UNDERSCORE = {"_exit", "_replace", "_asdict", "_fields", "_make"}  # os._exit and namedtuple's, documented


def defined_names(tree: ast.Module) -> set[str]:
    """Every name the module itself defines: functions, classes, arguments, assigned names and attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            names.add(node.id if isinstance(node, ast.Name) else node.attr)
    return names


def library_private_uses(modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    """Outside vlbench/adapters/: imports of a library's private module or name (`from ray._private.x import y`,
    `import torch._dynamo`), and private attributes the module does not define itself (`repo.stage_cache._load`:
    DVC's; `module._x`: another module's)."""
    found = []
    for module, path in modules.items():
        if module == ADAPTERS or module.startswith(ADAPTERS + "."):
            continue
        tree = ast.parse(path.read_text(), str(path))
        own = defined_names(tree) | PUBLIC_UNDERSCORE
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not (isinstance(node, ast.ImportFrom) and node.level):
                named = [node.module] if isinstance(node, ast.ImportFrom) else []
                for alias in node.names:
                    parts = [*named, alias.name]
                    if parts[0].split(".")[0] not in PACKAGES and any(map(_private, ".".join(parts).split("."))):
                        found.append(f"{path.relative_to(root)}:{node.lineno}: imports {'.'.join(parts)}")
            elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                found.append(f"{path.relative_to(root)}:{node.lineno}: uses {ast.unparse(node)}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


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


def test_private_names_of_libraries_are_used_in_their_adapters_only():
    found = library_private_uses(project_modules())
    assert not found, ("private names used outside vlbench/adapters/ (a library's: use its public API, or add it to "
                       "the library's adapter with a test; another module's: make it public): " + "; ".join(found))


def test_no_private_name_of_another_module_is_reached_as_an_attribute():
    found = private_attributes(project_modules())
    assert not found, "private names used across modules (make them public or move them): " + "; ".join(found)


@pytest.fixture
def tiny_package(tmp_path):
    """A package of modules: a -> b (inside a function) -> c -> a; d taking a private name from c, e reaching it as
    an attribute; f using private names of libraries, as its adapters/ may."""
    pkg = tmp_path / "vlbench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from vlbench import b\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text("import vlbench.a\n_hidden = 1\n")
    (pkg / "d.py").write_text("from vlbench.c import _hidden, __doc__\n")
    (pkg / "e.py").write_text("import vlbench.c\nfrom vlbench import c as see\n\n"
                              "vlbench.c._hidden, see._hidden, see.__doc__, see.public._inner\n")
    (pkg / "f.py").write_text("import os, torch._dynamo\nfrom ray._private.services import find\n"
                              "class Box:\n    def __init__(self):\n        self._own = 1\n\n\n"
                              "def f(repo, box):\n    return box._own, repo._load, os._exit\n")
    (pkg / "adapters").mkdir()
    (pkg / "adapters" / "__init__.py").write_text("from dvc.stage.cache import _can_hash\n_can_hash.__name__\n")
    return tmp_path


def test_the_checks_find_a_cycle_through_a_function_level_import_and_a_private_import(tiny_package):
    modules = project_modules(tiny_package)
    assert import_cycles(modules) == [["vlbench.a", "vlbench.b", "vlbench.c", "vlbench.a"]]
    assert [(i, t, n) for i, t, n, _ in imports(modules) if i == "vlbench.d"] == [
        ("vlbench.d", "vlbench.c", "_hidden"), ("vlbench.d", "vlbench.c", "__doc__")]


def test_the_check_finds_a_private_name_reached_as_an_attribute_of_another_module(tiny_package):
    """`c._hidden` through a plain import or an alias; not a dunder, not a private attribute of a public object."""
    assert private_attributes(project_modules(tiny_package), tiny_package) == [
        "vlbench/e.py:4: uses _hidden of vlbench.c", "vlbench/e.py:4: uses _hidden of vlbench.c"]


def test_the_check_finds_a_librarys_private_names_outside_the_adapters(tiny_package):
    """Private modules and names imported, and private attributes the module does not define (`repo._load`, and
    e.py's `_hidden`); not os._exit, not the module's own `_own` (an attribute it assigns), not in vlbench/adapters/."""
    assert sorted(library_private_uses(project_modules(tiny_package), tiny_package)) == [
        "vlbench/e.py:4: uses see._hidden", "vlbench/e.py:4: uses see.public._inner",
        "vlbench/e.py:4: uses vlbench.c._hidden",
        "vlbench/f.py:1: imports torch._dynamo", "vlbench/f.py:2: imports ray._private.services.find",
        "vlbench/f.py:9: uses repo._load"]


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


def test_the_adapters_import_no_vlbench_module():
    """vlbench/adapters/ is the ground floor: a library's private names, wrapped, for any layer to use."""
    found = [f"{importer} -> {target} (line {line})" for importer, target, _, line in imports(project_modules())
             if importer.startswith(ADAPTERS) and not target.startswith(ADAPTERS)]
    assert not found, "adapters import project modules: " + "; ".join(found)
