"""The FUSE mount is composed, not mixed: static checks of ``mount/``.

Why: the mount's parts (``OpenFiles``, ``KernelView``, ``Writer``, ``Names``, ``Files``) are
given what they need in their constructors and call each other through public methods.
A class inheriting two project classes (a mixin host) shares state through ``self`` again,
and ``other._private`` reaches into a part's state past its methods; both fail here.
"""

from __future__ import annotations

import ast
from pathlib import Path

MOUNT = Path(__file__).resolve().parent.parent / "mount"
PROJECT_PACKAGES = {"fs", "meta", "storage", "mount", "tools", "spark_connector",
                    "fsspec_leasefs"}


def _modules() -> dict[str, ast.Module]:
    return package_modules(MOUNT, "operations.py")


def package_modules(folder: Path, expected: str) -> dict[str, ast.Module]:
    """The parsed modules of a package folder (``expected``: one that must be there)."""
    modules = {path.name: ast.parse(path.read_text(), str(path))
               for path in sorted(folder.glob("*.py"))}
    assert expected in modules, f"no {expected} in {folder}"
    return modules


def _project_names(tree: ast.Module) -> set[str]:
    """Names a module binds to project objects: its own classes and what it imports from
    the project (relative imports, or absolute ones from a project package)."""
    names = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
                node.level > 0 or (node.module or "").split(".")[0] in PROJECT_PACKAGES):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names
                         if alias.name.split(".")[0] in PROJECT_PACKAGES)
    return names


def _base_root(base: ast.expr) -> str | None:
    while isinstance(base, ast.Attribute):
        base = base.value
    return base.id if isinstance(base, ast.Name) else None


def mixin_hosts(modules: dict[str, ast.Module], where: str) -> list[str]:
    """Classes of ``modules`` that subclass more than one project class."""
    hosts = []
    for name, tree in modules.items():
        project = _project_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                ours = [ast.unparse(b) for b in node.bases if _base_root(b) in project]
                if len(ours) > 1:
                    hosts.append(f"{where}/{name}: class {node.name}({', '.join(ours)})")
    return hosts


def private_reaches(modules: dict[str, ast.Module], where: str) -> list[str]:
    """``other._private`` attribute uses in ``modules`` (``self``/``cls`` are fine)."""
    reaches = []
    for name, tree in modules.items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name)
                             and node.value.id in ("self", "cls"))):
                reaches.append(f"{where}/{name}:{node.lineno}: {ast.unparse(node)}")
    return reaches


def test_no_mount_class_subclasses_more_than_one_project_class():
    hosts = mixin_hosts(_modules(), "mount")
    assert not hosts, "mixin hosts (compose parts instead): " + "; ".join(hosts)


def test_mount_parts_reach_no_private_state_of_another_object():
    reaches = private_reaches(_modules(), "mount")
    assert not reaches, "private state reached past its owner: " + "; ".join(reaches)


def test_the_checks_see_a_mixin_host_and_a_private_reach():
    """The checks above find what they look for (a check that cannot fail proves nothing)."""
    tree = ast.parse("from .files import Files\nfrom .writes import Writer\nimport pyfuse3\n"
                     "class Host(Files, Writer, pyfuse3.Operations):\n"
                     "    def f(self):\n        return self._view._nodes\n")
    assert mixin_hosts({"x.py": tree}, "m") == ["m/x.py: class Host(Files, Writer)"]
    assert private_reaches({"x.py": tree}, "m") == ["m/x.py:6: self._view._nodes"]
