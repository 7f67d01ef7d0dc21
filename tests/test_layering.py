"""The shape of the code: no import circles between modules, none between packages (the
folders draw the design; inside ``meta``, from the ground up: ``schema``; ``blocks`` and
``leases``; ``journal``; ``namespace``; ``services`` and ``ha``; ``protocols`` and ``web``;
``meta``'s own server modules on top), and the layers of docs/DESIGN.md ("Layers"): ``fs``
(client and wire vocabulary) is the ground floor, the metadata server (``meta``) and the
block server (``storage``) stand on it and never import each other; only the command line's
launcher (``tools/cluster/``) imports them.

The graph is read from the source (``ast``), not from what an import happens to load: every
``import``/``from ... import`` statement of a module counts, at the top of the file or inside
a function (a late import only postpones a circle, the two modules still need each other to
be read or changed) or under ``if TYPE_CHECKING``. An edge goes to the module named, or to
the submodule when ``from package import name`` names one.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: package -> the project's packages its modules must not import (the longest package that
#: holds a module decides)
FORBIDDEN = {
    "fs": {"meta", "storage", "mount", "tools", "spark_connector", "fsspec_leasefs"},
    "meta": {"storage", "mount", "tools", "spark_connector", "fsspec_leasefs"},
    "storage": {"meta", "mount", "tools", "spark_connector", "fsspec_leasefs"},
    "mount": {"meta", "storage", "tools", "spark_connector", "fsspec_leasefs"},
    "spark_connector": {"meta", "storage", "mount", "tools"},
    "fsspec_leasefs": {"meta", "storage", "mount", "tools"},
    # the command line talks to the servers over the wire; only the launcher runs them
    "tools": {"meta", "storage", "mount"},
    "tools.cluster": set(),
}


def forbidden_for(module: str) -> set[str]:
    holders = [p for p in FORBIDDEN if module == p or module.startswith(p + ".")]
    return FORBIDDEN[max(holders, key=len)] if holders else set()


def project_packages() -> list[str]:
    """The packages pyproject.toml installs (subpackages included)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["packages"]


def modules() -> dict[str, Path]:
    """Every module of the installed packages: dotted name -> file."""
    found = {}
    for package in project_packages():
        folder = ROOT / package.replace(".", "/")
        for path in sorted(folder.glob("*.py")):
            name = package if path.name == "__init__.py" else f"{package}.{path.stem}"
            found[name] = path
    return found


def import_graph(mods: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported project module: line of the first such import}."""

    def known(name: str | None) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in mods.items():
        edges: dict[str, int] = {}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[:len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            for target in targets:
                target = known(target)
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def one_cycle(graph, component: list[str]) -> list[str]:
    """A closed path through ``component``'s first module, to name in a failure."""
    inside, start = set(component), component[0]
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]]):
            if w == start:
                return path + [start]
            if w in inside and w not in seen:
                seen.add(w)
                paths.append(path + [w])
    return component


def describe(graph, cycle: list[str]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) \
        + f" -> {cycle[-1]}"


def package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def package_graph(mods: dict[str, Path], graph: dict[str, dict[str, int]]
                  ) -> dict[str, dict[str, list[tuple[str, str, int]]]]:
    """package -> {imported package: [(importing module, imported module, line), ...]}: the
    module graph with each module collapsed to the package that holds it."""
    packages: dict[str, dict[str, list[tuple[str, str, int]]]] = {}
    for name, edges in sorted(graph.items()):
        source = package_of(name, mods[name])
        out = packages.setdefault(source, {})
        for target, line in sorted(edges.items()):
            dest = package_of(target, mods[target])
            if dest != source:
                out.setdefault(dest, []).append((name, target, line))
    return packages


def describe_packages(packages, mods: dict[str, Path], cycle: list[str], root=ROOT) -> str:
    """Each step of a package circle with the first file that makes it (and how many more)."""
    steps = []
    for a, b in zip(cycle, cycle[1:]):
        importer, imported, line = packages[a][b][0]
        more = len(packages[a][b]) - 1
        steps.append(f"{a} ({mods[importer].relative_to(root)} line {line} imports {imported}"
                     + (f", and {more} more" if more else "") + ")")
    return " -> ".join(steps) + f" -> {cycle[-1]}"


