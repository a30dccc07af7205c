"""Tampering with a saved checkpoint never loads other values (issue 27): a property test.

A small tree is saved once, with a second checkpoint of the same tree and other values beside
it. Each example copies the first, damages the copy at random (flips a byte of a chunk or of a
zarr.json, deletes, truncates, appends to or renames a file or directory, replaces a chunk or
an array directory by a symlink to the other checkpoint's) and loads it: the result is exactly
the saved values or a CheckpointError, never other values, another exception or a hang.
"""

import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathways as pw
from pathways import P

zarr = pytest.importorskip("zarr")

KINDS = ["flip", "flip_metadata", "delete", "truncate", "append", "rename", "rename_onto",
         "symlink"]


def _values(sign):
    rng = np.random.default_rng(7)
    return {"w": np.arange(32, dtype=np.float32).reshape(4, 8) * sign,
            "opt": (np.arange(8, dtype=np.int64) * sign, [np.array(2.5 * sign)]),
            "flags": rng.integers(0, 2, size=(4, 2)).astype(bool) ^ (sign < 0),
            "c": (np.arange(8) * (1 + 1j) * sign).astype(np.complex64).reshape(2, 4),
            "empty": np.zeros((0, 4), np.float32)}


SPECS = {"w": P("a", "b"), "opt": (P("b"), [P()]), "flags": P("a"), "c": P(None, "b"),
         "empty": P(None, "b")}


def _put(client, mesh, values):
    return {"w": client.put(values["w"], mesh, SPECS["w"]),
            "opt": (client.put(values["opt"][0], mesh, P("b")),
                    [client.put(values["opt"][1][0], mesh)]),
            "flags": client.put(values["flags"], mesh, P("a")),
            "c": client.put(values["c"], mesh, P(None, "b")),
            "empty": client.put(values["empty"], mesh, P(None, "b"))}


@pytest.fixture(scope="module")
def saved(pw_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("tamper")
    with pw.connect(pw_cluster.address) as client:
        mesh = client.mesh((2, 4), ("a", "b"))
        for name, sign in (("pristine", 1), ("other", -1)):
            client.save(root / name, _put(client, mesh, _values(sign))).result(timeout=30)
        yield client, mesh, root


def _entries(top):
    """Every file and directory under ``top`` (not ``top``), in a stable order."""
    out = []
    for here, dirs, files in os.walk(top):
        dirs.sort()
        out += [os.path.join(here, n) for n in sorted(dirs) + sorted(files)]
    return out


def _tamper(copy, other, kind, pick, where, byte):
    """One random change to the checkpoint at ``copy``; ``pick``/``where``/``byte`` are
    random numbers choosing what."""
    entries = _entries(copy)
    files = [e for e in entries if os.path.isfile(e) and not os.path.islink(e)]
    if kind == "flip_metadata":
        files, kind = [f for f in files if f.endswith("zarr.json")], "flip"
    if kind in ("flip", "truncate", "append") and files:
        path = files[pick % len(files)]
        data = bytearray(open(path, "rb").read())
        if kind == "flip" and data:
            data[where % len(data)] ^= byte
        elif kind == "truncate":
            data = data[:where % max(1, len(data))]
        elif kind == "append":
            data += bytes([byte]) * (1 + where % 8)
        open(path, "wb").write(bytes(data))
        return
    path = entries[pick % len(entries)] if entries else None
    if path is None or not os.path.lexists(path):
        return
    if kind == "delete":
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) \
            else os.remove(path)
    elif kind in ("rename", "rename_onto"):
        target = os.path.join(os.path.dirname(path), f"moved{where % 3}") \
            if kind == "rename" else entries[where % len(entries)]
        try:
            os.replace(path, target)
        except OSError:
            pass  # a directory onto a non-empty one, a file onto a directory...
    elif kind == "symlink":
        twin = os.path.join(other, os.path.relpath(path, copy))
        if os.path.lexists(twin):
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) \
                else os.remove(path)
            os.symlink(twin, path)


def _same(got, want):
    if isinstance(want, dict):
        return type(got) is dict and sorted(got) == sorted(want) and all(
            _same(got[k], want[k]) for k in want)
    if isinstance(want, (tuple, list)):
        return type(got) is type(want) and len(got) == len(want) and all(
            _same(g, w) for g, w in zip(got, want))
    got = np.asarray(got)
    return got.dtype == want.dtype and got.shape == want.shape and \
        got.tobytes() == want.tobytes()


def _fetch(tree):
    if isinstance(tree, dict):
        return {k: _fetch(v) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_fetch(v) for v in tree)
    return tree.result(timeout=30)


changes = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 10**6),
                             st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=3)


@settings(max_examples=80, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(changes=changes)
def test_a_tampered_checkpoint_loads_the_saved_values_or_raises_checkpoint_error(
        saved, tmp_path_factory, changes):
    client, mesh, root = saved
    copy = tmp_path_factory.mktemp("copy") / "ckpt"
    shutil.copytree(root / "pristine", copy, symlinks=True)
    try:
        for change in changes:
            _tamper(str(copy), str(root / "other"), *change)
        try:
            got = _fetch(client.load(copy, mesh))
        except pw.CheckpointError:
            return
        assert _same(got, _values(1)), f"{changes} loaded other values: {got}"
    finally:
        shutil.rmtree(copy.parent)


def test_the_tampering_is_seen_by_the_checks(saved, tmp_path):
    """The property above is not vacuous: the untouched copy loads its values, and each kind
    of change, made where it matters, is refused."""
    client, mesh, root = saved
    copy = tmp_path / "ckpt"
    shutil.copytree(root / "pristine", copy)
    assert _same(_fetch(client.load(copy, mesh)), _values(1))
    chunk = os.path.join("w", "c", "1", "2")
    for kind, path in [("flip", chunk), ("flip", os.path.join("w", "zarr.json")),
                       ("delete", chunk), ("truncate", chunk), ("append", chunk),
                       ("rename", chunk), ("symlink", chunk), ("symlink", "opt.0")]:
        shutil.rmtree(copy)
        shutil.copytree(root / "pristine", copy)
        entries = _entries(str(copy))
        pick = entries.index(os.path.join(str(copy), path))
        files = [e for e in entries if os.path.isfile(e)]
        _tamper(str(copy), str(root / "other"), kind,
                files.index(entries[pick]) if kind in ("flip", "truncate", "append") else pick,
                5, 0x20)
        with pytest.raises(pw.CheckpointError):
            _fetch(client.load(copy, mesh))
