"""VirtualTimeLoop: asyncio on a virtual clock. Virtual times are asserted exactly; wall time
never (pytest-timeout guards against hangs)."""

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pathways.sim.virtual_loop
from pathways.sim import SimulationStalled, VirtualTimeLoop, run
from plaque.transport import DATA, InprocTransport

pytestmark = pytest.mark.timeout(30)
VIRTUAL_LOOP = Path(pathways.sim.virtual_loop.__file__)


def now() -> float:
    return asyncio.get_running_loop().time()


def test_hour_long_sleep_takes_an_hour_of_virtual_time():
    async def main():
        await asyncio.sleep(3600)
        return now(), asyncio.get_running_loop().virtual_elapsed

    assert run(main()) == (3600.0, 3600.0)


def test_sleep_longer_than_asyncios_select_cap_lands_exactly():
    # asyncio never selects for more than a day at once: several jumps, one exact deadline
    async def main():
        await asyncio.sleep(10**6 + 0.1)
        return now()

    assert run(main(), start=5.0) == 5.0 + 10**6 + 0.1


def test_start_time_and_elapsed():
    async def main():
        await asyncio.sleep(2.5)
        return now(), asyncio.get_running_loop().virtual_elapsed

    assert run(main(), start=100.0) == (102.5, 2.5)


def _fire_order(loop, whens):
    """Schedule ``call_at(base + when)`` for each, run until all fired; (index, fired at)."""
    fired = []
    base = loop.time()
    done = loop.create_future()
    for i, when in enumerate(whens):
        def cb(i=i):
            fired.append((i, loop.time()))
            if len(fired) == len(whens):
                done.set_result(None)

        loop.call_at(base + when, cb)
    loop.run_until_complete(done)  # no wait_for: its timer would join the heap mid-run
    return base, fired


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=25))
def test_timer_order_matches_stock_asyncio(ticks):
    """Same call_at sequence: same firing order as a stock loop (ties included: asyncio orders
    them by its heap, not FIFO), and each timer fires at exactly its deadline in virtual
    time. Only these timers are in the heap, so real time cannot reorder the stock loop."""
    whens = [t * 0.001 for t in ticks]
    virtual = VirtualTimeLoop(start=7.0)
    stock = asyncio.new_event_loop()
    try:
        base, fired = _fire_order(virtual, whens)
        _, stock_fired = _fire_order(stock, whens)
    finally:
        virtual.close()
        stock.close()
    assert [i for i, _ in fired] == [i for i, _ in stock_fired]
    assert all(at == base + whens[i] for i, at in fired)
    assert [at for _, at in fired] == sorted(at for _, at in fired)


def test_wait_for_and_timeout_fire_in_virtual_time():
    async def main():
        never = asyncio.get_running_loop().create_future()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(never, 30)
        first = now()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.25):
                await asyncio.sleep(100)
        return first, now()

    assert run(main()) == (30.0, 30.25)


def test_call_soon_callbacks_run_before_time_advances():
    seen = []

    async def main():
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, lambda: seen.append(("timer", loop.time())))

        def chain(n):
            seen.append(("soon", loop.time()))
            if n:
                loop.call_soon(chain, n - 1)

        loop.call_soon(chain, 99)
        await asyncio.sleep(2)

    run(main())
    assert seen == [("soon", 0.0)] * 100 + [("timer", 1.0)]


def test_socketpair_delivers_data_with_add_reader():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)

    async def main():
        loop = asyncio.get_running_loop()
        got = loop.create_future()
        loop.add_reader(b, lambda: got.done() or got.set_result((b.recv(100), loop.time())))
        loop.call_later(5.0, a.send, b"hello")
        try:
            return await asyncio.wait_for(got, 60)
        finally:
            loop.remove_reader(b)

    try:
        assert run(main()) == (b"hello", 5.0)
    finally:
        a.close()
        b.close()


def test_future_nobody_resolves_raises_stalled():
    async def main():
        await asyncio.get_running_loop().create_future()

    async def named():
        await asyncio.sleep(1)
        await asyncio.create_task(main(), name="waits-forever")

    with pytest.raises(SimulationStalled, match="t=1.000000s.*waits-forever"):
        run(named(), stall_timeout=0.2)


def test_zero_stall_timeout_raises_at_once_and_loop_stays_usable():
    loop = VirtualTimeLoop(stall_timeout=0)
    try:
        with pytest.raises(SimulationStalled):
            loop.run_until_complete(loop.create_future())
        assert loop.run_until_complete(asyncio.sleep(3, "ok")) == "ok"
        assert loop.time() == 3.0
    finally:
        loop.close()


def test_stall_wait_is_woken_by_another_thread(threads):
    """With nothing scheduled, the loop still waits (up to stall_timeout) for threadsafe calls."""
    loop = VirtualTimeLoop(stall_timeout=20)
    fut = loop.create_future()
    threads(lambda: (time.sleep(0.05), loop.call_soon_threadsafe(fut.set_result, "woken")))
    try:
        assert loop.run_until_complete(fut) == "woken"
        assert loop.time() == 0.0
    finally:
        loop.close()


def test_advance_charges_cpu_and_late_timers_fire_after_it():
    seen = []

    async def main():
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, lambda: seen.append(loop.time()))
        loop.advance(0.5)  # a handler that used half a second of CPU
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        with pytest.raises(ValueError):
            loop.advance(-1.0)
        return now()

    assert run(main()) == 0.5
    assert seen == [0.5]


def test_queue_pipeline_completes_at_exact_virtual_time():
    """Producer sleeps 0.5 per item, consumer 0.75: the consumer is the bottleneck."""

    async def main():
        queue = asyncio.Queue(maxsize=2)
        done = []

        async def producer():
            for i in range(10):
                await asyncio.sleep(0.5)
                await queue.put(i)

        async def consumer():
            for _ in range(10):
                item = await queue.get()
                await asyncio.sleep(0.75)
                done.append((item, now()))

        await asyncio.gather(producer(), consumer())
        return done

    done = run(main())
    assert [i for i, _ in done] == list(range(10))
    assert done[-1][1] == 0.5 + 10 * 0.75


def test_plaque_inproc_transport_ping_pong_in_virtual_time():
    """Two Plaque in-process endpoints on one virtual loop; each side answers after 0.25 s."""

    async def main():
        loop = asyncio.get_running_loop()
        a, b = InprocTransport(), InprocTransport()
        a.connect(1, b.address)
        b.connect(0, a.address)
        finished = loop.create_future()

        def on_b(channel, frames):
            loop.call_later(0.25, b.send, 0, channel, frames)

        def on_a(channel, frames):
            n = int(frames[0])
            if n == 10:
                finished.set_result(now())
            else:
                loop.call_later(0.25, a.send, 1, DATA, [str(n + 1).encode()])

        a.start(loop, on_a)
        b.start(loop, on_b)
        try:
            a.send(1, DATA, [b"0"])
            return await asyncio.wait_for(finished, 100)
        finally:
            a.close()
            b.close()

    assert run(main()) == 0.25 + 10 * 0.5  # a hears n at 0.25 + 0.5 n


def test_uvloop_is_not_required():
    """The module runs with uvloop unimportable (loaded by path: the pathways package itself
    imports uvloop for the production roles)."""
    code = (
        "import sys, asyncio, importlib.util\n"
        "sys.modules['uvloop'] = None\n"
        f"spec = importlib.util.spec_from_file_location('vl', {str(VIRTUAL_LOOP)!r})\n"
        "vl = importlib.util.module_from_spec(spec); spec.loader.exec_module(vl)\n"
        "print(vl.run(asyncio.sleep(60, 'done')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"
