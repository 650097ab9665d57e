"""The import graph of pgferry's modules, read from their source (ast): no cycles, and the
engine (log, delivery, relay) never reaches up to the operator side, the CLI or the benches.

Imports inside functions count: they are how cycles used to hide (STYLE.md, "Watch out" 2).
So do imports under ``if TYPE_CHECKING:``: they never run, but a module that needs another's
type to be written is as tied to it as one that calls it (ops/web.py took the whole Relay so).
So do the packages an import loads first: `from pgferry.cli.backfill import drive` runs
cli/__init__.py, which imports every command module (demo.py -> cli -> cli.core -> demo was a
circle no edge of the import statements showed).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pgferry

PACKAGE = Path(pgferry.__file__).parent
ENGINE = ("pgferry.log", "pgferry.delivery", "pgferry.relay", "pgferry.capture")
ABOVE_ENGINE = ("pgferry.ops", "pgferry.cli", "pgferry.bench")
#: Engine -> operator imports there are, each with its reason. Only inside a function.
ON_DEMAND = {
    # The relay loads the metrics and dashboard servers only when a port asks for them; ops/ sees the
    # relay through relay/surface.py only, so this makes no cycle (checked below).
    ("pgferry.relay.process", "pgferry.ops.web"),
    # The supervisor of `pgferry run --processes N` serves the dashboard and the gathered metrics the
    # same way, through relay/surface.py's SupervisorView.
    ("pgferry.relay.supervisor", "pgferry.ops.web"),
}


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    #: "module" (runs on import), "function" (runs when called) or "type" (under TYPE_CHECKING, never runs)
    where: str
    #: for a package (its __init__) the import loads before the module it names: that module
    via: str = ""


def _module_name(path: Path) -> str:
    parts = ("pgferry", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(source: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The pgferry modules an import statement loads: `from a.b import c` is a.b.c when that is a module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == "pgferry"]
    base = node.module or ""
    if node.level:  # relative: from the importing module's package
        package = source if MODULES[source].name == "__init__.py" else source.rsplit(".", 1)[0]
        package = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{package}.{base}" if base else package
    if base.split(".")[0] != "pgferry":
        return []
    return list(dict.fromkeys(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names))


def _packages(source: str, target: str) -> list[str]:
    """The packages above ``target`` that importing it runs first: all but those ``source`` is in
    (its own packages were loaded before it)."""
    parts = target.split(".")
    above = [".".join(parts[:n]) for n in range(1, len(parts))]
    return [p for p in above if p in MODULES and not _within(source, (p,))]


def _imports(source: str) -> list[Import]:
    found: list[Import] = []

    def visit(nodes: Iterable[ast.AST], where: str) -> None:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                for t in _targets(source, node):
                    found.append(Import(source, t, node.lineno, where))
                    found.extend(Import(source, p, node.lineno, where, via=t) for p in _packages(source, t))
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.body, "type")
                visit(node.orelse, where)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(ast.iter_child_nodes(node), "function" if where == "module" else where)
            else:
                visit(ast.iter_child_nodes(node), where)

    visit([ast.parse(MODULES[source].read_text(), str(MODULES[source]))], "module")
    return found


IMPORTS = [imp for name in MODULES for imp in _imports(name)]


def _cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (or one that imports itself), as a path."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return groups


def test_the_import_graph_is_read_from_every_module() -> None:
    assert {"pgferry.cli", "pgferry.cli.common", "pgferry.relay.process", "pgferry.ops.web"} <= set(MODULES)
    edges = {(i.source, i.target) for i in IMPORTS}
    assert ("pgferry.ops.web", "pgferry.relay.surface") in edges
    assert ("pgferry.relay.process", "pgferry.ops.web") in edges  # found inside a function
    assert ("pgferry.demo", "pgferry.ops") in edges  # ops/__init__.py runs before ops/backfill.py
    assert ("pgferry.cli.core", "pgferry.cli") not in edges  # a module's own package is loaded already
    assert all(i.target in MODULES for i in IMPORTS), [i for i in IMPORTS if i.target not in MODULES]


def test_no_module_of_pgferry_imports_itself_back_not_from_a_function_nor_for_a_type() -> None:
    cycles = _cycles({(i.source, i.target) for i in IMPORTS})
    where = {
        " -> ".join(group): [f"{i.source}:{i.line} imports {i.target}" for i in IMPORTS
                             if i.source in group and i.target in group]
        for group in cycles
    }  # fmt: skip
    assert not cycles, where


def test_the_engine_never_imports_the_operator_side_the_cli_or_the_benches() -> None:
    upward = {i for i in IMPORTS if _within(i.source, ENGINE) and _within(i.target, ABOVE_ENGINE)}
    on_demand = {i for i in upward if i.where == "function" and (i.source, i.via or i.target) in ON_DEMAND}
    assert not upward - on_demand, sorted(upward - on_demand, key=lambda i: (i.source, i.line))
    assert {(i.source, i.target) for i in on_demand if not i.via} == ON_DEMAND, (
        "an allowed import is gone: drop it from ON_DEMAND"
    )
    # ...and what the relay loads on demand does not lead back into the relay's process module.
    reach = {"pgferry.ops.web"}  # ...nor into the supervisor's
    runs = [(i.source, i.target) for i in IMPORTS if i.where != "type"]
    while True:
        more = {b for a, b in runs if a in reach} - reach
        if not more:
            break
        reach |= more
    assert "pgferry.relay.process" not in reach
    assert "pgferry.relay.supervisor" not in reach


def test_the_shared_leaves_import_no_sibling() -> None:
    """cli/common.py is shared by every command module and imports none of them; the command modules
    import nothing of the CLI package but common; relay/surface.py needs nothing of pgferry but errors."""
    for imp in IMPORTS:
        if (
            imp.source != "pgferry.cli"
            and _within(imp.source, ("pgferry.cli",))
            and _within(imp.target, ("pgferry.cli",))
        ):
            assert imp.source != "pgferry.cli.common" and imp.target == "pgferry.cli.common", imp
    surface = {i.target for i in IMPORTS if i.source == "pgferry.relay.surface" and i.where != "type"}
    assert surface == {"pgferry.errors"}


def test_a_relay_loads_nothing_of_the_operator_side_without_a_port_and_no_dashboard_for_metrics_alone() -> None:
    script = (
        "import json, sys\n"
        "from pgferry.relay.process import Relay, RelaySettings\n"
        "def loaded():\n"
        "    return sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'prometheus_client')"
        " or m.startswith(('pgferry.ops', 'pgferry.cli', 'pgferry.bench')))\n"
        "Relay('postgresql://127.0.0.1:9/x', RelaySettings())\n"
        "bare = loaded()\n"
        "Relay('postgresql://127.0.0.1:9/x', RelaySettings(metrics_port=0))\n"
        "print(json.dumps([bare, loaded()]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    bare, metrics = (set(names) for names in json.loads(done.stdout))
    assert bare == set(), bare
    assert {"pgferry.ops.web", "pgferry.ops.metrics"} <= metrics, metrics
    assert not metrics & {"pgferry.ops.dashboard", "pgferry.ops.pages"}, metrics
