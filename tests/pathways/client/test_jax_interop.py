"""JAX's own objects at the client's edges (issue 30, item 3), each with JAX's meaning, checked
against plain JAX and numpy in this process (8 CPU devices: conftest sets XLA_FLAGS):
``jax.sharding.PartitionSpec`` wherever a ``P`` goes, ``pw.NamedSharding`` in ``put`` and
``device_put``, pytrees in and out, and a fetched array's scalar and JAX conversions. The
clusters are the session's in-process twin (the ``client`` fixture): no process is started."""

import collections
import dataclasses
import operator
import sys

import numpy as np
import pytest

import pathways as pw
from pathways import P
from pathways.client import pytrees
from pathways.program.sharding import as_spec, is_jax_spec, normalize_spec, split

jax = pytest.importorskip("jax")
jnp = jax.numpy
from jax.sharding import Mesh as JaxMesh  # noqa: E402
from jax.sharding import NamedSharding as JaxSharding  # noqa: E402
from jax.sharding import PartitionSpec as JaxP  # noqa: E402

WAIT = 30
NAMES = ("data", "model")
JAX_SPECS = [JaxP(), JaxP("data"), JaxP(None, "model"), JaxP("data", "model"),
             JaxP(("data", "model")), JaxP(("model", "data"), None), JaxP(("data",)),
             JaxP(None, ("model", "data"))]
Pair = collections.namedtuple("Pair", "mu nu")


@pytest.fixture
def mesh(client):
    return client.mesh((2, 4), NAMES)


def jax_mesh():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 JAX CPU devices (XLA_FLAGS set before JAX was imported)")
    return JaxMesh(np.array(jax.devices()[:8]).reshape(2, 4), NAMES)


def value(shape=(8, 8)):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape)


# == 1. JAX's PartitionSpec is taken as a P, with the same meaning =============================

@pytest.mark.parametrize("spec", JAX_SPECS, ids=repr)
def test_a_jax_spec_splits_an_array_as_jax_does(spec):
    """Device i of a row-major mesh holds under the converted spec what the JAX device at the
    same mesh position holds under JAX's spec."""
    assert is_jax_spec(spec) and isinstance(as_spec(spec), P)
    mesh, x = jax_mesh(), value()
    placed = jax.device_put(x, JaxSharding(mesh, spec))
    position = {d.id: i for i, d in enumerate(mesh.devices.flat)}
    ours = split(x, (2, 4), NAMES, spec)
    assert len(placed.addressable_shards) == len(ours)
    for shard in placed.addressable_shards:
        np.testing.assert_array_equal(ours[position[shard.device.id]], np.asarray(shard.data))


def test_a_jax_spec_converts_to_the_equal_p():
    assert as_spec(JaxP()) == P() and as_spec(JaxP("data", None)) == P("data", None)
    assert normalize_spec(JaxP(("data",)), 2, NAMES) == normalize_spec(P("data"), 2, NAMES)
    assert normalize_spec(JaxP(("data", "model")), 1, NAMES) == P(("data", "model"))
    assert as_spec(P("data")) == P("data") and as_spec(None) is None  # ours: unchanged


def test_what_a_p_cannot_mean_is_refused_clearly():
    with pytest.raises(pw.ShardingError, match="UNCONSTRAINED, which lets JAX's compiler"):
        normalize_spec(JaxP(JaxP.UNCONSTRAINED, "data"), 2, NAMES)
    with pytest.raises(pw.ShardingError, match="unreduced or reduced axes"):
        normalize_spec(JaxP("data", unreduced={"model"}), 2, NAMES)
    with pytest.raises(pw.ShardingError, match=r"only 1 dimension"):  # as JAX: rank too low
        normalize_spec(JaxP("data", None), 1, NAMES)
    with pytest.raises(pw.ShardingError, match=r"must be P\(...\).*\(str\)"):
        normalize_spec("data", 1, NAMES)


def test_put_takes_a_jax_spec(client, mesh):
    for spec in JAX_SPECS:
        x = client.put(value(), mesh, spec)
        assert x.spec == normalize_spec(P(*spec), 2, NAMES)
        np.testing.assert_array_equal(x.result(WAIT), value())


