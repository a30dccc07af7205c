"""The transport conformance suite (``plaque.testing.TransportConformance``), run against the
in-process transport and ZeroMQ over tcp and ipc."""

from plaque.testing import TransportConformance
from plaque.transport import InprocTransport
from plaque.zmq_transport import ZmqTransport


class TestInproc(TransportConformance):
    # In-process delivery is one loop callback per send in call order, so control comes
    # right after the data queued before it.
    control_overtakes_data = False

    def make_transport(self):
        return InprocTransport()


class ZmqConformance(TransportConformance):
    # Separate sockets per channel and a receiver that drains control first.
    control_overtakes_data = True
    bind = "tcp://127.0.0.1"

    def make_transport(self):
        return ZmqTransport(self.bind)

    def make_small_queue_transport(self):
        # A tiny high-water mark makes ZeroMQ sends hit EAGAIN, so most messages wait in the
        # transport's own backlog.
        return ZmqTransport(self.bind, hwm=4)

    def queued_locally(self, transport):
        return transport.backlogged()


class TestZmqTcp(ZmqConformance):
    bind = "tcp://127.0.0.1"


class TestZmqIpc(ZmqConformance):
    bind = "ipc"
