"""The tests' own hygiene: no fixed real-time sleep without a stated reason.

A test that sleeps for as long as something "should" take is slow when the machine is idle
and flaky when it is loaded; it should wait for the thing itself (``harness.wait_until`` /
``poll_until``, an event, a counter, a log line) or run on a mock clock. A fixed sleep is
right only where no event can show what the test needs: that nothing happens for a while,
that real time passes on a clock the test cannot reach (a token's wall-clock expiry, etcd's
lease TTL, another process's cache), or where the delay is the scenario itself (a slow fake
handler, chaos pacing). Such a sleep says so in a comment that starts with ``MARKER``, on the
sleep's line or in the comment lines right above its statement.

The scan reads the source (``ast``). A call of ``time.sleep``, ``trio.sleep`` or
``asyncio.sleep`` (or a ``sleep`` imported from them) is a fixed sleep unless it is

* a zero sleep (a checkpoint that lets other tasks run, not a wait);
* in virtual time: inside a function that takes the ``autojump_clock`` or ``mock_clock``
  fixture (a nested function too), where a sleep costs nothing;
* the interval of a loop that ends on a condition: the nearest loop around it in its
  function is a ``while``, or a ``for`` that can end early (``break``, ``return``,
  ``raise``). That is a poll (it waits for the condition, not for a fixed time) or the
  cadence of a workload or fault injector that runs until told to stop.

Code inside strings (a child process's script) is not the test's own and is not scanned.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

#: the comment that states why a fixed sleep cannot be replaced by an event
MARKER = "# fixed-sleep:"
SLEEP_MODULES = {"time", "trio", "asyncio"}
VIRTUAL_CLOCK_FIXTURES = {"autojump_clock", "mock_clock"}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
LOOPS = (ast.While, ast.For, ast.AsyncFor)


@dataclass(frozen=True)
class Sleep:
    """One sleep call found in a file: where, and whether it must carry the marker."""
    path: str
    line: int
    kind: str          # "fixed", "zero", "virtual" or "poll"
    marked: bool

    @property
    def unexplained(self) -> bool:
        return self.kind == "fixed" and not self.marked


def _sleep_names(tree: ast.Module) -> set[str]:
    """Bare names bound to a sleep function by ``from time import sleep [as name]``."""
    return {alias.asname or alias.name
            for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module in SLEEP_MODULES
            for alias in node.names if alias.name == "sleep"}


def _is_sleep(call: ast.Call, bare: set[str]) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr == "sleep" and isinstance(func.value, ast.Name) \
            and func.value.id in SLEEP_MODULES
    return isinstance(func, ast.Name) and func.id in bare


def _can_end_early(loop: ast.AST) -> bool:
    if isinstance(loop, ast.While):
        return True
    return any(isinstance(node, (ast.Break, ast.Return, ast.Raise)) for node in ast.walk(loop))


def _virtual(functions: list[ast.AST]) -> bool:
    return any(arg.arg in VIRTUAL_CLOCK_FIXTURES
               for f in functions for arg in f.args.args + f.args.kwonlyargs)


def _marked(lines: list[str], first: int, last: int) -> bool:
    """The marker, with a reason after it, on a line of the statement (``first``..``last``,
    1-based) or in the block of comment lines right above it."""
    def says_why(text: str) -> bool:
        at = text.find(MARKER)
        return at >= 0 and len(text[at + len(MARKER):].strip()) >= 3
    if any(says_why(lines[i - 1]) for i in range(first, last + 1)):
        return True
    i = first - 1
    while i >= 1 and lines[i - 1].strip().startswith("#"):
        if says_why(lines[i - 1]):
            return True
        i -= 1
    return False


def scan_source(source: str, path: str = "<source>") -> list[Sleep]:
    """Every sleep call of ``source``, classified."""
    tree = ast.parse(source)
    lines = source.splitlines()
    bare = _sleep_names(tree)
    found: list[Sleep] = []

    def walk(node: ast.AST, functions: list[ast.AST], loop: ast.AST | None,
             statement: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, FUNCTIONS):
                walk(child, functions + [child], None, statement)
                continue
            inner_loop = child if isinstance(child, LOOPS) else loop
            inner_statement = child if isinstance(child, ast.stmt) else statement
            if isinstance(child, ast.Call) and _is_sleep(child, bare):
                arg = child.args[0] if child.args else None
                if isinstance(arg, ast.Constant) and arg.value == 0:
                    kind = "zero"
                elif _virtual(functions):
                    kind = "virtual"
                elif loop is not None and _can_end_early(loop):
                    kind = "poll"
                else:
                    kind = "fixed"
                first = inner_statement.lineno if inner_statement else child.lineno
                last = max(child.end_lineno or child.lineno, first)
                found.append(Sleep(path, child.lineno, kind, _marked(lines, first, last)))
            walk(child, functions, inner_loop, inner_statement)

    walk(tree, [], None, None)
    return found


def scan_tests(folder: Path = TESTS) -> list[Sleep]:
    return [sleep for path in sorted(folder.rglob("*.py")) if "__pycache__" not in path.parts
            for sleep in scan_source(path.read_text(), str(path.relative_to(folder.parent)))]


def check_sleeps(folder: Path = TESTS) -> int:
    """The number of sleeps in ``folder``; AssertionError naming each unexplained one."""
    sleeps = scan_tests(folder)
    bad = [f"{s.path}:{s.line}" for s in sleeps if s.unexplained]
    assert not bad, (f"fixed sleeps without a '{MARKER} <why no event can replace it>' "
                     f"comment; wait for the event instead (harness.wait_until, poll_until, "
                     f"a counter, a log line) or state the reason:\n  " + "\n  ".join(bad))
    return len(sleeps)


def test_every_fixed_sleep_in_the_tests_says_why_no_event_replaces_it():
    assert check_sleeps() > 100          # the scan sees the tests' sleeps at all


# --------------------------------------------------------------------------- the scanner


def kinds(source: str) -> list[tuple[int, str, bool]]:
    return [(s.line, s.kind, s.marked) for s in scan_source(source)]


def test_scanner_fails_an_unexplained_fixed_sleep():
    source = ("import time, trio\n"
              "async def test_x():\n"
              "    await trio.sleep(0.5)\n"
              "def test_y():\n"
              "    time.sleep(1)\n")
    assert kinds(source) == [(3, "fixed", False), (5, "fixed", False)]
    assert [s.unexplained for s in scan_source(source)] == [True, True]


def test_scanner_accepts_the_marker_with_a_reason_on_the_line_or_above():
    source = ("import trio\n"
              "async def test_x(nursery):\n"
              "    await trio.sleep(0.5)   # fixed-sleep: nothing may happen meanwhile\n"
              "    # fixed-sleep: the token expires on the\n"
              "    # real wall clock\n"
              "    await trio.sleep(\n"
              "        3.5)\n"
              "    # fixed-sleep:\n"
              "    await trio.sleep(1)\n"
              "    # fixed-sleep: a reason, but code comes between\n"
              "    x = 1\n"
              "    await trio.sleep(1)\n"
              "    await trio.sleep(1)   # a comment without the marker\n")
    assert kinds(source) == [(3, "fixed", True), (6, "fixed", True), (9, "fixed", False),
                             (12, "fixed", False), (13, "fixed", False)]


def test_scanner_leaves_checkpoints_virtual_time_polls_and_child_scripts_alone():
    source = ("import asyncio, time, trio\n"
              "from time import sleep as nap\n"
              "SCRIPT = 'import time; time.sleep(3600)'\n"
              "async def test_a(autojump_clock):\n"
              "    async def inner():\n"
              "        await trio.sleep(35)\n"
              "    await trio.sleep(10)\n"
              "    await trio.sleep(0)\n"
              "async def test_b():\n"
              "    while not done():\n"
              "        await asyncio.sleep(0.05)\n"
              "    for _ in range(50):\n"
              "        if done():\n"
              "            break\n"
              "        time.sleep(0.1)\n"
              "    for _ in range(8):\n"
              "        beat()\n"
              "        nap(0.15)\n"
              "    while True:\n"
              "        def later():\n"
              "            time.sleep(2)\n")
    assert kinds(source) == [(6, "virtual", False), (7, "virtual", False), (8, "zero", False),
                             (11, "poll", False), (15, "poll", False),
                             (18, "fixed", False), (21, "fixed", False)]


def test_scanner_reads_a_folder(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_bad.py").write_text("import time\ntime.sleep(2)\n")
    (tmp_path / "tests" / "test_good.py").write_text(
        "import time\ntime.sleep(2)   # fixed-sleep: the scenario's pause\n")
    found = scan_tests(tmp_path / "tests")
    assert [(s.path, s.line, s.unexplained) for s in found] == [
        ("tests/test_bad.py", 2, True), ("tests/test_good.py", 2, False)]
    # the guard itself fails on the unexplained one, and names it
    with pytest.raises(AssertionError, match=r"fixed sleeps without") as info:
        check_sleeps(tmp_path / "tests")
    assert "tests/test_bad.py:2" in str(info.value) and "test_good" not in str(info.value)
    (tmp_path / "tests" / "test_bad.py").unlink()
    assert check_sleeps(tmp_path / "tests") == 1