def test_the_checker_sees_imports_of_every_form(tmp_path):
    sources = {
        "p/__init__.py": "", "q/__init__.py": "",
        "p/a.py": "from . import b\nfrom .c import thing\n",          # relative, submodule
        "p/b.py": "def late():\n    import q.d\n",                    # inside a function
        "p/c.py": "from q import d\nfrom p.a import name\n",         # absolute
        "q/d.py": "if TYPE_CHECKING:\n    from p import b\n",        # for annotations only
    }
    mods = {}
    for rel, text in sources.items():
        path = tmp_path / rel
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        name = rel[:-3].replace("/", ".").removesuffix(".__init__")
        mods[name] = path
    graph = import_graph(mods)
    assert {k: set(v) for k, v in graph.items() if v} == {
        "p.a": {"p.b", "p.c"}, "p.b": {"q.d"}, "p.c": {"q.d", "p.a"}, "q.d": {"p.b"}}
    assert sorted(circles(graph)) == [["p.a", "p.c"], ["p.b", "q.d"]]
    assert one_cycle(graph, ["p.a", "p.c"]) == ["p.a", "p.c", "p.a"]
    assert describe(graph, ["p.b", "q.d", "p.b"]) == "p.b (line 2) -> q.d (line 2) -> p.b"


def test_the_package_checker_sees_circles_the_modules_do_not_have(tmp_path):
    """x.a -> y.b -> x.c is no circle of modules, but packages x and y need each other."""
    sources = {
        "p/__init__.py": "", "p/x/__init__.py": "", "p/y/__init__.py": "",
        "p/x/a.py": "from ..y import b\n",
        "p/y/b.py": "import os\n\ndef late():\n    from p.x.c import thing\n",
        "p/x/c.py": "",
        "p/y/d.py": "from p.x.c import thing\n",
        "p/top.py": "from .x import a\nfrom .y import d\n",     # from above: no circle
    }
    mods = {}
    for rel, text in sources.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        mods[rel[:-3].replace("/", ".").removesuffix(".__init__")] = path
    graph = import_graph(mods)
    assert circles(graph) == []
    packages = package_graph(mods, graph)
    assert {k: set(v) for k, v in packages.items() if v} == {
        "p": {"p.x", "p.y"}, "p.x": {"p.y"}, "p.y": {"p.x"}}
    assert circles(packages) == [["p.x", "p.y"]]
    assert describe_packages(packages, mods, one_cycle(packages, ["p.x", "p.y"]), tmp_path) == (
        "p.x (p/x/a.py line 1 imports p.y.b) -> "
        "p.y (p/y/b.py line 4 imports p.x.c, and 1 more) -> p.x")


def test_no_import_circles():
    graph = import_graph(modules())
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(
        describe(graph, one_cycle(graph, c)) for c in found)


def test_no_package_circles():
    mods = modules()
    packages = package_graph(mods, import_graph(mods))
    found = circles(packages)
    assert not found, "packages that import each other:\n" + "\n".join(
        describe_packages(packages, mods, one_cycle(packages, c)) for c in found)


def test_layers():
    graph = import_graph(modules())
    wrong = [f"{name} imports {target} (line {line})"
             for name, edges in sorted(graph.items())
             for target, line in sorted(edges.items())
             if target.split(".")[0] in forbidden_for(name)]
    assert not wrong, "imports across the layers of docs/DESIGN.md:\n" + "\n".join(wrong)


def test_every_package_folder_is_installed():
    """A folder with an ``__init__.py`` that pyproject.toml does not list would be missing
    from an installed leasefs (the console script would fail on its first import of it)."""
    listed = set(project_packages())
    folders = {str(p.parent.relative_to(ROOT)).replace("/", ".")
               for top in {name.split(".")[0] for name in listed}
               for p in (ROOT / top).rglob("__init__.py")}
    assert folders <= listed, f"add to [tool.setuptools] packages: {sorted(folders - listed)}"
