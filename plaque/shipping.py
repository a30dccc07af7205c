"""Shipping code to workers: cloudpickle, with user code that workers cannot import by value.

Operators and kernel bodies often live in a script or a test module that exists only where
the driver runs. ``ship`` finds those modules (through ``functools.partial``, closures, and the
globals and modules a function uses) and has cloudpickle serialise them by value; the standard
library, installed packages and Plaque/Pathways themselves always go by reference.

Code objects travel with their file name (cloudpickle 3.1.3 replaced it with
``<dynamic-code>``), so a remote traceback still says which file and line of the user's
code failed, and shows the line wherever that file can be read.
"""

from __future__ import annotations

import functools
import io
import marshal
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
    (nested code in its constants too). The hosts run the driver's Python version, as
    cloudpickle's own code reducer already needs."""
    return marshal.loads, (marshal.dumps(code),)


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
