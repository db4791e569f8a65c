"""The queue actor behind every channel (paper section 3.5): the control plane and the path of
unbound keys and unkeyed items.

It keeps a FIFO per key and one shared FIFO of unkeyed items, which it deals to the registered
consumers so that the total weight each one received stays balanced; it applies each
producer's puts in the order they were made, records where bound keys go (their consumer's
address, metadata only) and serves cancellable read-ahead gets. It holds small entries only:
an item's payload is inline or an ObjectRef (see :class:`~rlinf_embodied.runtime.channel.Channel`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any, Hashable

import ray


@dataclasses.dataclass
class Entry:
    """One queued item: its payload (inline, or a ref to it in the object store) and weight."""

    inline: bool
    data: Any  # the item itself, or [ObjectRef] (a list, so Ray passes the ref, not its value)
    weight: float


class ChannelQueue:
    """The queue actor (async): FIFO per key, weight-balanced dealing of unkeyed items."""

    def __init__(
        self, name: str, maxsize: int, device: str | None, inline_bytes: int, instance: str
    ) -> None:
        self._config = dict(
            name=name, maxsize=maxsize, device=device, inline_bytes=inline_bytes, instance=instance
        )
        self._maxsize = maxsize
        self._cond = asyncio.Condition()
        self._keyed: dict[Hashable, collections.deque[Entry]] = collections.defaultdict(
            collections.deque
        )
        self._pool: collections.deque[Entry] = collections.deque()
        self._assigned: dict[str, collections.deque[Entry]] = {}
        self._load: dict[str, float] = {}
        self._size = 0
        # Ray may start an async actor's calls out of submission order, so each producer
        # numbers its puts and they are applied in that order.
        self._next_seq: dict[str, int] = collections.defaultdict(int)
        self._abandoned: dict[str, set[int]] = collections.defaultdict(set)
        self._requests: dict[str, asyncio.Task] = {}  # read-ahead gets, cancellable by id
        self._cancelled: set[str] = set()  # cancels that arrived before their get
        self._routes: dict[Hashable, Any] = {}  # bound key -> transports.base.Address of its consumer
        self._queued_keys: set[Hashable] = set()  # keys producers were told to queue here

    def config(self) -> dict:
        return self._config

    def qsize(self) -> int:
        return self._size

    def loads(self) -> dict[str, float]:
        return dict(self._load)

    def bind(self, key: Hashable, address) -> str | None:
        """Route ``key`` to the consumer at ``address``; an error message if it is too late."""
        if key in self._queued_keys or self._keyed.get(key):
            return (f"Channel {self._config['name']!r}: key {key!r} already carries items through "
                    f"the queue; bind it before the first put (e.g. in the consumer's __init__).")
        self._routes[key] = address
        return None

    def route(self, key: Hashable):
        """Where items of ``key`` go: its consumer's address, or None (through this queue)."""
        address = self._routes.get(key)
        if address is None:
            self._queued_keys.add(key)
        return address

    async def register(self, consumer: str) -> None:
        async with self._cond:
            self._register(consumer)

    def _register(self, consumer: str) -> None:
        if consumer not in self._load:
            self._load[consumer] = min(self._load.values(), default=0.0)
            self._assigned[consumer] = collections.deque()

    async def put(
        self, entry: Entry, key: Hashable, producer: str, seq: int, timeout: float | None
    ) -> bool:
        async with self._cond:
            my_turn = lambda: self._next_seq[producer] == seq and not self._full()  # noqa: E731
            accepted = await self._wait(my_turn, timeout)
            if accepted:
                (self._pool if key is None else self._keyed[key]).append(entry)
                self._size += 1
            if self._next_seq[producer] == seq:
                self._advance(producer)
            else:  # timed out behind an earlier put of the same producer: skip this number
                self._abandoned[producer].add(seq)
            self._cond.notify_all()
            return accepted

    def _advance(self, producer: str) -> None:
        self._next_seq[producer] += 1
        while self._next_seq[producer] in self._abandoned[producer]:
            self._abandoned[producer].remove(self._next_seq[producer])
            self._next_seq[producer] += 1

    async def get(
        self, key: Hashable, consumer: str, timeout: float | None, request_id: str | None = None
    ) -> Entry | None:
        if request_id in self._cancelled:
            self._cancelled.discard(request_id)
            return None
        if request_id is not None:
            self._requests[request_id] = asyncio.current_task()
        try:
            async with self._cond:
                if key is None:
                    self._register(consumer)
                taken: list[Entry] = []

                def ready() -> bool:
                    entry = self._take(key, consumer)
                    taken.extend([entry] if entry is not None else [])
                    return bool(taken)

                if not await self._wait(ready, timeout):
                    return None
                self._size -= 1
                self._cond.notify_all()
                return taken[0]
        except asyncio.CancelledError:  # a read-ahead withdrawn by cancel(): nothing was taken
            return None
        finally:
            self._requests.pop(request_id, None)

    async def cancel(self, request_id: str) -> None:
        task = self._requests.get(request_id)
        if task is not None:
            task.cancel()
        else:  # the get has not started (or has finished; then this entry is never read)
            self._cancelled.add(request_id)

    async def unget(self, entry: Entry, key: Hashable, consumer: str) -> None:
        """Return an entry a consumer took but will not use to the head of its queue."""
        async with self._cond:
            if key is None:
                self._load[consumer] -= entry.weight
                self._pool.appendleft(entry)
            else:
                self._keyed[key].appendleft(entry)
            self._size += 1
            self._cond.notify_all()

    def _full(self) -> bool:
        return 0 < self._maxsize <= self._size

    def _take(self, key: Hashable, consumer: str) -> Entry | None:
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


QueueActor = ray.remote(num_cpus=0)(ChannelQueue)
"""The Ray actor class of :class:`ChannelQueue` (it takes no CPU: it only moves metadata)."""
