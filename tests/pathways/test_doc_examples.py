"""Every ``>>>`` example in pathways' docstrings runs, as a doctest, against the in-process twin
and against a simulated cluster (``simulate=True``: the same roles in virtual time).

Each docstring runs in a small world of its own: a connected ``client`` (and ``other``, a
second client), a 2x4 ``mesh``, an
array ``x`` on it (``x0`` its value), a compiled ``step``, ``y = step(x)`` and a traced
``chain``; examples that need more set it up themselves. An example that shows its output is checked
against it; one that shows none (its comment says what to expect) must only run without error.
"""

import doctest
import importlib
import pkgutil

import numpy as np
import pytest

import pathways as pw
from pathways import P


class _ShownOutputOnly(doctest.OutputChecker):
    """Compare output only where the example shows some."""

    def check_output(self, want, got, optionflags):
        return not want or super().check_output(want, got, optionflags)


def _docstring_tests():
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = []
    for info in pkgutil.walk_packages(pw.__path__, "pathways."):
        if info.name.endswith("__main__"):
            continue  # importing it would run the command line
        module = importlib.import_module(info.name)
        found.extend(t for t in finder.find(module) if t.examples)
    found.extend(t for t in finder.find(pw) if t.examples and t.name == "pathways")
    return sorted({t.name: t for t in found}.values(), key=lambda t: t.name)


DOCTESTS = _docstring_tests()


@pytest.fixture(scope="module", params=["twin", "simulated"])
def doc_cluster(request):
    """Two islands (the examples ask for island 1) of 2 hosts x 4 devices, in threads, or
    simulated."""
    how = {"processes": False} if request.param == "twin" else {"simulate": True}
    with pw.local_cluster(islands=2, hosts_per_island=2, devices_per_host=4, **how) as cluster:
        yield cluster


@pytest.fixture
def world(doc_cluster):
    with pw.connect(doc_cluster.address) as client, pw.connect(doc_cluster.address) as other:
        mesh = client.mesh((2, 4), ("data", "model"))
        x0 = np.arange(32.0).reshape(8, 4)
        x = client.put(x0, mesh, P("data"))
        step = pw.shard_map(lambda v: pw.psum(v, "data") + 1.0, mesh, P("data"), P("data"))

        @pw.program
        def chain(v):
            return step(step(v))

        yield {"np": np, "pw": pw, "P": P, "cluster": doc_cluster, "client": client,
               "other": other, "mesh": mesh, "x0": x0, "x": x, "step": step, "chain": chain,
               "y": step(x)}


def test_there_are_examples_to_run():
    assert len(DOCTESTS) > 30


@pytest.mark.parametrize("test", DOCTESTS, ids=[t.name for t in DOCTESTS])
def test_the_example_runs(test, world, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what examples write (traces) stays out of the repository
    test.globs = {**test.globs, **world}
    runner = doctest.DocTestRunner(checker=_ShownOutputOnly(), optionflags=doctest.ELLIPSIS)
    out = []
    result = runner.run(test, out=out.append, clear_globs=False)
    assert result.failed == 0, "".join(out)
