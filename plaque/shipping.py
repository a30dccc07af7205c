"""Shipping code to workers: cloudpickle, with user code that workers cannot import by value.

Operators and kernel bodies often live in a script or a test module that exists only where
the driver runs. ``ship`` finds those modules (through ``functools.partial``, closures, and the
globals and modules a function uses) and has cloudpickle serialise them by value; the standard
library, installed packages and Plaque/Pathways themselves always go by reference.

Code objects travel with their file name (cloudpickle 3.1.3 replaced it with
``<dynamic-code>``) and the source lines they span, so a remote traceback says which file
and line of the user's code failed and shows that line, even on a machine that has no copy
of the file (its lines are put in ``linecache`` there, where traceback reads them).
"""

from __future__ import annotations

import functools
import io
import linecache
import marshal
import os
import sys
import types
from collections import ChainMap

import cloudpickle


def ship(obj, functions) -> bytes:
    """cloudpickle ``obj``; code from modules workers may not import (scripts, tests) by value.

    Looks through ``functools.partial``, closures and the globals a function uses, so helpers
    reached from a lambda travel too; the standard library, installed packages and Plaque
    itself always go by reference.
    """
    for module in _user_modules(functions):
        cloudpickle.register_pickle_by_value(module)
    out = io.BytesIO()
    _Pickler(out, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
    return out.getvalue()


def _code_reduce(code: types.CodeType):
    """A code object as marshal writes it: whole, its file name and line table included
    (nested code in its constants too), with the source lines it spans. The hosts run the
    driver's Python version, as cloudpickle's own code reducer already needs."""
    return _load_code, (marshal.dumps(code), _source_span(code))


def _source_span(code: types.CodeType) -> tuple[int, tuple[str, ...]] | None:
    """(first line, the lines) of ``code`` and the code nested in it, as this process reads
    its file (``linecache``: a Jupyter cell's too); None if it has none."""
    first = last = code.co_firstlineno
    lines = linecache.getlines(code.co_filename) if first >= 1 else None
    if not lines:
        return None
    todo = [code]
    while todo:
        c = todo.pop()
        last = max([last, *(n for _, _, n in c.co_lines() if n is not None)])
        todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return first, tuple(lines[first - 1:last])


def _load_code(blob: bytes, span) -> types.CodeType:
    code = marshal.loads(blob)
    if span is not None:
        _remember_source(code.co_filename, *span)
    return code


def _remember_source(filename: str, first: int, lines: tuple[str, ...]) -> None:
    """Make ``lines`` (from line ``first`` on) of ``filename`` what tracebacks show here, if
    this machine has no such file; what other code of it put there is kept."""
    if not lines or os.path.exists(filename):
        return
    entry = linecache.cache.get(filename)
    known = list(entry[2]) if entry is not None and len(entry) == 4 and entry[1] is None \
        else []  # an entry without an mtime is never checked against a file (checkcache)
    known += ["\n"] * (first - 1 + len(lines) - len(known))
    known[first - 1:first - 1 + len(lines)] = lines
    linecache.cache[filename] = (sum(map(len, known)), None, known, filename)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table)


def _user_modules(functions, depth: int = 4) -> set:
    found, seen = set(), set()
    todo = [(fn, 0) for fn in functions]
    while todo:
        fn, level = todo.pop()
        if id(fn) in seen or level > depth:
            continue
        seen.add(id(fn))
        if isinstance(fn, functools.partial):
            todo += [(x, level + 1) for x in (fn.func, *fn.args, *fn.keywords.values())]
            continue
        if isinstance(fn, types.ModuleType):  # a module used as a global: `helper.f(...)`
            if _is_user_module(fn):
                found.add(fn)
            continue
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        if module is not None and _is_user_module(module):
            found.add(module)
        code = getattr(fn, "__code__", None)
        if code is None:
            continue
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                todo.append((cell.cell_contents, level + 1))
            except ValueError:
                pass  # an empty cell
        names = getattr(fn, "__globals__", {})
        todo += [(names[n], level + 1) for n in code.co_names
                 if n in names and (callable(names[n]) or isinstance(names[n], types.ModuleType))]
    return found


def _is_user_module(module) -> bool:
    name = module.__name__
    top = name.split(".")[0]
    if name == "__main__" or top in ("plaque", "pathways") or top in sys.stdlib_module_names:
        return False
    file = getattr(module, "__file__", None) or ""
    return bool(file) and "site-packages" not in file and "dist-packages" not in file
