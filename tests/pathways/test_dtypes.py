"""Every dtype JAX uses works end to end (issue 30, item 1): numpy's own and every dtype
ml_dtypes exposes (bfloat16, the float8/float6/float4 variants, int4, ...) go through put and
fetch, collectives across hosts, transfers between meshes, MoE routing and checkpoints bit for
bit; psum adds them as JAX does; the wire refuses data types it does not know."""

import json
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathways as pw
from pathways import P
from pathways.checkpoint_format import ZARR_DTYPES, seal
from pathways.dtypes import (
    RawArray,
    from_bytes,
    ml_dtypes_by_name,
    raw_bytes,
    shippable,
    unwrap,
    wire_dtype,
    wire_name,
)
from pathways.host import ici
from pathways.program.collectives import ordered_sum
from plaque import wire

ml_dtypes = pytest.importorskip("ml_dtypes")
zarr = pytest.importorskip("zarr")

ML = list(ml_dtypes_by_name().values())
NUMPY = [np.dtype(n) for n in ZARR_DTYPES]
ALL = ML + NUMPY
SETTINGS = settings(max_examples=2, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def test_ml_dtypes_are_all_there():
    assert {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn",
            "float6_e2m3fn", "int4", "uint4", "int2"} <= {d.name for d in ML}
    assert len(ML) == len([t for t in ml_dtypes.__all__ if isinstance(
        getattr(ml_dtypes, t), type) and issubclass(getattr(ml_dtypes, t), np.generic)])


def bits(dtype, shape, seed):
    """Any bit pattern of ``dtype`` (NaNs, infinities, unused high bits of int4): all must
    come back as they went. Bools are 0 or 1."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---- the module alone: names, bytes, pickles, the ICI codec -------------------------------

@pytest.mark.parametrize("dtype", ALL + [np.dtype(s) for s in (">f4", "<M8[ns]", "|S3", "<U2",
                                                              "|V2", "O")], ids=str)
def test_every_dtype_has_a_wire_name_that_gives_it_back(dtype):
    name = wire_name(dtype)
    back = wire_dtype(name)
    assert back == dtype and back.type is dtype.type and wire_name(back) == name
    if dtype in ML:
        assert name == dtype.name  # not dtype.str: '<V2' would be a void type


@pytest.mark.parametrize("name", ["float32", "V2", "bogus", "<f1", "", "i4,i4", "|V2x"])
def test_a_name_the_wire_does_not_know_is_refused_by_name(name):
    with pytest.raises(pw.ProgramError, match=f"unknown data type {name!r}"):
        wire_dtype(name)


def test_structured_dtypes_have_no_wire_name():
    with pytest.raises(pw.ProgramError, match="has no wire name"):
        wire_name(np.dtype([("a", "<i4"), ("b", "<f2")]))


@pytest.mark.parametrize("dtype", ML, ids=str)
def test_raw_bytes_are_a_view_and_read_back_exactly(dtype):
    a = bits(dtype, (3, 5), 1)
    view = raw_bytes(a)
    assert view.nbytes == a.nbytes and np.shares_memory(np.frombuffer(view, np.uint8), a)
    assert same_bits(from_bytes(view, dtype, a.shape), a)
    assert same_bits(from_bytes(raw_bytes(a.T), dtype, (5, 3)), a.T)  # a C-ordered copy
    assert same_bits(from_bytes(raw_bytes(a[0, 0]), dtype, ()), a[0, 0])
    assert from_bytes(raw_bytes(a[:0]), dtype, (0, 5)).shape == (0, 5)
    with pytest.raises(ValueError, match="bytes for a"):
        from_bytes(view, dtype, (3, 4))


@pytest.mark.parametrize("dtype", ML, ids=str)
def test_ml_arrays_pickle_without_copying_their_bytes_into_the_pickle(dtype):
    a = bits(dtype, (64, 64), 2)  # >= 4096 bytes: plaque.wire sends it out of band
    frames = wire.encode(wire.Kind.USER, 0, ("answer", shippable(a)))
    assert len(frames) == 3 and memoryview(frames[2]).nbytes == a.nbytes
    _, _, (_, back) = wire.decode([bytes(f) for f in frames])
    assert type(back) is np.ndarray and same_bits(back, a)
    small = pickle.loads(pickle.dumps(RawArray(a[:2, :3]), protocol=5))
    assert same_bits(small, a[:2, :3]) and small.flags.writeable
    plain = np.ones(3)  # numpy's own types pickle out of band as they are
    assert unwrap(shippable(a)) is a and shippable(plain) is plain


def test_the_ici_codec_carries_every_dtype_and_refuses_objects():
    items = [(((7,), i), i, (4, 5), bits(d, (2, 3), i), -0.5) for i, d in enumerate(ALL)]
    got = ici.decode([bytes(f) for f in ici.encode(items)])
    for (key, src, dsts, value, lag), back in zip(items, got):
        assert back[:3] == (key, src, dsts) and back[4] == lag and same_bits(back[3], value)
    outbox = ici.IciOutbox({0: 0, 4: 1})
    with pytest.raises(pw.ProgramError, match="can only carry numeric arrays"):
        outbox.queue(((1,), 0), 0, [4], np.array([{}, None]))


def test_psum_adds_narrow_floats_as_jax_does():
    """JAX (XLA on CPU) adds bfloat16 in float32 and float8 in float16, rounding once; our
    psum, the real path's and the reference's, does the same, so for those types the order
    of the additions does not show and the sums are bitwise JAX's. float16 adds in itself,
    rounding at each step: XLA on CPU adds in position order, our psum along the reduction
    tree (``reduction.tree_fold``, the order a host-hierarchical reduction can keep), so
    there the sums are the tree's, written out here."""
    jax = pytest.importorskip("jax")
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as JaxP

    mesh = jax.make_mesh((8,), ("d",))
    psum = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "d"), mesh=mesh,
                                 in_specs=JaxP("d"), out_specs=JaxP()))
    rng = np.random.default_rng(0)
    for dtype in [np.dtype(n) for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2",
                                        "float8_e8m0fnu", "float4_e2m1fn", "float16",
                                        "int4")]:
        v = rng.normal(size=(8, 64)) * rng.choice([0.01, 1, 3], size=(8, 64))
        v = (v * 2).astype(np.int8).astype(dtype) if dtype.name.startswith("int") else \
            v.astype(dtype)
        if dtype == np.float16:
            want = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]))
        else:
            want = np.asarray(psum(jax.device_put(v, NamedSharding(mesh, JaxP("d")))))
        assert same_bits(ordered_sum(list(v)), want.reshape(64)), dtype
    one = np.array([1.0] + [2.0 ** -8] * 7, ml_dtypes.bfloat16)
    assert ordered_sum(list(one)) == 1.03125  # in bfloat16 at each step it would be 1.0


