"""Which tests start a fresh process, read from their source: the rule behind the ``slow`` marker.

A test starts a fresh process when its body, or a function or fixture it reaches, uses one of:
``sys.executable`` in a command (not a ``#!`` line of a script the test writes: the fakes import only the
standard library), ``runpytest_subprocess`` / ``spawn_pytest`` / ``pytester.popen``, pytest-xdist's ``-n``,
or ``--neuron-tp``. Reached means: a function of its module it names, a fixture it requests (its module's,
then each ``conftest.py`` up to the repository, autouse ones included) and a helper it imports from
``tests`` or ``examples``, followed transitively. Static and deterministic: no timing.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_FOLDERS = ("tests", "examples")
_FRESH_CALLS = {"runpytest_subprocess", "spawn_pytest", "spawn"}
_XDIST_ARG = re.compile(r"-n(\d+|auto|=.*)?$|--numprocesses(=.*)?$")
_TP_ARG = re.compile(r"--neuron-tp(=([2-9]|\d\d+|\D.*))?$")  # rank processes: 2 or more, or a value not seen here
Function = ast.FunctionDef | ast.AsyncFunctionDef


def test_files() -> list[Path]:
    """Every test module pytest collects here (its default ``test_*.py`` pattern), sorted."""
    return sorted(p for folder in TEST_FOLDERS for p in (ROOT / folder).rglob("test_*.py"))


def _is_slow_mark(node: ast.expr) -> bool:
    """``pytest.mark.slow`` (or ``mark.slow``), called or not, or a list/tuple holding it."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_slow_mark(e) for e in node.elts)
    if isinstance(node, ast.Call):
        node = node.func
    return isinstance(node, ast.Attribute) and node.attr == "slow" and (
        isinstance(node.value, ast.Attribute) and node.value.attr == "mark"
        or isinstance(node.value, ast.Name) and node.value.id == "mark")


def _usefixtures(node: ast.expr) -> list[str]:
    marks = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    return [a.value for m in marks if isinstance(m, ast.Call) and isinstance(m.func, ast.Attribute)
            and m.func.attr == "usefixtures" for a in m.args if isinstance(a, ast.Constant)]


def _fixture_decorator(fn: Function) -> ast.expr | None:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Name) and target.id == "fixture" or (
                isinstance(target, ast.Attribute) and target.attr == "fixture"):
            return d
    return None


def _is_autouse(fn: Function) -> bool:
    d = _fixture_decorator(fn)
    return isinstance(d, ast.Call) and any(k.arg == "autouse" and isinstance(k.value, ast.Constant) and k.value.value
                                           for k in d.keywords)


@dataclass
class Module:
    """One parsed file: its top-level functions, the names it imports from the project's test helpers."""
    path: Path
    tree: ast.Module
    functions: dict[str, Function] = field(default_factory=dict)
    imports: dict[str, tuple[Path, str]] = field(default_factory=dict)
    slow: bool = False
    usefixtures: list[str] = field(default_factory=list)
    fixtures: dict[str, Function] = field(default_factory=dict)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if ROOT in path.parents else str(path)


def _module_path(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def parse(path: Path) -> Module:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    module = Module(path, tree)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module.functions[node.name] = node
            if _fixture_decorator(node) is not None:
                module.fixtures[node.name] = node
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in TEST_FOLDERS:
            source = _module_path(node.module)
            for alias in node.names:
                if source is not None:
                    module.imports[alias.asname or alias.name] = (source, alias.name)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                  for t in node.targets):
            module.slow = _is_slow_mark(node.value)
            module.usefixtures = _usefixtures(node.value)
    return module


def _conftests(path: Path) -> list[Module]:
    """The conftest.py files that apply to ``path``, nearest first."""
    found, folder = [], path.parent
    while folder == ROOT or ROOT in folder.parents:
        if (folder / "conftest.py").is_file():
            found.append(parse(folder / "conftest.py"))
        folder = folder.parent
    return found


