"""The tree as committed: no merge-conflict markers left in a source or documentation file
(a marker line in a ``.md`` file breaks nothing a test would notice otherwise)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".git", ".venv", "node_modules", "build", "dist", "__pycache__"}
SUFFIXES = {".py", ".md", ".toml", ".cfg", ".sh", ".yml", ".yaml", ".proto", ".txt", ".html",
            ".js", ".css", ".ini"}
MARKER = re.compile(r"^(<{7}|>{7})( |$)|^={7}$", re.M)


def conflict_markers(text: str) -> list[int]:
    """Line numbers of the conflict-marker lines in ``text``."""
    return [text.count("\n", 0, m.start()) + 1 for m in MARKER.finditer(text)]


def test_the_scanner_finds_each_kind_of_marker():
    text = "a\n<<<<<<< HEAD\nours\n=======\ntheirs\n>>>>>>> branch\n==== a heading rule\n"
    assert conflict_markers(text) == [2, 4, 6]
    assert conflict_markers("x = 1  # <<<<<<< not at a line start\n") == []


def test_no_conflict_markers_in_the_tree():
    found = []
    for path in sorted(ROOT.rglob("*")):
        if SKIP & set(path.relative_to(ROOT).parts) or not path.is_file():
            continue
        if path.suffix not in SUFFIXES and path.name != "Makefile":
            continue
        for line in conflict_markers(path.read_text(errors="replace")):
            found.append(f"{path.relative_to(ROOT)}:{line}")
    assert not found, "merge-conflict markers left in:\n  " + "\n  ".join(found)


def test_tests_import_their_helpers_as_make_test_finds_them():
    """``make test`` runs the bare ``pytest``, which puts ``tests/`` on the path but not the
    checkout: ``from tests.x import ...`` works under ``python -m pytest`` only, so a test
    written that way is an import error in CI. Helpers are imported as ``from x import``."""
    bad = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*(from tests[. ]|import tests\b)", line):
                bad.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bad, "imports that only python -m pytest finds:\n  " + "\n  ".join(bad)
