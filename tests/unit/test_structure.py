"""The package's shape: stages import downwards only (no import circle, function-level imports
included), and the data path reads from the file names."""
from __future__ import annotations

import ast
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[2] / "memhook"
NOT_IMPORTED = {"memhook.inject.gdb_agent"}  # runs inside GDB's Python


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")
            if module_name(p) not in NOT_IMPORTED}


def imports(name: str, path: Path, known: set) -> set[str]:
    """Every memhook module `name` imports, at any depth of its code: a package's module where
    `from pkg import mod` names one, else the package."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in known:
                    out.add(sub)
                elif target in known:
                    out.add(target)
    return out - {name}


def cycles(graph: dict[str, set]) -> list[list[str]]:
    """Tarjan's strongly connected components larger than one module."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def graph() -> dict[str, set]:
    mods = modules()
    # A package's __init__ re-exporting its own modules is how a package shows its parts, not
    # a circle: a module importing its package's other modules does not pass through it.
    g = {n: imports(n, p, set(mods)) for n, p in mods.items()}
    for n in g:
        if mods[n].name == "__init__.py":
            g[n] = {m for m in g[n] if not m.startswith(n + ".")}
    return g


def test_no_import_circle():
    assert cycles(graph()) == []


def test_the_check_finds_a_circle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]


STAGES = ["memhook.common", "memhook.elf", "memhook.entry_patch", "memhook.unwind",
          "memhook.inject", "memhook.capture", "memhook.symbolize",
          "memhook.consumer", "memhook.reporters", "memhook.push", "memhook.commands",
          "memhook.cli"]


def stage_of(module: str) -> int | None:
    return next((i for i, s in reversed(list(enumerate(STAGES)))
                 if module == s or module.startswith(s + ".")), None)


def test_stages_import_downwards():
    """Each stage imports only stages listed before it (the data path, then what drives it),
    or its own modules."""
    wrong = []
    for mod, deps in graph().items():
        mine = stage_of(mod)
        for d in deps:
            theirs = stage_of(d)
            if mine is not None and theirs is not None and theirs > mine:
                wrong.append(f"{mod} -> {d}")
    assert not wrong
