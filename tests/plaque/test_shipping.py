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
