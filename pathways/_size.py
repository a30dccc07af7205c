"""The size of ``pathways`` and ``plaque``: ``python -m pathways._size`` prints the lines of
each package (its own modules, not its subpackages), its largest modules and the largest
classes, and exits 1 if a package is over its budget.

``BUDGETS`` holds each package's lines as set in the repository: growing a package past it
is a decision (raise its budget in the same change, saying why), not an accident. A package
without a budget fails too. Lines are physical lines of ``.py`` files, as ``wc -l`` counts.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent

# package -> its modules' lines at most (set 2026-11-29 at the sizes then, rounded up to the
# next hundred; pathways + plaque were 29,415 lines)
BUDGETS: dict[str, int] = {
    "pathways": 4000,
    "pathways.client": 3000,  # (3100 until its tree walker went to program.tree)
    "pathways.control": 1800,
    "pathways.host": 5400,
    "pathways.lib": 800,
    "pathways.lowering": 600,
    "pathways.program": 5500,  # (5400 until program.tree read JAX's registered nodes)
    "pathways.sim": 1300,
    "pathways.simulated": 900,
    "pathways.testing": 200,
    "plaque": 6000,
    "plaque.testing": 600,
}


def roots() -> list[Path]:
    import plaque

    return [ROOT, Path(plaque.__file__).resolve().parent]


def sizes(package_roots=None) -> dict[str, dict[str, int]]:
    """Package -> {module -> lines}, for every package under the roots (dotted names)."""
    out: dict[str, dict[str, int]] = {}
    for root in package_roots or roots():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root.parent).with_suffix("")
            package = ".".join(rel.parts[:-1])
            with path.open("rb") as f:
                out.setdefault(package, {})[".".join(rel.parts)] = sum(1 for _ in f)
    return out


def over_budget(found: dict[str, dict[str, int]], budgets=None) -> list[str]:
    """Each package over its budget, or without one, as a line saying by how much."""
    budgets = BUDGETS if budgets is None else budgets
    out = []
    for package, mods in sorted(found.items()):
        lines = sum(mods.values())
        if package not in budgets:
            out.append(f"{package}: {lines} lines and no budget (add one to BUDGETS)")
        elif lines > budgets[package]:
            out.append(f"{package}: {lines} lines, {lines - budgets[package]} over its budget"
                       f" of {budgets[package]}")
    return out


def largest_classes(package_roots=None, n: int = 10) -> list[tuple[int, str]]:
    """The ``n`` longest classes, as (lines, module.Class)."""
    found = []
    for root in package_roots or roots():
        for path in sorted(root.rglob("*.py")):
            module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    found.append((node.end_lineno - node.lineno + 1, f"{module}.{node.name}"))
    return sorted(found, reverse=True)[:n]


def main() -> int:
    found = sizes()
    total = sum(sum(m.values()) for m in found.values())
    print(f"pathways + plaque: {total} lines")
    for package, mods in sorted(found.items(), key=lambda kv: -sum(kv[1].values())):
        lines = sum(mods.values())
        budget = BUDGETS.get(package)
        top = ", ".join(f"{m.rsplit('.', 1)[-1]} {n}" for m, n in
                        sorted(mods.items(), key=lambda kv: -kv[1])[:4])
        print(f"  {package:20s} {lines:6d} / {budget if budget else '-':>6}  ({top})")
    print("largest classes:")
    for lines, name in largest_classes():
        print(f"  {lines:5d}  {name}")
    bad = over_budget(found)
    for line in bad:
        print(f"over budget: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
