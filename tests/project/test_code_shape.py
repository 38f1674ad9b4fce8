"""The product code's shape (issue 25): no function over 80 lines but the click commands, no import cycle.

Product code is agent/, collector/, clusterwatch/ and cli/, each under its import name (clusterwatch.agent, ...).
A click command is exempt: its length is its options, one decorator each. An import cycle counts only
between module-level imports, as they run when a module is first imported; a function's own imports run
later and are how a module defers a cost or a dependency, and `if TYPE_CHECKING:` imports never run.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support.helpers import ROOT

MAX_LINES = 80
PRODUCT = {"agent": "clusterwatch.agent", "collector": "clusterwatch.collector", "cli": "clusterwatch.cli",
           "clusterwatch": "clusterwatch"}
# "path:function" → its owner and why it is still long. Empty: keep it so; split a long function instead.
KNOWN_LONG: dict[str, str] = {}


def modules(root: Path, product: dict[str, str] = PRODUCT) -> dict[str, Path]:
    """Import name → file, for every module of the product's folders."""
    out = {}
    for folder, package in product.items():
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = [package, *path.relative_to(root / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_click_command(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated with click.command / click.group, or a group's .command() / .group()."""
    for decorator in fn.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr in ("command", "group"):
            return True
    return False


def long_functions(root: Path, mods: dict[str, Path]) -> list[str]:
    """`path:line name (N lines)` for each function or method over MAX_LINES lines, click commands aside."""
    found = []
    for path in mods.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _is_click_command(node):
                continue
            lines = node.end_lineno - node.lineno + 1
            name = f"{path.relative_to(root)}:{node.name}"
            if lines > MAX_LINES and name not in KNOWN_LONG:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def _runs_at_import(test: ast.expr) -> bool:
    return not (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
                or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: its top level, inside if/try, not in functions."""
    for statement in body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            yield statement
        elif isinstance(statement, ast.If):
            if _runs_at_import(statement.test):
                yield from _module_level_imports(statement.body)
            yield from _module_level_imports(statement.orelse)
        elif isinstance(statement, ast.Try):
            for block in (statement.body, statement.orelse, statement.finalbody, *(h.body for h in statement.handlers)):
                yield from _module_level_imports(block)


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the product modules it imports at module level (the module named, not its parent packages)."""

    def known(name: str) -> str | None:
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in mods else None

    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for statement in _module_level_imports(ast.parse(path.read_text()).body):
            if isinstance(statement, ast.Import):
                targets = [alias.name for alias in statement.names]
            else:
                base = statement.module or ""
                if statement.level:
                    parent = package.split(".")[:len(package.split(".")) - statement.level + 1]
                    base = ".".join(parent + ([statement.module] if statement.module else []))
                # `from pkg import sub` imports the module pkg.sub; `from pkg import name`, pkg itself
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base
                           for alias in statement.names]
            edges |= {t for t in map(known, targets) if t is not None and t != name}
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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


def test_no_function_is_over_80_lines_but_the_click_commands() -> None:
    found = long_functions(ROOT, modules(ROOT))
    assert not found, f"split these (behaviour identical) or list them in KNOWN_LONG with their owner: {found}"


def test_no_import_cycle_among_the_product_modules() -> None:
    found = cycles(import_graph(modules(ROOT)))
    assert not found, f"module-level imports in a cycle (move one import into the function that needs it): {found}"


def test_the_checks_find_a_long_function_and_a_cycle(tmp_path: Path) -> None:
    """Each check fails where it should, on a small tree of its own."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    body = "".join(f"    x = {i}\n" for i in range(MAX_LINES))
    (pkg / "a.py").write_text("from .sub import b\n\n\ndef long():\n" + body + "\n\n@click.command()\ndef cmd():\n"
                              + body)
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\n\nfrom ..c import f\n\n"
                                      "if TYPE_CHECKING:\n    from . import d\n")
    (pkg / "c.py").write_text("import pkg.a\n\n\ndef f():\n    from pkg.sub import d\n")
    (pkg / "sub" / "d.py").write_text("from .. import a\n")
    mods = modules(tmp_path, {"pkg": "pkg"})
    assert long_functions(tmp_path, mods) == [f"pkg/a.py:4 long ({MAX_LINES + 1} lines)"]
    graph = import_graph(mods)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]  # d's imports (TYPE_CHECKING, in f) do not count
