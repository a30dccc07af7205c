"""Wire format tests: what ``plaque.wire`` encodes comes back intact, and nothing else gets in.

Every message between workers and coordinator goes through ``encode``/``decode``, so we check
that (1) any payload the engine may send (nested containers, ints, strings, bytes, numpy arrays
of any layout and dtype) survives a round trip for every ``Kind``; (2) small arrays stay inside
the pickle while large ones travel as their own, uncopied frames, as the format promises; and
(3) ``decode`` turns every malformed message into ``ProtocolError`` and never into another
exception, because a receiver only catches that one, and a worker fed garbage drops it, counts
it and keeps working.
"""

import struct

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plaque import wire
from plaque.commands import Send
from plaque.errors import ProtocolError
from plaque.wire import Kind
from plaque.worker import COORDINATOR, WorkerCore

# The documented header: magic "PQ", version, kind, sender id (8 bytes, network order).
HEADER = struct.Struct("!2sBBi")
INT32 = st.integers(-(2**31), 2**31 - 1)


def header(magic=b"PQ", version=wire.VERSION, kind=int(Kind.HEARTBEAT), sender=0) -> bytes:
    return HEADER.pack(magic, version, kind, sender)


def on_the_wire(frames) -> list:
    """What a socket hands the receiver: plain copies of each frame."""
    return [bytes(f) for f in frames]


def same(a, b) -> bool:
    """Structural equality; arrays compare bit for bit (NaN == NaN) with dtype and shape."""
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes() == b.tobytes())
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    return a == b


# ---- payload strategies ---------------------------------------------------------------------

DTYPES = [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float32, np.float64,
          np.complex128]


def _layout(array_and_layout):
    a, layout = array_and_layout
    if layout == "F":
        return np.asfortranarray(a)
    if layout == "strided" and a.ndim:
        return a[::2]  # a non-contiguous view
    return a


# At most 6**3 elements of at most 16 bytes: always below INBAND_LIMIT, so always in band.
small_arrays = st.tuples(
    st.sampled_from(DTYPES).flatmap(
        lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0,
                                                   max_side=6))),
    st.sampled_from(["C", "F", "strided"]),
).map(_layout)
leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
                   st.binary(max_size=64), small_arrays)
payloads = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.tuples(kids, kids),
        st.dictionaries(st.one_of(st.integers(), st.text(max_size=8)), kids, max_size=4)),
    max_leaves=12)


# ---- round trips --------------------------------------------------------------------------

@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(Kind), sender=INT32, payload=payloads)
def test_round_trip_every_kind(kind, sender, payload):
    frames = wire.encode(kind, sender, payload)
    assert len(frames) == 2  # small arrays only: header and body, no extra frames
    assert bytes(frames[0]) == header(kind=int(kind), sender=sender)
    got_kind, got_sender, got = wire.decode(on_the_wire(frames))
    assert (got_kind, got_sender) == (kind, sender) and type(got_kind) is Kind
    assert same(got, payload)


@pytest.mark.parametrize("nbytes", [0, 1, wire.INBAND_LIMIT - 1])
def test_small_array_stays_in_band(nbytes):
    array = np.arange(nbytes, dtype=np.uint8)
    frames = wire.encode(Kind.DATA, 1, [array])
    assert len(frames) == 2
    assert same(wire.decode(on_the_wire(frames))[2], [array])