def _direct_use(node: ast.AST) -> str | None:
    """The fresh-process machinery ``node`` itself uses, described with its line; None when it uses none."""
    shebangs = {id(v) for n in ast.walk(node) if isinstance(n, ast.JoinedStr) and n.values
                and isinstance(n.values[0], ast.Constant) and str(n.values[0].value).startswith("#!")
                for v in ast.walk(n)}
    for n in ast.walk(node):
        if (isinstance(n, ast.Attribute) and n.attr == "executable" and isinstance(n.value, ast.Name)
                and n.value.id == "sys" and id(n) not in shebangs):
            return f"sys.executable (line {n.lineno})"
        if isinstance(n, ast.Attribute) and n.attr in _FRESH_CALLS:
            return f"{n.attr} (line {n.lineno})"
        if (isinstance(n, ast.Attribute) and n.attr == "popen" and isinstance(n.value, ast.Name)
                and n.value.id == "pytester"):
            return f"pytester.popen (line {n.lineno})"
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            if _XDIST_ARG.match(n.value):
                return f"xdist {n.value!r} (line {n.lineno})"
            if _TP_ARG.match(n.value):
                return f"{n.value!r} (line {n.lineno})"
    return None


def fresh_process_use(path: Path, fn: Function) -> str | None:
    """Why the test ``fn`` of ``path`` starts a fresh process (what, where, through which fixture or helper)."""
    return _reach(parse(path), fn, frozenset(), autouse=True)


def _reach(module: Module, fn: Function, seen: frozenset, autouse: bool = False) -> str | None:
    here = (module.path, fn.name, autouse)
    if here in seen:
        return None
    if here not in _REACHED:
        _REACHED[here] = _search(module, fn, seen | {here}, autouse)
    return _REACHED[here]


_REACHED: dict[tuple[Path, str, bool], str | None] = {}


def _search(module: Module, fn: Function, seen: frozenset, autouse: bool) -> str | None:
    found = _direct_use(fn)
    if found:
        return f"{found} in {_shown(module.path)}::{fn.name}"
    conftests = _conftests(module.path)
    wanted = [a.arg for a in fn.args.args + fn.args.kwonlyargs]
    if autouse:
        wanted += module.usefixtures + [n for m in [module, *conftests] for n, f in m.fixtures.items()
                                        if _is_autouse(f)]
    for name in wanted:
        owner = next((m for m in [module, *conftests] if name in m.fixtures), None)
        if owner is not None and (why := _reach(owner, owner.fixtures[name], seen)):
            return f"{why} (fixture {name})"
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    for name in sorted(names):
        if name in module.functions and (why := _reach(module, module.functions[name], seen)):
            return why
        if name in module.imports:
            source, original = module.imports[name]
            helper = parse(source)
            if original in helper.functions and (why := _reach(helper, helper.functions[original], seen)):
                return why
    return None


def tests_of(tree: ast.Module) -> list[tuple[str, Function, bool]]:
    """The test functions of a module (``Test*`` classes' methods too): node id tail, node, marked slow."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found.append((node.name, node, any(_is_slow_mark(d) for d in node.decorator_list)))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            marked = any(_is_slow_mark(d) for d in node.decorator_list) or any(
                isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
                and _is_slow_mark(s.value) for s in node.body)
            found += [(f"{node.name}::{m.name}", m, marked or any(_is_slow_mark(d) for d in m.decorator_list))
                      for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and m.name.startswith("test")]
    return found


def unmarked_fresh_process_tests(paths: list[Path]) -> list[str]:
    """One line per test that starts a fresh process but is not marked slow: the test, why, the fix."""
    problems = []
    for path in paths:
        module = parse(path)
        if module.slow:
            continue
        for name, fn, slow in tests_of(module.tree):
            why = None if slow else fresh_process_use(path, fn)
            if why:
                problems.append(f"{_shown(path)}::{name} starts a fresh process ({why}) but is not marked "
                                f"slow. fix: add @pytest.mark.slow to it, or `pytestmark = pytest.mark.slow` at the "
                                f"top of its file, so `bash scripts/test.sh --fast` (-m 'not slow') leaves it out")
    return problems
