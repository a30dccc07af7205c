"""The import graph of ``pathways``: ``python -m pathways._imports`` prints it by package and
exits 1 if it breaks the layout's rules.

Modules are read with ``ast``, not imported. An import inside a function ("lazy") counts like
any other: it is an arrow all the same. The rules (``RULES``): each package may import only the
packages listed for it, so arrows point down the paper's picture, from the command line and
the cluster launchers through the client, the control plane and the hosts to the program
representation; ``circles`` lists every group of modules that import each other.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent

# package -> what its modules may import: packages, and top-level modules by name. Arrows
# point down: program <- lowering, lib <- client, control, host (side by side) <- the
# top-level launchers (cli, cluster, slurm, k8s), which may import anything.
_IO = {"errors", "protocol", "service", "checkpoint_format", "checkpoint_metadata"}
RULES: dict[str, set[str]] = {
    "program": {"program", "errors"},
    "lib": {"lib", "program", "errors"},
    "lowering": {"lowering", "program", "errors"},
    "client": {"client", "lowering", "program"} | _IO,
    "control": {"control", "lowering", "program"} | _IO,
    "host": {"host", "lowering", "program"} | _IO,
}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name inside pathways ("lib.moe", "client") -> its file."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts) or "__init__"] = path
    return out


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom, known) -> list[str]:
    if node.level == 0:
        if not (node.module or "").startswith("pathways"):
            return []
        base = node.module.split(".")[1:]
    else:
        here = importer.split(".") if importer != "__init__" else []
        package = here if is_package else here[:-1]
        base = package[:len(package) - (node.level - 1)] + (node.module or "").split(".")
        base = [p for p in base if p]
    out = []
    for alias in node.names:  # "from .pkg import module" names a module
        candidate = ".".join([*base, alias.name])
        out.append(candidate if candidate in known else ".".join(base) or "__init__")
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the pathways modules it imports (at the top or inside functions)."""
    known = modules(root)
    edges: dict[str, set[str]] = {m: set() for m in known}
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                targets = _resolve(name, is_package, node, known)
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".", 1)[1] for a in node.names
                           if a.name.startswith("pathways.")]
            else:
                continue
            edges[name].update(t for t in targets if t in known and t != name)
    return edges


def package(module: str) -> str:
    return module.split(".")[0] if "." in module else ""


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Groups of two or more modules that reach each other (Tarjan's strongly connected
    components), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def violations(edges: dict[str, set[str]]) -> list[str]:
    """Every arrow from a checked package to a package it may not import."""
    out = []
    for src, targets in sorted(edges.items()):
        allowed = RULES.get(package(src))
        if allowed is None:
            continue
        for dst in sorted(targets):
            if (package(dst) or dst) not in allowed:
                out.append(f"{src} -> {dst}")
    return out


def main() -> int:
    edges = graph()
    by_package: dict[str, set[str]] = {}
    for src, targets in edges.items():
        for dst in targets:
            if package(src) != package(dst):
                by_package.setdefault(package(src) or "(top)", set()).add(package(dst) or "(top)")
    print("packages:")
    for src in sorted(by_package):
        print(f"  {src} -> {', '.join(sorted(by_package[src]))}")
    print("modules:")
    for src in sorted(edges):
        print(f"  {src} -> {', '.join(sorted(edges[src])) or '-'}")
    bad = violations(edges)
    loops = circles(edges)
    for line in bad:
        print(f"against the layers: {line}")
    for group in loops:
        print(f"circle: {' <-> '.join(group)}")
    return 1 if bad or loops else 0


if __name__ == "__main__":
    sys.exit(main())
