"""No import cycles anywhere in the product: two modules that import each other (directly or
round a longer loop) cannot be understood, tested or moved one at a time. import-linter's
contracts (.importlinter, `make lint`) keep the layers; this checks what they cannot say in
general: that no strongly connected group of modules exists at all, inside a layer too."""

from __future__ import annotations

import grimp

ROOT = "autoclusters"


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every group of modules that reach each other through imports (Tarjan's strongly
    connected components, iteratively: the import graph is deeper than Python's stack
    would like). A module importing only itself is not a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    imported = sorted(graph.find_modules_directly_imported_by(target))
                    work.append((target, iter(imported)))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return cycles


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = grimp.build_graph(ROOT, cache_dir=None)
    assert len(graph.modules) > 100  # the whole product was read, not an empty package
    assert import_cycles(graph) == []


def test_a_cycle_is_found() -> None:
    # The finder itself: a loop of three modules inside a larger graph, and a module that
    # only imports itself, which is no cycle.
    graph = grimp.ImportGraph()
    for name in ("p", "p.a", "p.b", "p.c", "p.d", "p.e"):
        graph.add_module(name)
    for importer, imported in [
        ("p.a", "p.b"),
        ("p.b", "p.c"),
        ("p.c", "p.a"),
        ("p.c", "p.d"),
        ("p.e", "p.e"),
    ]:
        graph.add_import(importer=importer, imported=imported)
    assert import_cycles(graph) == [["p.a", "p.b", "p.c"]]