@pytest.mark.parametrize("nbytes", [wire.INBAND_LIMIT, 8 << 20])
@pytest.mark.parametrize("order", ["C", "F"])
def test_large_array_goes_out_of_band_uncopied(nbytes, order):
    array = np.arange(nbytes // 8, dtype=np.float64).reshape(2, -1).copy(order=order)
    frames = wire.encode(Kind.DATA, 1, {"a": array})
    assert len(frames) == 3
    # The extra frame is the array's own memory, not a copy of it.
    assert memoryview(frames[2]).nbytes == array.nbytes
    assert np.shares_memory(np.frombuffer(frames[2], dtype=np.uint8), array)
    assert len(frames[1]) < wire.INBAND_LIMIT  # the body holds no array data
    got = wire.decode(on_the_wire(frames))[2]["a"]
    assert same(got, array) and got.flags.f_contiguous == array.flags.f_contiguous


@pytest.mark.parametrize("order", ["C", "F"])
def test_chunked_sends_a_buffer_over_chunk_as_frames_of_its_own_memory(order):
    array = np.arange(5 * wire.CHUNK // 8, dtype=np.float64).reshape(2, -1).copy(order=order)
    small, big = np.arange(wire.INBAND_LIMIT, dtype=np.uint8), np.ones(wire.CHUNK + 1, np.int8)
    plain = wire.encode(Kind.DATA, 1, [small, array, big])
    assert wire.chunked(plain[:2] + plain[2:3]) == plain[:3]  # nothing over CHUNK: unchanged
    frames = wire.chunked(plain)
    assert frames[0][3] == int(Kind.DATA) | wire.CHUNKED and frames[1] is plain[1]
    assert struct.unpack("<3I", frames[2]) == (1, 5, 2)  # frames per buffer
    sizes = [memoryview(f).nbytes for f in frames[3:]]
    assert sizes == [small.nbytes, *[wire.CHUNK] * 5, wire.CHUNK, 1]
    for f in frames[4:9]:  # views of the array, not copies
        assert np.shares_memory(np.frombuffer(f, dtype=np.uint8), array)
    kind, sender, got = wire.decode(on_the_wire(frames))
    assert (kind, sender) == (Kind.DATA, 1)  # the flag is not the kind
    assert same(got, [small, array, big])
    assert got[1].flags.f_contiguous == array.flags.f_contiguous


@pytest.mark.parametrize("layout, extra", [(b"", 0), (b"\x01\x00\x00", 0),
                                           (struct.pack("<2I", 1, 0), 1),
                                           (struct.pack("<2I", 1, 2), 2),
                                           (struct.pack("<1I", 2), 3)])
def test_a_chunked_message_whose_frame_counts_do_not_match_is_a_protocol_error(layout, extra):
    body = wire.encode(Kind.DATA, 1, [np.ones(wire.CHUNK + 1, np.int8)])[1]
    frames = [header(kind=int(Kind.DATA) | wire.CHUNKED), body, layout,
              *[b"x" * 8] * extra]
    with pytest.raises(ProtocolError, match="frame counts"):
        wire.decode(frames)


def test_a_chunked_message_without_its_frame_counts_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="no frame counts"):
        wire.decode([header(kind=int(Kind.DATA) | wire.CHUNKED), b"x"])


def test_several_large_arrays_one_frame_each_in_order():
    arrays = [np.full(1000 + i, i, dtype=np.int64) for i in range(4)]
    frames = wire.encode(Kind.OUTPUT, 2, [("x", arrays[0]), ("y", arrays[1:])])
    assert [memoryview(f).nbytes for f in frames[2:]] == [a.nbytes for a in arrays]
    assert same(wire.decode(on_the_wire(frames))[2], [("x", arrays[0]), ("y", arrays[1:])])


def test_large_non_contiguous_array_round_trips():
    array = np.arange(1 << 16, dtype=np.int32)[::3]  # not contiguous: cannot be a raw frame
    assert same(wire.decode(on_the_wire(wire.encode(Kind.DATA, 0, array)))[2], array)


# ---- rejection ------------------------------------------------------------------------------

BODY = wire.encode(Kind.PROGRESS, 5, {"g": [(("cap", 1, 0, 3), -1)], "b": b"\x00" * 9})[1]
BAD_MESSAGES = {
    "no frames": [],
    "header only": [header()],
    "empty header": [b"", BODY],
    "short header": [header()[:7], BODY],
    "long header": [header() + b"\x00", BODY],
    "bad magic": [header(magic=b"QP"), BODY],
    "zero magic": [header(magic=b"\x00\x00"), BODY],
    "old version": [header(version=wire.VERSION - 1), BODY],
    "new version": [header(version=wire.VERSION + 1), BODY],
    "kind 0": [header(kind=0), BODY],
    "kind past the last": [header(kind=max(Kind) + 1), BODY],
    "kind 255": [header(kind=255), BODY],
    "empty body": [header(), b""],
    "garbage body": [header(), b"not a pickle at all"],
    "pickle without STOP": [header(), BODY[:-1]],
    "missing out-of-band frame": wire.encode(Kind.DATA, 0, np.zeros(4096, np.uint8))[:2],
}


@pytest.mark.parametrize("frames", BAD_MESSAGES.values(), ids=BAD_MESSAGES.keys())
def test_decode_rejects(frames):
    with pytest.raises(ProtocolError):
        wire.decode(frames)


def test_decode_rejects_every_truncation_of_the_body():
    for cut in range(len(BODY)):
        with pytest.raises(ProtocolError):
            wire.decode([header(), BODY[:cut]])


def decode_or_reject(frames):
    """Decode, or None for a ProtocolError; any other exception escapes and fails the test."""
    try:
        return wire.decode(frames)
    except ProtocolError:
        return None


frame_bytes = st.binary(max_size=64)
headers = st.builds(header, magic=st.sampled_from([b"PQ", b"PQ", b"QP"]),
                    version=st.sampled_from([wire.VERSION, wire.VERSION, 0, 2, 255]),
                    kind=st.integers(0, 255), sender=INT32)
# Mostly well-formed headers, so that the fuzzing reaches the body, as well as pure noise.
garbage = st.one_of(
    st.lists(frame_bytes, max_size=5),
    st.builds(lambda h, rest: [h, *rest], headers, st.lists(frame_bytes, max_size=4)),
)


@settings(max_examples=500, deadline=None)
@given(frames=garbage)
def test_arbitrary_frames_decode_or_raise_protocol_error(frames):
    decode_or_reject(frames)


@settings(max_examples=300, deadline=None)
@given(pos=st.integers(0, len(BODY) - 1), byte=st.integers(0, 255),
       tail=st.binary(max_size=16))
def test_corrupted_body_decodes_or_raises_protocol_error(pos, byte, tail):
    # A plausible body with one byte changed and junk appended: the nastiest garbage for pickle.
    body = BODY[:pos] + bytes([byte]) + BODY[pos + 1:] + tail
    decode_or_reject([header(kind=int(Kind.PROGRESS)), body])


# ---- a worker fed garbage ---------------------------------------------------------------------

def fresh_worker() -> WorkerCore:
    w = WorkerCore("inproc-worker", "inproc-coordinator")
    w.take_commands()  # its opening connect + HELLO
    return w


def dropped(w, peer=-2) -> int:
    return w.counters.peer(peer).dropped


def test_worker_drops_garbage_counts_it_and_keeps_working():
    w = fresh_worker()
    for frames in BAD_MESSAGES.values():
        w.receive(frames)
    w.receive(wire.encode(Kind.HELLO, 3, ("addr", {})))  # valid, but not for a worker
    assert dropped(w) == len(BAD_MESSAGES) + 1
    # Well-formed but inapplicable (no such graph): dropped, counted against its sender.
    w.receive(wire.encode(Kind.START, COORDINATOR, (99, 0, None)))
    assert dropped(w, COORDINATOR) == 1
    assert w.take_commands() == []
    # A valid request is still answered, with the drops in the counters it reports.
    w.receive(wire.encode(Kind.COUNTERS, COORDINATOR, 42))
    (cmd,) = w.take_commands()
    assert (type(cmd), cmd.peer, cmd.channel) == (Send, COORDINATOR, wire.CONTROL)
    kind, _, (request_id, snapshot) = wire.decode(cmd.frames)
    assert (kind, request_id) == (Kind.COUNTERS, 42)
    assert snapshot[-2]["dropped"] == len(BAD_MESSAGES) + 1
    assert snapshot[COORDINATOR]["messages_received"] == 2


@settings(max_examples=200, deadline=None)
@given(frames=garbage)
def test_worker_never_raises_on_garbage(frames):
    w = fresh_worker()
    w.receive(frames)
    if decode_or_reject(frames) is None:
        assert dropped(w) == 1
