"""The layout of ``pathways`` holds: no import circle, no arrow against the layers
(``python -m pathways._imports`` prints the graph); and the checker itself finds both."""

from __future__ import annotations

import subprocess
import sys

from pathways import _imports


def test_the_package_has_no_circle_and_no_arrow_against_the_layers():
    edges = _imports.graph()
    assert {"program.ir", "lowering.lower", "client.client", "control.coordinator",
            "host.server", "lib.moe"} <= set(edges)
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
    """Lowering makes nodes with HostOp(kind, spec); the host package fills the table, and a
    kind nobody registered is a clear error, not an AttributeError on a host."""
    import pytest

    import pathways.host  # noqa: F401  (registers the host operators)
    from pathways.errors import PathwaysError
    from pathways.lowering.specs import OPERATORS, HostOp

    assert set(OPERATORS) == {"kernel", "send", "route", "expert", "gather"}
    with pytest.raises(PathwaysError, match="no 'teleport' operator"):
        HostOp("teleport", None)()
