"""Selection by placement: which transport carries a bound key's items from this producer
(:func:`choose`), and this process's :class:`Sender`, which keeps one connection per (channel
instance, consumer endpoint, transport)."""

from __future__ import annotations

import os
import threading
from typing import Any, Hashable

from rlinf_embodied.runtime.transports.base import (
    LOCAL,
    REMOTE,
    SAME_NODE,
    Address,
    Connection,
    ConsumerGone,
)
from rlinf_embodied.runtime.transports.endpoint import endpoint_token
from rlinf_embodied.runtime.transports.local import LocalConnection
from rlinf_embodied.runtime.transports.remote import TcpConnection
from rlinf_embodied.runtime.transports.same_node import UnixConnection

CONNECTIONS: dict[str, type[Connection]] = {
    LOCAL: LocalConnection,
    SAME_NODE: UnixConnection,
    REMOTE: TcpConnection,
}
"""The connection class of each transport kind."""


def choose(producer_node: str, consumer: Address, force: str | None = None) -> str:
    """The transport between a producer on ``producer_node`` and ``consumer``.

    Returns:
        ``"local"`` (same process), ``"same_node"`` or ``"remote"``; ``force`` (tests,
        benchmarks) overrides a same-node choice with ``"remote"`` (TCP on one machine).
    """
    if consumer.pid == os.getpid() and consumer.token == endpoint_token():
        return LOCAL
    if force == REMOTE or consumer.node_id != producer_node:
        return REMOTE
    return SAME_NODE


class Sender:
    """This process's outgoing connections, one per (channel instance, consumer endpoint)."""

    def __init__(self) -> None:
        self._conns: dict[tuple[str, str, str], Connection] = {}
        self._lock = threading.Lock()

    def send(self, channel: str, instance: str, address: Address, transport: str, key: Hashable,
             item: Any, timeout: float | None) -> bool:
        """Deliver ``item`` to the bound consumer at ``address``.

        Returns:
            False if the consumer's share of a bounded channel stayed full for ``timeout`` s.

        Raises:
            ConsumerGone: the consumer cannot be reached (the connection is dropped).
        """
        slot = (instance, address.token, transport)
        with self._lock:
            conn = self._conns.get(slot)
            if conn is None:
                conn = self._conns[slot] = CONNECTIONS[transport](address, channel, instance)
        try:
            return conn.send(key, item, timeout)
        except ConsumerGone:
            with self._lock:
                self._conns.pop(slot, None)
            conn.close()
            raise

    def forget(self, instance: str) -> None:
        """Close this process's connections of a channel instance."""
        with self._lock:
            for slot in [s for s in self._conns if s[0] == instance]:
                self._conns.pop(slot).close()


sender = Sender()
