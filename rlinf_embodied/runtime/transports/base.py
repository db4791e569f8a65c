"""The transport interface: the three kinds of direct path, a bound consumer's address, the
connection every transport implements and the error a lost consumer raises.

:mod:`~rlinf_embodied.runtime.transports.router` picks the kind by placement and opens the
kind's connection: :mod:`~rlinf_embodied.runtime.transports.local` (same process),
:mod:`~rlinf_embodied.runtime.transports.same_node` (Unix socket and shared memory) or
:mod:`~rlinf_embodied.runtime.transports.remote` (TCP).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Hashable

LOCAL = "local"
SAME_NODE = "same_node"
REMOTE = "remote"


class ConsumerGone(ConnectionError):
    """The process bound to a key is unreachable (exited, crashed)."""


@dataclasses.dataclass(frozen=True)
class Address:
    """Where a bound consumer can be reached (what the queue actor stores per bound key).

    Attributes:
        node_id: Ray node id (hex) of the consumer's node.
        pid: Consumer process id.
        token: Unique per endpoint (a restarted process gets a new one).
        unix: Abstract Unix-socket name (same node).
        host: IP address of the consumer's node; ``port``: its TCP port (other nodes).
    """

    node_id: str
    pid: int
    token: str
    unix: str
    host: str
    port: int


class Connection(abc.ABC):
    """One producer -> consumer stream of one channel instance (messages keep their order).

    Each transport module defines one, constructed as ``cls(address, channel, instance)``:
    ``address`` is the consumer's :class:`Address`, ``channel`` the channel's name (for error
    messages) and ``instance`` the channel instance whose items the consumer receives.
    """

    @abc.abstractmethod
    def send(self, key: Hashable, item: Any, timeout: float | None) -> bool:
        """Send one message; False if nothing could be sent within ``timeout`` (full consumer).

        Raises:
            ConsumerGone: The consumer cannot be reached.
        """

    def close(self) -> None:
        """Release what the connection holds (default: nothing)."""
