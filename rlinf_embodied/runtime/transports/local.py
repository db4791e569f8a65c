"""Same process: the item itself is handed to this process's endpoint inbox (no copy, no
serialisation; accelerator tensors stay where they are unless the channel keeps items on CPU)."""

from __future__ import annotations

import time
from typing import Any, Hashable

from rlinf_embodied.runtime.transports.base import Address, Connection
from rlinf_embodied.runtime.transports.endpoint import endpoint


class LocalConnection(Connection):
    """Hand-over to a consumer in this process (``address`` is this process's endpoint)."""

    def __init__(self, address: Address, channel: str, instance: str) -> None:
        self._endpoint = endpoint()
        self._instance = instance

    def send(self, key: Hashable, item: Any, timeout: float | None) -> bool:
        """Put ``item`` in the inbox; without ``timeout`` wait as long as the channel's share
        here is full, else give up (False) after ``timeout`` s."""
        ep, instance = self._endpoint, self._instance
        if timeout is None:
            ep.deliver(instance, key, item)
            return True
        deadline = time.monotonic() + timeout
        while ep.maxsize(instance) > 0 and ep.held(instance) >= ep.maxsize(instance):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        ep.deliver(instance, key, item)
        return True
