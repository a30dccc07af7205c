"""User code that raises any BaseException on a host -- SystemExit, KeyboardInterrupt,
GeneratorExit, a class of the user's own -- fails that call (its kernel and gang, or that
generated array) with a RemoteError naming the exception, and nothing else: the host keeps
serving, later calls of the same client work, other clients never notice."""

import numpy as np
import pytest

import pathways as pw
from pathways import P


class Interrupted(BaseException):
    """A user's own BaseException subclass."""


RAISED = [SystemExit, KeyboardInterrupt, GeneratorExit, Interrupted]


def _on_real_data(exc_type):
    """A body that runs on zero-filled shards (the client's abstract pass) and raises
    ``exc_type`` on the device whose shard holds data; the other waits in a psum for it."""
    def body(v):
        if v.sum() > 0:
            raise exc_type("stopped by the body")
        return v + pw.psum(v, "d")
    return body


def _raises_in_generate(exc_type):
    def make(index):
        raise exc_type("stopped by the input function")
    return make


def _check_survives(client, other, exc_type):
    mesh = client.mesh((2,), ("d",))
    x = client.put(np.array([1.0, 0.0]), mesh, P("d"))  # device 0 raises, device 1 waits
    f = pw.shard_map(_on_real_data(exc_type), mesh, P("d"), P("d"))
    # the run fails with the body's own exception, naming its device, whichever kernel's
    # failure reaches the coordinator first (the peer's abandoned psum carries the root)
    with pytest.raises(pw.RemoteError,
                       match=rf"{exc_type.__name__}: stopped by the body") as caught:
        f(x).result(timeout=30)
    assert "Abandoned" not in str(caught.value)
    assert caught.value.device == mesh.ids[0]
    y = client.generate(_raises_in_generate(exc_type), (4,), np.float64, mesh, P("d"))
    with pytest.raises(pw.RemoteError, match=exc_type.__name__):
        y.result(timeout=30)
    double = pw.shard_map(lambda v: v * 2.0, mesh, P("d"), P("d"))
    np.testing.assert_array_equal(double(x).result(timeout=30), [2.0, 0.0])  # same devices
    z = client.generate(lambda idx: np.ones(2), (4,), np.float64, mesh, P("d"))
    np.testing.assert_array_equal(z.result(timeout=30), np.ones(4))
    other_mesh = other.mesh((2,), ("d",))
    w = other.put(np.arange(2.0), other_mesh, P("d"))
    plus = pw.shard_map(lambda v: v + 1.0, other_mesh, P("d"), P("d"))
    np.testing.assert_array_equal(plus(w).result(timeout=30), [1.0, 2.0])


@pytest.mark.parametrize("exc_type", RAISED, ids=lambda t: t.__name__)
def test_on_the_twin_a_base_exception_fails_only_its_call(pw_cluster, exc_type):
    with pw.connect(pw_cluster.address) as client, pw.connect(pw_cluster.address) as other:
        _check_survives(client, other, exc_type)


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt, Interrupted],
                         ids=lambda t: t.__name__)
def test_on_host_processes_a_base_exception_fails_only_its_call(pw_process_cluster, exc_type):
    with pw.connect(pw_process_cluster.address) as client, \
            pw.connect(pw_process_cluster.address) as other:
        _check_survives(client, other, exc_type)


def test_every_call_after_many_base_exceptions_still_runs(pw_cluster):
    """The device is not held, nor a greenlet or a timer left behind, by a failed body:
    more failures than the executor keeps idle greenlets for, then a normal call."""
    with pw.connect(pw_cluster.address) as client:
        mesh = client.mesh((1,), ("d",))
        x = client.put(np.ones(1), mesh, P("d"))
        f = pw.shard_map(_on_real_data(SystemExit), mesh, P("d"), P("d"))
        outs = [f(x) for _ in range(70)]
        for out in outs:
            with pytest.raises(pw.RemoteError, match="SystemExit"):
                out.result(timeout=30)
        g = pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"))
        np.testing.assert_array_equal(g(x).result(timeout=30), [2.0])


def test_a_body_that_raises_system_exit_on_the_client_is_a_program_error(pw_cluster):
    """The abstract pass runs the body on the client: its SystemExit must not end the
    caller's program either."""
    with pw.connect(pw_cluster.address) as client:
        mesh = client.mesh((2,), ("d",))
        x = client.put(np.ones(4), mesh, P("d"))

        def body(v):
            raise SystemExit("stopped")

        with pytest.raises(pw.ProgramError, match=r"body raised SystemExit\(stopped\)"):
            pw.shard_map(body, mesh, P("d"), P("d"))(x)
        np.testing.assert_array_equal(
            pw.shard_map(lambda v: v + 1.0, mesh, P("d"), P("d"))(x).result(timeout=30), 2.0)
