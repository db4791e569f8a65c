"""Channel: a named, keyed, weight-balanced producer/consumer queue (paper section 3.5).

A channel decouples control flow from data flow. Its central queue actor holds only small
entries: items larger than ``inline_bytes`` are ``ray.put`` by the producer and only their
ObjectRef goes through the queue, so the payload travels once, from the producer's object store
to the consumer. Smaller items ride inline (one extra copy through the queue costs less than an
object-store round trip).

Ordering and balancing:

* ``put(item, key=k)`` / ``get(key=k)``: FIFO per key, no balancing.
* ``put(item)`` / ``get()``: unkeyed items are dealt to consumers so that the total *weight*
  (env steps, tokens, ...) handed to each consumer stays balanced: when a consumer asks, the
  queue assigns items from the head of the shared FIFO, each to the registered consumer with the
  least weight so far, until one lands on the caller. A consumer registers with its first
  unkeyed ``get`` (or :meth:`Channel.register`) and starts at the current minimum weight. Items
  assigned to a consumer wait for that consumer; balance is traded for work conservation.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
from typing import Any, Hashable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinf_embodied.runtime import device as dev

INLINE_BYTES = 64 * 1024
"""Items whose tensors/arrays total at most this many bytes are sent inline through the queue
actor instead of the object store (Ray itself inlines task arguments below 100 KiB)."""

_ACTOR_PREFIX = "rlinf_channel:"
_recent_puts: set[str] = set()
_created: dict[str, Any] = {}  # keeps channels alive for the creating process's lifetime


class ChannelTimeout(TimeoutError):
    """A channel ``put`` or ``get`` did not complete within its timeout."""


def take_recent_puts() -> set[str]:
    """Names of the channels this process put into since the last call (and forget them).

    The device lock uses it to hand the device to consumers of what was just produced.
    """
    names = set(_recent_puts)
    _recent_puts.difference_update(names)
    return names


@dataclasses.dataclass
class _HostStaged:
    """An item whose accelerator tensors were copied to host; restored onto the consumer's device."""

    tree: Any


@dataclasses.dataclass
class _Entry:
    inline: bool
    data: Any  # the item itself, or [ObjectRef] (a list, so Ray passes the ref, not its value)
    weight: float


class _ChannelQueue:
    """The queue actor (async): FIFO per key, weight-balanced dealing of unkeyed items."""

    def __init__(self, name: str, maxsize: int, device: str | None, inline_bytes: int) -> None:
        self._config = dict(name=name, maxsize=maxsize, device=device, inline_bytes=inline_bytes)
        self._maxsize = maxsize
        self._cond = asyncio.Condition()
        self._keyed: dict[Hashable, collections.deque[_Entry]] = collections.defaultdict(
            collections.deque
        )
        self._pool: collections.deque[_Entry] = collections.deque()
        self._assigned: dict[str, collections.deque[_Entry]] = {}
        self._load: dict[str, float] = {}
        self._size = 0
        self._put_order: collections.deque[int] = collections.deque()
        self._next_ticket = 0

    def config(self) -> dict:
        return self._config

    def qsize(self) -> int:
        return self._size

    def loads(self) -> dict[str, float]:
        return dict(self._load)

    async def register(self, consumer: str) -> None:
        async with self._cond:
            self._register(consumer)

    def _register(self, consumer: str) -> None:
        if consumer not in self._load:
            self._load[consumer] = min(self._load.values(), default=0.0)
            self._assigned[consumer] = collections.deque()

    async def put(self, entry: _Entry, key: Hashable, timeout: float | None) -> bool:
        async with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._put_order.append(ticket)  # puts complete in arrival order, even when blocked
            has_room = lambda: self._put_order[0] == ticket and not self._full()  # noqa: E731
            if not await self._wait(has_room, timeout):
                self._put_order.remove(ticket)
                self._cond.notify_all()
                return False
            self._put_order.popleft()
            (self._pool if key is None else self._keyed[key]).append(entry)
            self._size += 1
            self._cond.notify_all()
            return True

    async def get(self, key: Hashable, consumer: str, timeout: float | None) -> _Entry | None:
        async with self._cond:
            if key is None:
                self._register(consumer)
            taken: list[_Entry] = []

            def ready() -> bool:
                entry = self._take(key, consumer)
                taken.extend([entry] if entry is not None else [])
                return bool(taken)

            if not await self._wait(ready, timeout):
                return None
            self._size -= 1
            self._cond.notify_all()
            return taken[0]

    def _full(self) -> bool:
        return 0 < self._maxsize <= self._size

    def _take(self, key: Hashable, consumer: str) -> _Entry | None:
        if key is not None:
            queue = self._keyed.get(key)
            return queue.popleft() if queue else None
        own = self._assigned[consumer]
        if own:
            return own.popleft()
        dealt_to_others = False
        while self._pool:
            entry = self._pool.popleft()
            target = min(self._load, key=lambda c: (self._load[c], c != consumer))
            self._load[target] += entry.weight
            if target == consumer:
                break
            self._assigned[target].append(entry)
            dealt_to_others = True
        else:
            entry = None
        if dealt_to_others:
            self._cond.notify_all()
        return entry

    async def _wait(self, predicate, timeout: float | None) -> bool:
        try:
            await asyncio.wait_for(self._cond.wait_for(predicate), timeout)
            return True
        except asyncio.TimeoutError:
            return False