def test_shard_map_takes_jax_specs_for_numpy_and_jax_bodies(client, mesh):
    x0 = value()
    x = client.put(x0, mesh, JaxP("data"))
    want = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "data"), mesh=jax_mesh(),
                                 in_specs=JaxP("data"), out_specs=JaxP()))(x0)
    numpy_body = pw.shard_map(lambda v: pw.psum(v, "data"), mesh, JaxP("data"), JaxP())
    jax_body = pw.shard_map(lambda v: jax.lax.psum(v, "data"), mesh, JaxP("data"), JaxP())
    for fn in (numpy_body, jax_body):
        y = fn(x)
        assert y.spec == P(None, None)
        np.testing.assert_allclose(y.result(WAIT), np.asarray(want))

    double = pw.shard_map(lambda v: v * 2, mesh, JaxP(None, "model"), JaxP(None, "model"))

    @pw.program
    def chain(v):
        return numpy_body(double(v))  # both calls reshard their argument

    assert chain(x).spec == P(None, None)
    np.testing.assert_allclose(chain(x).result(WAIT), 2 * np.asarray(want))
    tree_fn = pw.shard_map(lambda d: {"s": d["a"] * 2}, mesh, ({"a": JaxP("data")},),
                           {"s": JaxP("data")})
    out = tree_fn({"a": x})["s"]
    assert out.spec == P("data", None)
    np.testing.assert_array_equal(out.result(WAIT), 2 * x0)


# == 2. NamedSharding: put(x, sharding) and device_put(x, sharding) ============================

def test_put_and_device_put_take_a_named_sharding(client, mesh):
    s = pw.NamedSharding(mesh, JaxP("data"))
    assert s.spec == P("data") and type(s.spec) is P
    x = client.put(value(), s)
    assert x.sharding == pw.NamedSharding(mesh, P("data", None))
    y = client.device_put(value(), s)
    assert y.sharding == x.sharding
    np.testing.assert_array_equal(y.result(WAIT), value())
    assert client.device_put(y, s) is y  # placed so already: as JAX, the same array
    moved = client.device_put(y, pw.NamedSharding(mesh, P(None, "model")))
    assert moved is not y and moved.spec == P(None, "model")
    np.testing.assert_array_equal(moved.result(WAIT), value())


def test_jax_own_named_sharding_holds_a_pathways_mesh(client, mesh):
    """JAX's spelling, jax.sharding.NamedSharding(mesh, spec) over a mesh from client.mesh,
    places as pw.NamedSharding does: put, device_put, and in a tree of shardings."""
    s = JaxSharding(mesh, JaxP("data"))
    assert s.mesh is mesh and s.spec == JaxP("data")
    x = client.put(value(), s)
    assert x.sharding == pw.NamedSharding(mesh, P("data", None))
    np.testing.assert_array_equal(x.result(WAIT), value())
    assert client.device_put(x, s) is x  # placed so already
    tree = client.device_put({"a": value(), "b": value((8,))},
                             {"a": JaxSharding(mesh, JaxP(None, "model")),
                              "b": pw.NamedSharding(mesh, P())})
    assert tree["a"].spec == P(None, "model") and tree["b"].spec == P(None)
    np.testing.assert_array_equal(tree["a"].result(WAIT), value())
    with pytest.raises(ValueError, match="nope"):  # JAX checks the spec against the mesh
        JaxSharding(mesh, JaxP("nope"))


def test_shardings_that_cannot_be_used_are_refused_clearly(client, mesh):
    with pytest.raises(pw.ShardingError, match="a NamedSharding alone"):
        client.put(value(), pw.NamedSharding(mesh, P()), P())
    with pytest.raises(pw.ShardingError, match="a JAX sharding of JAX's own devices"):
        client.device_put(value(), JaxSharding(jax_mesh(), JaxP("data")))
    with pytest.raises(pw.ShardingError, match="a JAX sharding of JAX's own devices"):
        client.put(value(), JaxSharding(jax_mesh(), JaxP("data")))
    with pytest.raises(pw.ShardingError, match="NamedSharding needs a mesh from client.mesh"):
        pw.NamedSharding(jax_mesh(), P())
    with pytest.raises(pw.ProgramError, match=r"put needs a mesh .* \(Mesh\)"):
        client.put(value(), jax_mesh(), P())
    with pytest.raises(pw.ShardingError, match=r"leaf \['b'\] would go to None.*no default"):
        client.device_put({"a": 1.0, "b": 2.0}, {"a": pw.NamedSharding(mesh, P()), "b": None})


# == 3. Pytrees in, the same pytree out ========================================================

def tree_value():
    return {"w": value(), "b": [np.ones(8, np.float32), None],
            "opt": Pair(value((16,)), jnp.arange(8.0)), "step": 3}


