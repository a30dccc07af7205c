"""Code shipped to workers keeps where it came from: a failure there names the user's file
and line (cloudpickle alone, from 3.1.3, ships code as ``<dynamic-code>``)."""

import pickle
import subprocess
import sys
import traceback

from plaque.shipping import ship


def failing(v):
    def inner(w):
        raise ValueError(f"no good value {w}")  # the line a traceback should show
    return inner(v)


def test_shipped_code_keeps_its_file_and_lines():
    fn = pickle.loads(ship(failing, [failing]))
    assert fn.__code__.co_filename == __file__
    assert fn.__code__.co_firstlineno == failing.__code__.co_firstlineno
    try:
        fn(3)
    except ValueError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
    assert frames[-1].filename == __file__ and frames[-1].name == "inner"
    assert frames[-1].line == 'raise ValueError(f"no good value {w}")  # the line a ' \
        "traceback should show"


def test_a_shipped_function_runs_in_a_process_that_cannot_import_its_module(tmp_path):
    """By value, in a fresh interpreter: the result, and the traceback naming this file."""
    blob = tmp_path / "fn.pkl"
    blob.write_bytes(ship(failing, [failing]))
    script = ("import pickle, sys, traceback\n"
              f"fn = pickle.loads(open({str(blob)!r}, 'rb').read())\n"
              "try:\n    fn(5)\nexcept ValueError:\n    traceback.print_exc()\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert "ValueError: no good value 5" in out.stderr, out.stderr
    assert f'File "{__file__}"' in out.stderr and "raise ValueError(" in out.stderr


MODULE = '''\
def first(v):
    return helper(v) + 1


def helper(v):
    if v > 2:
        raise ValueError(f"too big: {v}")  # line 7
    return v


def second(v):
    def inner(w):
        raise KeyError(w)  # line 13
    return inner(v)
'''


def test_a_machine_without_the_file_still_shows_the_failing_lines(tmp_path):
    """The file exists where the code was shipped from, not where it runs: its lines come
    with the code (both functions' lines, one file), and tracebacks there show them."""
    import importlib.util

    path = tmp_path / "only_on_the_driver.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("only_on_the_driver", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        blob = tmp_path / "fns.pkl"
        blob.write_bytes(ship((module.first, module.second), [module.first, module.second]))
    finally:
        del sys.modules[spec.name]
    path.unlink()  # as on a host with no copy of it
    script = ("import pickle, traceback\n"
              f"first, second = pickle.loads(open({str(blob)!r}, 'rb').read())\n"
              "print(first(1))\n"
              "for fn, v in ((first, 5), (second, 'k')):\n"
              "    try:\n        fn(v)\n    except Exception:\n        traceback.print_exc()\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.stdout == "2\n", out.stderr
    assert f'File "{path}", line 7, in helper' in out.stderr, out.stderr
    assert 'raise ValueError(f"too big: {v}")  # line 7' in out.stderr
    assert "return helper(v) + 1" in out.stderr  # the caller's line, same file
    assert f'File "{path}", line 13, in inner' in out.stderr
    assert "raise KeyError(w)  # line 13" in out.stderr
