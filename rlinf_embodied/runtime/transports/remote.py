"""Other node: a TCP connection to the consumer's endpoint, every buffer in the stream (the
framing of :mod:`~rlinf_embodied.runtime.transports.wire`). Also used on one node when a test or
benchmark forces the cross-node path."""

from __future__ import annotations

import socket

from rlinf_embodied.runtime.transports.base import Address
from rlinf_embodied.runtime.transports.wire import StreamConnection


class TcpConnection(StreamConnection):
    """A connection to a consumer's endpoint through TCP (Nagle off: messages go out at once).

    Raises:
        ConsumerGone: If the consumer cannot be reached.
    """

    def __init__(self, address: Address, channel: str, instance: str) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().__init__(sock, (address.host, address.port), channel, instance)
