"""The package's shape: its modules import one another without a cycle, no
module but the package's own ``__init__`` imports ``worker``, and the
package keeps the SDKs' one set of files. Read from the source with ``ast``:
nothing is imported. Pure: no coordinator needed."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "jobfence"

# The files every SDK keeps, by base name: the RPC client, the worker stream's
# session, the worker's lifecycle, the run of one job, the renewer, the
# receipts, the spool, the worker's options, its events, the decision table,
# the errors, the domain types and tracing (R35).
SHARED_FILES = {"client", "session", "worker", "job", "renewer", "receipts", "spool", "options", "events",
                "decide", "errors", "types", "tracing"}
# Python's own beside them: the google.rpc modules' loader.
PYTHON_FILES = {"_rpc"}


def modules(src: Path = SRC, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of package under src, by dotted name (a package by its
    ``__init__``)."""
    out: dict[str, Path] = {}
    for p in sorted((src / package).rglob("*.py")):
        parts = list(p.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of known that the module name (at path) imports: every
    import statement, those under ``if TYPE_CHECKING:`` included (a cycle of
    types is still a cycle to read through). ``from .m import x`` is an import
    of module m.x when that is a module, else of m."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()

    def add(target: str) -> None:
        if target in known and target != name:
            out.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                add(sub if sub in known else target)
    return out


def graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    mods = modules(src, package)
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of g: each strongly connected component of more than
    one module (Tarjan's algorithm), as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return [_cycle_through(g, set(c)) for c in comps]


def _cycle_through(g: dict[str, set[str]], comp: set[str]) -> list[str]:
    """One cycle inside the component comp, from its first module back to it."""
    start = min(comp)
    prev: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(g[v] & comp):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                todo.append(w)
    return sorted(comp)


def test_the_package_imports_without_a_cycle() -> None:
    g = graph()
    assert f"{PACKAGE}.worker" in g and f"{PACKAGE}.session" in g, sorted(g)
    found = cycles(g)
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_only_the_package_imports_the_worker() -> None:
    # The session, the job runner, the renewer and the receipts report
    # through hooks and the Reporter, never through the Worker's own state.
    g = graph()
    importers = sorted(m for m, deps in g.items() if f"{PACKAGE}.worker" in deps)
    assert importers == [PACKAGE], importers


def test_the_package_keeps_the_sdks_one_set_of_files() -> None:
    top = {name.removeprefix(PACKAGE + ".") for name in modules() if name.count(".") == 1}
    packages = {p.name for p in (SRC / PACKAGE).iterdir() if (p / "__init__.py").exists()}
    assert top - packages == SHARED_FILES | PYTHON_FILES


def test_cycles_finds_a_cycle_and_names_it() -> None:
    g = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert cycles(g) == [["p.a", "p.b", "p.c", "p.a"]]
    assert cycles({"p.a": {"p.b"}, "p.b": set()}) == []


def test_imports_reads_relative_type_only_and_package_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import A\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\nA = 1\n")
    (pkg / "b.py").write_text("from . import sub\nfrom .sub import x\nimport p.a\n")
    (pkg / "sub" / "__init__.py").write_text("from .. import a\n")
    (pkg / "sub" / "x.py").write_text("")
    g = graph(tmp_path, "p")
    assert g == {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.sub", "p.sub.x", "p.a"}, "p.sub": {"p.a"}, "p.sub.x": set()}
    assert cycles(g) == [["p.a", "p.b", "p.a"]]