def test_put_of_a_tree_returns_the_same_tree(client, mesh):
    tree = tree_value()
    specs = {"w": JaxP("data"), "b": P(), "opt": Pair(JaxP(("data", "model")), None),
             "step": P()}
    out = client.put(tree, mesh, specs)
    assert jax.tree.structure(out) == jax.tree.structure(tree)
    assert out["b"][1] is None and isinstance(out["opt"], Pair)
    assert out["w"].spec == P("data", None) and out["opt"].mu.spec == P(("data", "model"))
    assert out["opt"].nu.spec == P(None) and out["step"].shape == ()
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(tree)):
        want = np.asarray(want)
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        np.testing.assert_array_equal(got.result(WAIT), want)
    one = client.put({"w": value()}, mesh, P())  # the case: no object array
    assert one["w"].dtype == np.float32 and one["w"].spec == P(None, None)


@jax.tree_util.register_pytree_node_class
class Params:
    """A pytree node of JAX's registry (as flax's, equinox's and optax's are)."""

    def __init__(self, w, b):
        self.w, self.b = w, b

    def tree_flatten(self):
        return (self.w, self.b), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def test_a_tree_of_jax_registered_nodes_goes_from_put_into_shard_map(client, mesh):
    """What put takes as a tree, a function takes too: a type registered with
    jax.tree_util and an OrderedDict (JAX's nodes) are nodes of shard_map's arguments and
    results. They were leaves there ("argument 0 is a Params, not a pw.Array")."""
    w, b = value(), np.arange(8, dtype=np.float32)
    params = client.put(Params(w, b), mesh, P())
    ordered = client.put(collections.OrderedDict(z=w, a=b), mesh, P())
    assert isinstance(params, Params) and isinstance(params.w, pw.Array)
    double = pw.shard_map(lambda p: jax.tree.map(lambda a: a * 2, p), mesh, P(), P())
    out = double(params)
    assert isinstance(out, Params)
    np.testing.assert_array_equal(out.w.result(WAIT), 2 * w)
    np.testing.assert_array_equal(out.b.result(WAIT), 2 * b)
    both = double(ordered)
    assert type(both) is collections.OrderedDict and list(both) == ["z", "a"]
    np.testing.assert_array_equal(both["a"].result(WAIT), 2 * b)
    ref = pw.reference(double)(Params(w, b))
    assert isinstance(ref, Params)
    np.testing.assert_array_equal(ref.w, 2 * w)
    layer = client.put(Layer(w, b), mesh, P())  # a dataclass: a node for put as for a call
    assert isinstance(layer, Layer) and isinstance(layer.b, pw.Array)
    bias = pw.shard_map(lambda p: p.b * 2, mesh, P(), P())(layer)
    np.testing.assert_array_equal(bias.result(WAIT), 2 * b)


@dataclasses.dataclass
class Layer:
    w: object
    b: object


def test_device_put_of_a_tree_takes_one_sharding_or_a_tree_of_them(client, mesh):
    tree = tree_value()
    everywhere = pw.NamedSharding(mesh, P())
    out = client.device_put(tree, everywhere)
    assert jax.tree.structure(out) == jax.tree.structure(tree)
    assert all(a.sharding.mesh == mesh and set(a.spec) <= {None} for a in jax.tree.leaves(out))
    split_w = {"w": pw.NamedSharding(mesh, JaxP("data")), "b": everywhere,
               "opt": everywhere, "step": everywhere}
    out = client.device_put(tree, split_w)
    assert out["w"].spec == P("data", None)
    np.testing.assert_array_equal(out["opt"].nu.result(WAIT), np.asarray(tree["opt"].nu))


@pytest.mark.parametrize("leaf, kind", [({1, 2}, "set"), ("abc", "str"),
                                        (object(), "object"), (b"xy", "bytes")])
def test_a_leaf_numpy_makes_no_numeric_array_of_is_refused_with_its_path(client, mesh, leaf,
                                                                         kind):
    tree = {"params": {"w": value(), "bad": leaf}}
    with pytest.raises(pw.ProgramError, match=rf"put: leaf \['params'\]\['bad'\] is a {kind},"):
        client.put(tree, mesh, P())
    with pytest.raises(pw.ProgramError, match=rf"device_put: leaf \[1\] is a {kind},"):
        client.device_put([1.0, leaf], pw.NamedSharding(mesh, P()))
    with pytest.raises(pw.ProgramError, match=rf"put: the value is a {kind},"):
        client.put(leaf, mesh)


def test_nothing_is_put_unless_every_leaf_fits(client, mesh):
    with pytest.raises(pw.ShardingError, match=r"leaf \['z'\]: dimension 0 .* not divisible"):
        client.put({"a": value(), "z": np.ones(3)}, mesh, P("data"))
    with pytest.raises(pw.ProgramError, match=r"put: the tree prefix \{'b': P\(\)\} has a dict of"
                                              r" keys 'b' where the top is a dict of keys 'a'"):
        client.put({"a": value()}, mesh, {"b": P()})