# ---- on the session's twin cluster (2 hosts x 4 devices) ----------------------------------

@pytest.fixture(scope="module")
def c(pw_cluster):
    with pw.connect(pw_cluster.address) as client:
        yield client


@pytest.fixture(scope="module")
def progs(c):
    """Meshes and compiled functions shared by the examples (each traced once per dtype)."""
    m = c.mesh((2, 4), ("data", "model"))
    m8 = c.mesh((8,), ("d",))
    host = {d.id: d.host for d in c.devices()}
    rows = m.device_ids
    assert {host[d] for d in rows[0]} != {host[d] for d in rows[1]}  # "data" crosses hosts
    return {
        "m": m, "m8": m8,
        "psum": pw.shard_map(lambda a: pw.psum(a, "data"), m, P("data", "model"),
                             P(None, "model")),
        "gather": pw.shard_map(lambda a: pw.all_gather(a, "data", tiled=True), m, P("data"),
                               P()),
        "columns": pw.shard_map(lambda a: a, m8, P(None, "d"), P(None, "d")),
        # replication along "data" is not proven (an ``if`` on axis_index): checked at run
        # time, by a digest of each device's bytes
        "checked": pw.shard_map(lambda a: pw.psum(a, "data") if pw.axis_index("data") >= 0
                                else a, m, P("data"), P()),
    }


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # any bits: inf - inf makes a NaN
@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), rows=st.sampled_from([2, 4, 6]),
       cols=st.sampled_from([8, 16]))
@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_every_dtype_end_to_end(c, progs, tmp_path_factory, dtype, seed, rows, cols):
    m, m8 = progs["m"], progs["m8"]
    value = bits(dtype, (rows, cols), seed)
    x = c.put(value, m, P("data"))
    assert same_bits(x.result(30), value)  # put and fetch
    for f in (progs["psum"], progs["gather"], progs["checked"]):  # across the hosts
        assert same_bits(f(x).result(30), pw.reference(f)(value))
    assert same_bits(progs["columns"](x).result(30), value)  # rows -> columns: a transfer
    path = tmp_path_factory.mktemp("ckpt") / "c"
    c.save(path, {"v": x}).result(30)
    assert same_bits(c.load(path, m8, P(None, "d"))["v"].result(30), value)
    stored = zarr.open_group(str(path), mode="r")["v"]  # plain zarr reads the same bits
    if dtype in ML:
        assert stored.dtype == np.dtype(f"V{dtype.itemsize}")
        assert stored.attrs["pathways"]["dtype"] == dtype.name
        assert same_bits(stored[...].view(dtype), value)
    else:
        assert same_bits(stored[...], value)


@pytest.mark.parametrize("dtype", ML, ids=str)
def test_moe_routing_carries_every_ml_dtype(c, dtype):
    tm, em = c.mesh((4,), ("data",), hosts=2), c.mesh((4,), ("expert",), hosts=2)  # both span the two hosts
    ident = pw.expert_map(lambda x: x, tm, em, num_experts=4, name="ident")
    route = np.random.default_rng(3).integers(-1, 4, size=(16, 2)).astype(np.int32)
    x = bits(dtype, (16, 3), 4)
    got = ident(c.put(route, tm, P("data")), c.put(x, tm, P("data"))).result(30)
    assert same_bits(got, pw.reference(ident)(route, x))