_QueueActor = ray.remote(num_cpus=0)(_ChannelQueue)


class Channel:
    """Handle to a named channel; picklable, so pass it to workers or reconnect by name.

    Create one with :meth:`create` and reach it elsewhere with :meth:`connect` (or by pickling
    the handle). Items are any picklable structure (dicts, lists, tuples of torch tensors).

    Attributes:
        name: Channel name, unique within the Ray namespace.
        device: ``None`` (tensors keep their device kind: accelerator tensors arrive on the
            consumer's own accelerator) or ``"cpu"`` (accelerator tensors are moved to CPU by the
            producer, saving accelerator memory; paper section 3.5).
        maxsize: Items held before ``put`` blocks (<= 0: unbounded).
    """

    def __init__(self, name: str, actor, config: dict) -> None:
        self.name = name
        self._actor = actor
        self.device = config["device"]
        self.maxsize = config["maxsize"]
        self._inline_bytes = config["inline_bytes"]

    @classmethod
    def create(
        cls,
        name: str,
        *,
        maxsize: int = 0,
        device: str | None = None,
        inline_bytes: int = INLINE_BYTES,
    ) -> "Channel":
        """Create the channel's queue actor (on the caller's node) and return a handle.

        The channel lives until :meth:`delete` or until the creating process exits.

        Args:
            name: Unique channel name.
            maxsize: Back-pressure bound in items; <= 0 means unbounded.
            device: ``None`` or ``"cpu"``, see the class docstring.
            inline_bytes: Payload size (bytes) up to which items travel inline.

        Raises:
            ValueError: If ``device`` is not None/"cpu" or a channel with this name exists.
        """
        if device not in (None, "cpu"):
            raise ValueError(f"Channel device must be None or 'cpu' (got {device!r}).")
        config = dict(name=name, maxsize=maxsize, device=device, inline_bytes=inline_bytes)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        try:
            actor = _QueueActor.options(
                name=_ACTOR_PREFIX + name, scheduling_strategy=here, max_concurrency=4096
            ).remote(**config)
        except ValueError as err:
            raise ValueError(
                f"Channel {name!r} already exists; use Channel.connect({name!r}) to reach it or "
                f"choose another name."
            ) from err
        _created[name] = actor
        return cls(name, actor, config)

    @classmethod
    def connect(cls, name: str) -> "Channel":
        """Handle to an existing channel.

        Raises:
            ValueError: If no channel with this name exists (in this Ray namespace).
        """
        try:
            actor = ray.get_actor(_ACTOR_PREFIX + name)
        except ValueError as err:
            raise ValueError(
                f"No channel named {name!r}; create it first with Channel.create({name!r})."
            ) from err
        return cls(name, actor, ray.get(actor.config.remote()))

    def __reduce__(self):
        config = dict(device=self.device, maxsize=self.maxsize, inline_bytes=self._inline_bytes)
        return (Channel, (self.name, self._actor, config))

    # ---- producer side ---------------------------------------------------------------------

    def put(
        self, item: Any, key: Hashable | None = None, weight: float = 1.0, timeout: float | None = None
    ) -> None:
        """Enqueue ``item``; blocks while the channel holds ``maxsize`` items.

        Args:
            item: Any picklable structure; tensors may be on CPU or an accelerator.
            key: Route to consumers calling ``get(key)``; None for balanced dealing.
            weight: Load of the item (env steps, tokens) used to balance unkeyed consumers.
            timeout: Seconds to wait for room; None waits forever.

        Raises:
            ChannelTimeout: If no room was free within ``timeout``.
        """
        if not ray.get(self.put_async(item, key, weight, timeout)):
            raise ChannelTimeout(
                f"Channel {self.name!r} stayed full ({self.maxsize} items) for {timeout} s; "
                f"consume faster, raise maxsize or the timeout."
            )

    def put_async(
        self, item: Any, key: Hashable | None = None, weight: float = 1.0, timeout: float | None = None
    ) -> ray.ObjectRef:
        """Non-blocking :meth:`put`; the payload is already in the object store on return.

        Returns:
            An ObjectRef (awaitable, usable with ``ray.wait``) of a bool: True once enqueued,
            False if ``timeout`` expired first.
        """
        _recent_puts.add(self.name)
        return self._actor.put.remote(self._pack(item, weight), key, timeout)

    def _pack(self, item: Any, weight: float) -> _Entry:
        if dev.has_accelerator_tensors(item):
            item = dev.to_host(item)
            item = item if self.device == "cpu" else _HostStaged(item)
        if dev.payload_nbytes(item, unknown=self._inline_bytes + 1) <= self._inline_bytes:
            return _Entry(True, item, weight)
        return _Entry(False, [ray.put(item)], weight)

    # ---- consumer side ---------------------------------------------------------------------

    def get(self, key: Hashable | None = None, timeout: float | None = None, consumer: str | None = None) -> Any:
        """Dequeue the next item for ``key`` (FIFO), or a weight-balanced unkeyed item.

        Args:
            key: The key given to ``put``; None takes unkeyed items.
            timeout: Seconds to wait for an item; None waits forever.
            consumer: Identity for balancing; defaults to the calling actor (or driver process).

        Raises:
            ChannelTimeout: If no item arrived within ``timeout``.
        """
        entry = ray.get(self._request(key, timeout, consumer))
        return self._unpack(entry, ray.get(entry.data[0]) if entry and not entry.inline else None, timeout)

    async def get_async(
        self, key: Hashable | None = None, timeout: float | None = None, consumer: str | None = None
    ) -> Any:
        """Awaitable :meth:`get` for async actors and asyncio code."""
        entry = await self._request(key, timeout, consumer)
        payload = await entry.data[0] if entry and not entry.inline else None
        return self._unpack(entry, payload, timeout)

    def register(self, consumer: str | None = None) -> None:
        """Join the balanced (unkeyed) consumers before the first ``get``."""
        ray.get(self._actor.register.remote(consumer or _consumer_id()))

    def _request(self, key, timeout, consumer) -> ray.ObjectRef:
        return self._actor.get.remote(key, consumer or _consumer_id(), timeout)

    def _unpack(self, entry: _Entry | None, payload: Any, timeout: float | None) -> Any:
        if entry is None:
            raise ChannelTimeout(f"No item arrived on channel {self.name!r} within {timeout} s.")
        item = entry.data if entry.inline else payload
        if isinstance(item, _HostStaged):
            item = dev.to_worker_device(item.tree, dev.process_devices())
        return item

    def delete(self) -> None:
        """Destroy the channel (its queue actor and queued items); handles stop working."""
        _created.pop(self.name, None)
        ray.kill(self._actor, no_restart=True)

    # ---- introspection ---------------------------------------------------------------------

    def qsize(self) -> int:
        """Items currently held (keyed, unassigned and assigned-but-not-taken)."""
        return ray.get(self._actor.qsize.remote())

    def loads(self) -> dict[str, float]:
        """Total weight dealt to each registered unkeyed consumer."""
        return ray.get(self._actor.loads.remote())

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, maxsize={self.maxsize}, device={self.device!r})"


_consumer_cache: list[str] = []


def _consumer_id() -> str:
    if not _consumer_cache:
        actor_id = ray.get_runtime_context().get_actor_id()
        _consumer_cache.append(actor_id or f"driver-{os.getpid()}")
    return _consumer_cache[0]