def test_the_plain_walker_reads_trees_as_jax_does(monkeypatch):
    tree = {"b": [1.0, None, (2.0, 3.0)], "a": Pair(4.0, {"y": 5.0, "x": 6.0}), "c": None}
    prefix = {"a": P("x"), "b": [P(), None, (P("y"), P())], "c": P()}
    is_item = lambda s: s is None or isinstance(s, P)  # noqa: E731
    want = pytrees.flatten(tree)  # the same leaves and paths as jax.tree_util's
    want_items = pytrees.per_leaf(prefix, tree, is_item, "t")
    assert want[0] == jax.tree_util.tree_leaves(tree)
    assert want[1] == [jax.tree_util.keystr(p) for p, _ in
                       jax.tree_util.tree_flatten_with_path(tree)[0]]
    assert want_items == [P("x")] * 3 + [P(), P("y"), P()]
    monkeypatch.setitem(sys.modules, "jax", None)  # as if JAX were not loaded
    leaves, paths, treedef = pytrees.flatten(tree)
    assert isinstance(treedef, tuple)  # the walker's, not JAX's
    assert (leaves, paths) == (want[0], want[1])
    assert pytrees.unflatten(treedef, leaves) == tree
    assert pytrees.per_leaf(prefix, tree, is_item, "t") == want_items
    with pytest.raises(pw.ProgramError, match=r"has a tuple of 1 where \['b'\] is a list of 3"):
        pytrees.per_leaf({"a": P(), "b": (P(),), "c": P()}, tree, is_item, "t")


def test_put_of_a_tree_without_jax_loaded(client, mesh, monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)
    out = client.put({"w": value(), "b": [np.ones(8), None]}, mesh, {"w": P("data"), "b": P()})
    assert out["b"][1] is None and out["w"].spec == P("data", None)
    np.testing.assert_array_equal(out["b"][0].result(WAIT), np.ones(8))
    with pytest.raises(pw.ProgramError, match=r"leaf \['b'\]\[0\] is a set"):
        client.put({"b": [{1}]}, mesh)


# == 4. A fetched array converts as numpy's and JAX's do =======================================

SCALARS = [np.float32(2.5), np.int64(-3), np.bool_(True), np.uint8(7), np.array([1.5]),
           np.arange(4.0), np.zeros((0,)), np.array([[2]], np.int32)]


def outcome(convert, v):
    try:
        return "value", convert(v)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("v", SCALARS, ids=lambda v: f"{v.dtype}{list(np.shape(v))}")
def test_scalar_conversions_are_numpys(client, mesh, v):
    a = client.put(v, mesh)
    for convert in (float, int, bool, complex, operator.index, len):
        assert outcome(convert, a) == outcome(convert, np.asarray(v)), convert


def test_what_numpy_refuses_is_refused_without_fetching(client, mesh):
    a = client.generate(lambda idx: np.ones((8, 8))[idx], (8, 8), np.float64, mesh, P("data"))
    for convert in (float, int, complex, operator.index):
        with pytest.raises(TypeError):
            convert(a)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(a)
    assert a.local_copy() is None  # refused from the shape and dtype alone
    s = client.generate(lambda idx: np.full((), 4.0), (), np.float64, mesh)
    assert float(s) == 4.0 and int(s) == 4
    with pytest.raises(TypeError, match="len\\(\\) of unsized object"):
        len(s)


def test_jax_converts_a_fetched_array(client, mesh):
    v = value()
    a = client.put(v, mesh, P("data"))
    for convert in (jnp.asarray, jnp.array):
        got, want = convert(a), convert(v)
        assert isinstance(got, jax.Array) and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(jnp.ones(v.shape) + a, jnp.ones(v.shape) + v)
    assert float(jnp.sum(jnp.asarray(a))) == float(jnp.sum(v))
    # JAX 0.10 traces only its own types: where it would trace a pw.Array, it is refused
    # with what to do (was JAX's "Triggering __jax_array__() during abstractification")
    f = pw.shard_map(lambda x: x * 2, mesh, P("data"), P("data"))
    for trace in (jnp.sum, jax.jit(lambda x: x * 2), jax.jit(f), jax.vmap(f),
                  jax.grad(lambda x: f(x).sum())):
        with pytest.raises(pw.ProgramError, match="JAX cannot trace .*@pw.program.*asarray"):
            trace(a)
    np.testing.assert_array_equal(jax.jit(f)(v), v * 2)  # JAX's own arrays: on the cluster
    loss = client.put(np.float32(0.25), mesh)
    assert float(loss) == 0.25 and float(jnp.asarray(loss)) == 0.25
