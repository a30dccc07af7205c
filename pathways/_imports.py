"""The import graph of ``pathways``: ``python -m pathways._imports`` prints it by package and
exits 1 if it breaks the layout's rules.

Modules are read with ``ast``, not imported. An import inside a function ("lazy") counts like
any other: it is an arrow all the same. The rules (``RULES``): each package may import only the
packages listed for it, so arrows point down the paper's picture, from the command line and
the cluster launchers through the client, the control plane and the hosts to the program
representation; ``circles`` lists every group of modules that import each other.

Three more rules keep the seams in sight. ``private_reads``: no module reads a private name
(``_x``, not a dunder) that only other modules define -- an attribute ``obj._x`` or an
``import _x``; what modules share has a public name. ``import_registries``: no module changes
another module's objects when it is imported (``REGISTRY[k] = v``, ``table.update(...)`` or
``register(...)`` at the top level): a table is built where it is used, not filled by imports.
``inherited_privates``: no class overrides, or reads or writes through ``self``, a private
name that a base class in another package defines (pathways' subpackages and plaque's are
packages here): a base class offers its subclasses public hooks, or they are not its
subclasses.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent

# package -> what its modules may import: packages, and top-level modules by name. Arrows
# point down: program <- lowering, lib <- client, control, host (side by side) <- the
# top-level launchers (cli, cluster, slurm, k8s), which may import anything. The control
# plane never sees the program representation: of the lowering it imports only the graph's
# wire form (``lowering.wire``, which imports no program module).
_IO = {"errors", "protocol", "service", "checkpoint_format", "checkpoint_metadata", "dtypes"}
RULES: dict[str, set[str]] = {
    "program": {"program", "errors"},
    "lib": {"lib", "program", "errors"},
    "lowering": {"lowering", "program", "errors"},
    "client": {"client", "lowering", "program"} | _IO,
    "control": {"control", "lowering"} | _IO,
    "host": {"host", "lowering", "program"} | _IO,
    # the simulator's core knows nothing of the runtime it will run: time, events, links
    "sim": {"sim", "errors"},
    # the real roles on the simulator: a launcher like the twin, for the client, control
    # plane and hosts on the simulator's core
    "simulated": {"simulated", "sim", "client", "control", "host", "lowering", "program"}
    | _IO,
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


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, variables, attributes it
    assigns and parameters."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Store):
            out.add(node.attr if isinstance(node, ast.Attribute) else node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return {n for n in out if _private(n)}


def private_reads(root: Path = ROOT) -> list[str]:
    """Every read of a private name that only other modules of ``root`` define, as
    ``module:line: name``. A name this module defines too (its own ``_lock``) is its own."""
    trees = {name: ast.parse(path.read_text()) for name, path in modules(root).items()}
    own = {name: _defined(tree) for name, tree in trees.items()}
    anywhere = set().union(*own.values()) if own else set()
    out = []
    for name, tree in sorted(trees.items()):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                if node.attr in anywhere and node.attr not in own[name]:
                    out.append(f"{name}:{node.lineno}: {node.attr}")
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "")
                                                       .split(".")[0] in (root.name,)):
                out.extend(f"{name}:{node.lineno}: {a.name}" for a in node.names
                           if _private(a.name))
    return out


_MUTATORS = {"update", "setdefault", "append", "add", "extend", "register", "insert"}


def import_registries(root: Path = ROOT) -> list[str]:
    """Top-level statements that change an object the module did not make (one it
    imported) when the module is imported, as ``module:line``."""
    out = []
    for name, path in sorted(modules(root).items()):
        tree = ast.parse(path.read_text())
        made = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Name)}
        made |= {node.name for node in tree.body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        for node in tree.body:
            if _changes_foreign(node, made):
                out.append(f"{name}:{node.lineno}")
    return out


def _changes_foreign(node: ast.stmt, made: set[str]) -> bool:
    def foreign(expr) -> bool:
        while isinstance(expr, (ast.Attribute, ast.Subscript)):
            expr = expr.value
        return isinstance(expr, ast.Name) and expr.id not in made

    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(t, (ast.Subscript, ast.Attribute)) and foreign(t)
                   for t in targets)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        fn = node.value.func
        return (isinstance(fn, ast.Attribute) and fn.attr in _MUTATORS and foreign(fn.value)) \
            or (isinstance(fn, ast.Name) and "register" in fn.id)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return any("register" in ast.unparse(d) for d in node.decorator_list)
    return False


def _all_modules(roots) -> dict[str, ast.AST]:
    """Absolute dotted module name -> its syntax tree, for every package root."""
    out = {}
    for root in roots:
        for name, path in modules(root).items():
            full = root.name if name == "__init__" else f"{root.name}.{name}"
            out[full] = ast.parse(path.read_text())
    return out


def _package_of(module: str, trees) -> str:
    """The package a module belongs to: its parent, or itself if it is a package whose
    ``__init__`` it is (top-level modules of a root belong to the root)."""
    parts = module.split(".")
    return module if len(parts) == 1 or f"{module}.__init__" in trees else \
        ".".join(parts[:-1]) if len(parts) > 2 else parts[0]


def _aliases(module: str, tree: ast.AST, trees) -> dict:
    """Names a module's top level imports: local name -> ("module", absolute name) or
    ("symbol", absolute module, name)."""
    out = {}
    roots = {t.split(".")[0] for t in trees}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top in roots:  # "import a.b" binds a; "import a.b as c", c to a.b
                    out[a.asname or top] = ("module", a.name if a.asname else top)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = module.split(".")
                is_pkg = any(m.startswith(module + ".") for m in trees)
                base = here if is_pkg else here[:-1]
                base = base[:len(base) - (node.level - 1)]
                src = ".".join([*base, *((node.module or "").split(".") if node.module
                                          else [])])
            else:
                src = node.module or ""
            for a in node.names:
                sub = f"{src}.{a.name}"
                out[a.asname or a.name] = ("module", sub) if sub in trees else \
                    ("symbol", src, a.name)
    return out


def inherited_privates(roots=None) -> list[str]:
    """Every private name a class overrides, or reads or writes through ``self``, that a base
    class of another package defines, as ``module.Class: _name (base module.Base)``."""
    if roots is None:
        import plaque

        roots = [ROOT, Path(plaque.__file__).resolve().parent]
    trees = _all_modules(roots)
    aliases = {m: _aliases(m, t, trees) for m, t in trees.items()}
    classes = {(m, n.name): n for m, t in trees.items() for n in t.body
               if isinstance(n, ast.ClassDef)}

    def symbol(module, name, depth=0):
        if (module, name) in classes:
            return module, name
        hit = aliases.get(module, {}).get(name)
        if hit is None or depth > 8:
            return None
        return symbol(hit[1], hit[2], depth + 1) if hit[0] == "symbol" else None

    def resolve(module, expr):
        if isinstance(expr, ast.Name):
            return symbol(module, expr.id)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            hit = aliases.get(module, {}).get(expr.value.id)
            if hit and hit[0] == "module":
                return symbol(hit[1], expr.attr)
        return None

    def defines(node) -> set:
        names = {n.name for n in node.body if isinstance(n, (ast.FunctionDef,
                                                              ast.AsyncFunctionDef))}
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) \
                    and isinstance(n.value, ast.Name) and n.value.id == "self":
                names.add(n.attr)
            elif isinstance(n, (ast.Assign, ast.AnnAssign)) and n in node.body:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        return {n for n in names if _private(n)}

    def uses(node) -> dict:
        found = {n.name: n.lineno for n in node.body
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(n.name)}
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) \
                    and n.value.id == "self" and _private(n.attr):
                found.setdefault(n.attr, n.lineno)
        return found

    def ancestors(key, seen):
        module, node = key[0], classes[key]
        for base in node.bases:
            hit = resolve(module, base)
            if hit is not None and hit not in seen:
                seen.add(hit)
                yield hit
                yield from ancestors(hit, seen)

    out = []
    for key, node in sorted(classes.items()):
        used = uses(node)
        package = _package_of(key[0], trees)
        for base in ancestors(key, set()):
            if _package_of(base[0], trees) == package:
                continue
            for name in sorted(set(used) & defines(classes[base])):
                out.append(f"{key[0]}.{key[1]}: {name} (base {base[0]}.{base[1]})")
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
    reads, registries = private_reads(), import_registries()
    for line in reads:
        print(f"private name of another module: {line}")
    for line in registries:
        print(f"changed on import: {line}")
    inherited = inherited_privates()
    for line in inherited:
        print(f"private name of a base class in another package: {line}")
    return 1 if bad or loops or reads or registries or inherited else 0


if __name__ == "__main__":
    sys.exit(main())
