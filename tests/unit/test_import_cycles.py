"""No import cycles in src/netsleuth or bench/: modules that import each other, at any depth.

Every import counts, wherever it stands: at module level, in a function (a lazy import only hides a cycle
from the interpreter) and under `if TYPE_CHECKING:` (a cycle of types is one of meaning: which module is
below which). The graph is read from the code with ast, nothing is imported. `python -m
tests.unit.test_import_cycles` prints the cycles and the imports that tie each.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Where the modules are, each with the folder its dotted names start from.
ROOTS = ((REPO / "src" / "netsleuth", REPO / "src"), (REPO / "bench", REPO))

Imports = dict[str, dict[str, int]]  # module -> module it imports -> the line of the first such import


def _modules() -> dict[str, Path]:
    found = {}
    for folder, base in ROOTS:
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _loaded(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[list[str]]:
    """Per name an import statement binds, the dotted names it may load, the likeliest first: `from a
    import b` is the module a.b if there is one, else a thing defined in a."""
    if isinstance(node, ast.Import):
        yield from ([alias.name] for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    for alias in node.names:
        yield [f"{base}.{alias.name}", base]


def import_graph() -> Imports:
    modules = _modules()
    graph: Imports = {name: {} for name in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for names in _loaded(node, module, path.name == "__init__.py"):
                # A name under a module of ours (a.b.thing) is that module.
                found = next((name for name in names if name in modules), None)
                while found is None and names[-1]:
                    names[-1] = names[-1].rpartition(".")[0]
                    found = names[-1] if names[-1] in modules else None
                if found is not None and found != module:
                    graph[module].setdefault(found, node.lineno)
    return graph


def _reachable(graph: Imports, start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return seen


def cycles(graph: Imports) -> list[frozenset[str]]:
    """The strongly connected sets of more than one module: each module in one reaches every other."""
    reach = {module: _reachable(graph, module) for module in graph}
    found: set[frozenset[str]] = set()
    for module, reached in reach.items():
        if module in reached:
            found.add(frozenset({module} | {other for other in reached if module in reach[other]}))
    return sorted(found, key=sorted)


def describe(graph: Imports, cycle: frozenset[str]) -> str:
    ties = [
        f"  {module} -> {imported} (line {line})"
        for module in sorted(cycle)
        for imported, line in sorted(graph[module].items())
        if imported in cycle
    ]
    return "\n".join([f"{len(cycle)} modules:", *ties])


def test_no_import_cycle() -> None:
    # The last one (kernel/context.py -> diagnostics/attribution.py -> tcp/program.py -> filter_maps.py /
    # filters.py -> diagnostics/model.py -> kernel/context.py) went with the untyped config readers
    # (ConfigInput) when conn, the last untyped diagnostic, became a typed spec.
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(graph, cycle) for cycle in found)


def test_the_graph_sees_imports_in_functions_and_type_checking_blocks() -> None:
    # The edges the cycles of the agent's config and of doctor's rules ran on: a TYPE_CHECKING import
    # (agent/config.py), a lazy one (fleet/link_config.py before, doctor/rules/__init__.py before). If the
    # reader stopped seeing either kind, the test above would pass on those cycles again.
    graph = import_graph()
    assert "netsleuth.fleet.link_config" in graph["netsleuth.agent.config"]  # TYPE_CHECKING + lazy
    assert "netsleuth.extras" in graph["netsleuth.agent.config"]  # lazy only
    assert "netsleuth.diagnostics.tcp.program" in graph["netsleuth.diagnostics.attribution"]  # TYPE_CHECKING
    assert "netsleuth.doctor.rules.coalesce" in graph["netsleuth.doctor.rules"]  # from . import submodule


if __name__ == "__main__":
    graph = import_graph()
    found = cycles(graph)
    print(f"{len(found)} import cycle(s) among {len(graph)} modules")
    for cycle in found:
        print(describe(graph, cycle))