def test_a_bfloat16_moe_layer_runs_as_its_reference(c):
    tm, em = c.mesh((4,), ("data",)), c.mesh((4,), ("expert",))
    rng = np.random.default_rng(5)
    bf16 = ml_dtypes.bfloat16
    x = rng.normal(size=(32, 6)).astype(bf16)
    wr, w1, w2 = (a.astype(bf16) for a in pw.moe.init_params(rng, 6, 10, 8, np.float32))
    layer = pw.moe.MoELayer(tm, em, 8, top_k=2, capacity_factor=1.25)

    @pw.program
    def forward(x, wr, w1, w2):
        y, _, aux, load = layer.forward(x, wr, w1, w2)
        return y, aux, load

    got = forward(c.put(x, tm, P("data")), c.put(wr, tm, P()), c.put(w1, em, P("expert")),
                  c.put(w2, em, P("expert")))
    for g, w in zip(got, pw.reference(forward)(x, wr, w1, w2)):
        assert same_bits(g.result(30), w)
    assert got[0].dtype == bf16


def test_generate_makes_ml_dtype_shards_on_the_hosts(c, progs):
    m8 = progs["m8"]
    bf16 = np.dtype(ml_dtypes.bfloat16)
    x = c.generate(lambda idx: np.arange(idx[0].start, idx[0].stop).astype(bf16), (16,), bf16,
                   m8, P("d"))
    assert same_bits(x.result(30), np.arange(16).astype(bf16))
    bad = c.generate(lambda idx: np.zeros(2, np.float32), (16,), bf16, m8, P("d"))
    with pytest.raises(pw.PathwaysError, match="returned float32.*expected bfloat16"):
        bad.result(30)


def test_a_checkpoint_s_raw_dtype_is_checked_and_sealed(c, progs, tmp_path):
    e4m3, e5m2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
    value = bits(e4m3, (8,), 6)
    c.save(tmp_path / "a", {"x": c.put(value, progs["m8"], P("d"))}).result(30)
    meta_file = tmp_path / "a" / "x" / "zarr.json"
    meta = json.loads(meta_file.read_text())
    assert meta["data_type"] == {"name": "raw_bytes", "configuration": {"length_bytes": 1}}
    assert meta["attributes"]["pathways"]["dtype"] == "float8_e4m3fn"

    def load_with(change, reseal=True):
        edited = json.loads(json.dumps(meta))
        change(edited)
        meta_file.write_text(json.dumps(edited))
        if reseal:
            seal(str(tmp_path / "a" / "x"))
        return c.load(tmp_path / "a", progs["m8"])["x"]

    def name(value):
        return lambda m: m["attributes"]["pathways"].__setitem__("dtype", value)

    with pytest.raises(pw.CheckpointError, match="does not match its checksum"):
        load_with(name("float8_e5m2"), reseal=False)  # the name is part of the checksum
    for other in ("bfloat16", "uint8", "bogus", None):  # wrong size, a core type, unknown
        with pytest.raises(pw.CheckpointError, match=f"pathways dtype {other!r}"):
            load_with(name(other))
    with pytest.raises(pw.CheckpointError, match="data_type 'uint8' and names another"):
        load_with(lambda m: m.__setitem__("data_type", "uint8"))
    back = load_with(name("float8_e5m2"))  # renamed and resealed: the same bits, as e5m2
    assert same_bits(back.result(30), value.view(e5m2))


def test_save_refuses_dtypes_zarr_cannot_hold(c, progs, tmp_path):
    x = c.put(np.zeros(8, "<M8[ns]"), progs["m8"], P("d"))
    with pytest.raises(pw.ProgramError, match="no Zarr v3 data type.*bfloat16"):
        c.save(tmp_path / "t", x)


# ---- the report, on real host processes -------------------------------------------

def test_a_bfloat16_psum_across_hosts_answers_at_once():
    """Issue 30: this waited 60 s for a peer and failed ("cannot include dtype 'E' in a
    buffer" on the host): the sum crosses the two hosts' ICI link."""
    jnp = pytest.importorskip("jax.numpy")
    lax = pytest.importorskip("jax.lax")
    with pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=4) as cluster, \
            pw.connect(cluster.address) as c:
        m = c.mesh((8,), ("data",))
        x = c.put(np.ones(8, jnp.bfloat16), m, P("data"))
        # within 30 s: not the 60 s collective timeout the run ended in
        y = pw.shard_map(lambda a: lax.psum(a, "data"), m, P("data"), P())(x).result(30)
        assert y.dtype == jnp.bfloat16 and y.tolist() == [8]
        mixed = c.put(np.array([1.0] + [2.0 ** -8] * 7, jnp.bfloat16), m, P("data"))
        z = pw.shard_map(lambda a: lax.psum(a, "data"), m, P("data"), P())(mixed).result(30)
        assert z.tolist() == [1.03125]  # as JAX adds bfloat16: in float32, rounded once
