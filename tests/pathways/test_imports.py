"""The layout of ``pathways`` holds: no import circle, no arrow against the layers
(``python -m pathways._imports`` prints the graph); and the checker itself finds both."""

from __future__ import annotations

import subprocess
import sys

from pathways import _imports


def test_the_package_has_no_circle_and_no_arrow_against_the_layers():
    edges = _imports.graph()
    assert {"program.ir", "lowering.lower", "client.client", "control.coordinator",
            "host.process", "lib.moe"} <= set(edges)
    assert _imports.circles(edges) == []
    assert _imports.violations(edges) == []


def test_the_checker_finds_circles_and_upward_arrows():
    edges = {"program.a": {"program.b"}, "program.b": {"program.a", "client.c"},
             "client.c": {"host.d"}, "host.d": set(), "cli": {"host.d", "client.c"}}
    assert _imports.circles(edges) == [["program.a", "program.b"]]
    assert _imports.violations(edges) == ["client.c -> host.d", "program.b -> client.c"]


def test_lazy_and_absolute_imports_are_arrows_too(tmp_path):
    pkg = tmp_path / "program"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from ..client import c\n")
    (tmp_path / "client").mkdir()
    (tmp_path / "client" / "__init__.py").write_text("")
    (tmp_path / "client" / "c.py").write_text("import pathways.program.a\n")
    edges = _imports.graph(tmp_path)
    assert edges["program.a"] == {"client.c"} and edges["client.c"] == {"program.a"}
    assert _imports.circles(edges) == [["client.c", "program.a"]]


def test_the_command_prints_the_graph_and_exits_zero():
    out = subprocess.run([sys.executable, "-m", "pathways._imports"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout
    assert "  program -> (top)" in out.stdout and "circle" not in out.stdout


def test_lowered_nodes_name_host_operators_by_kind():
    """Lowering makes nodes with HostOp(kind, spec); a host hands its worker the table of
    its operators (nothing is registered by importing), covering every kind lowering makes,
    and a kind nobody knows is a clear error, not an AttributeError on a host."""
    import pytest

    from pathways.errors import PathwaysError
    from pathways.host.operators import host_operators
    from pathways.lowering.specs import KINDS, HostOp

    assert set(host_operators()) == set(KINDS) == {"kernel", "send", "route", "expert", "gather"}
    with pytest.raises(PathwaysError, match="no 'teleport' operator"):
        HostOp("teleport", None)()


def test_no_module_reads_another_modules_private_names_or_fills_a_table_on_import():
    import plaque

    assert _imports.private_reads() == []
    assert _imports.import_registries() == []
    plaque_root = _imports.Path(plaque.__file__).parent
    assert _imports.private_reads(plaque_root) == []
    assert _imports.import_registries(plaque_root) == []


def test_the_checker_finds_private_reads_and_tables_filled_on_import(tmp_path):
    pkg = tmp_path / "pathways"
    (pkg / "host").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "host" / "__init__.py").write_text("")
    (pkg / "host" / "table.py").write_text("OPS = {}\n_secret = 1\n\nclass Box:\n"
                                           "    def __init__(self):\n        self._n = 0\n")
    (pkg / "host" / "user.py").write_text(
        "from . import table\nfrom .table import _secret\n\n"
        "table.OPS['kernel'] = object\n\n"
        "def peek(box):\n    return box._n\n\n"
        "class Own:\n    def __init__(self):\n        self._n = 1\n\n"
        "    def same(self, other):\n        return other._n\n")
    (pkg / "host" / "fine.py").write_text("OPS = {}\nOPS['kernel'] = object\n")
    reads = _imports.private_reads(pkg)
    # the read in peek is found once user.py stops defining _n itself: it defines it here
    assert reads == ["host.user:2: _secret"]
    (pkg / "host" / "user.py").write_text(
        "from . import table\n\ndef peek(box):\n    return box._n\n")
    assert _imports.private_reads(pkg) == ["host.user:4: _n"]
    (pkg / "host" / "user.py").write_text("from . import table\n\ntable.OPS['k'] = 1\n"
                                          "table.OPS.update(x=1)\n")
    assert _imports.import_registries(pkg) == ["host.user:3", "host.user:4"]


def test_no_class_inherits_a_private_name_across_packages():
    """No class overrides, or reads or writes through self, a private name of a base class in
    another package (pathways' and plaque's): the simulator's classes use public hooks."""
    assert _imports.inherited_privates() == []


def test_the_checker_finds_private_names_inherited_across_packages(tmp_path):
    root = tmp_path / "pathways"
    for sub in ("base", "other"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "base" / "core.py").write_text(
        "class Core:\n    def __init__(self):\n        self._state = 0\n\n"
        "    def _hook(self):\n        return 1\n\n    def run(self):\n        return 2\n")
    (root / "base" / "near.py").write_text(
        "from .core import Core\n\nclass Near(Core):\n    def _hook(self):\n"
        "        return self._state\n")
    (root / "other" / "far.py").write_text(
        "from ..base import core\nfrom ..base.core import Core as C\n\n"
        "class Far(C):\n    def _hook(self):\n        return 3\n\n"
        "class Farther(core.Core):\n    def run(self):\n        return self._state\n\n"
        "class Public(C):\n    def run(self):\n        return 4\n")
    found = _imports.inherited_privates([root])
    assert found == ["pathways.other.far.Far: _hook (base pathways.base.core.Core)",
                     "pathways.other.far.Farther: _state (base pathways.base.core.Core)"]


def test_every_package_is_within_its_size_budget():
    """pathways._size: each package's lines are within BUDGETS (growth past one raises it in
    the same change), and every package has a budget."""
    from pathways import _size

    found = _size.sizes()
    assert {"pathways.host", "pathways.program", "plaque", "plaque.testing"} <= set(found)
    assert _size.over_budget(found) == []


def test_the_size_report_finds_packages_over_budget_or_without_one(tmp_path):
    from pathways import _size

    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("x = 1\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "big.py").write_text("class Big:\n" + "    a = 1\n" * 9)
    found = _size.sizes([root])
    assert found == {"pkg": {"pkg.__init__": 1}, "pkg.sub": {"pkg.sub.__init__": 0,
                                                             "pkg.sub.big": 10}}
    assert _size.over_budget(found, {"pkg": 1, "pkg.sub": 10}) == []
    assert _size.over_budget(found, {"pkg": 1, "pkg.sub": 9}) == [
        "pkg.sub: 10 lines, 1 over its budget of 9"]
    assert _size.over_budget(found, {"pkg.sub": 10}) == [
        "pkg: 1 lines and no budget (add one to BUDGETS)"]
    assert _size.largest_classes([root], 1) == [(10, "pkg.sub.big.Big")]
