"""Channel: a named, keyed, weight-balanced producer/consumer queue (paper section 3.5).

A channel decouples control flow from data flow, and its transport follows placement. A consumer
that *binds* a key (:meth:`Channel.bind`, before the first put) receives that key's items
directly: handed over in its own process, through a Unix socket and shared memory from another
process of its node, through TCP from another node (:mod:`rlinf_embodied.runtime.transports`);
the queue actor only records where the key goes. This is the data path of the training
workflow (every key there has one known consumer).

Unbound keys and unkeyed (balanced) items go through the central queue actor
(:mod:`rlinf_embodied.runtime.channel_queue`), which holds only small entries: items larger than
``inline_bytes`` are ``ray.put`` by the producer and only their ObjectRef goes through the queue,
so the payload travels once, from the producer's object store to the consumer. Smaller items
ride inline (one extra copy through the queue costs less than an object-store round trip).

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
import itertools
import os
import uuid
from typing import Any, Hashable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinf_embodied.runtime import device as dev
from rlinf_embodied.runtime import inflight
from rlinf_embodied.runtime.channel_queue import Entry, QueueActor
from rlinf_embodied.runtime.transports import router
from rlinf_embodied.runtime.transports.base import LOCAL, ConsumerGone
from rlinf_embodied.runtime.transports.endpoint import endpoint, has_endpoint

INLINE_BYTES = 64 * 1024
"""Items whose tensors/arrays total at most this many bytes are sent inline through the queue
actor instead of the object store (Ray itself inlines task arguments below 100 KiB)."""

_ACTOR_PREFIX = "rlinf_channel:"
_created: dict[str, Any] = {}  # keeps channels alive for the creating process's lifetime


class ChannelTimeout(TimeoutError):
    """A channel ``put`` or ``get`` did not complete within its timeout."""


@dataclasses.dataclass
class _HostStaged:
    """An item whose accelerator tensors were copied to host; restored onto the consumer's device."""

    tree: Any


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

    def __init__(self, name: str, actor, config: dict, prefetch: bool = False) -> None:
        self.name = name
        self._actor = actor
        self.device = config["device"]
        self.maxsize = config["maxsize"]
        self._inline_bytes = config["inline_bytes"]
        self._instance = config["instance"]
        self.prefetch = prefetch

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
        config = dict(
            name=name,
            maxsize=maxsize,
            device=device,
            inline_bytes=inline_bytes,
            instance=uuid.uuid4().hex,  # numbers puts per channel instance, not per name
        )
        # Hard affinity to the creator's node (alive: the creator runs there): a soft one may
        # spill to another node, even one that just died and that Ray still lists as alive.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        try:
            actor = QueueActor.options(
                name=_ACTOR_PREFIX + name, scheduling_strategy=here, max_concurrency=4096
            ).remote(**config)
        except ValueError as err:
            raise ValueError(
                f"Channel {name!r} already exists; use Channel.connect({name!r}) to reach it or "
                f"choose another name."
            ) from err
        ray.get(actor.qsize.remote())  # started: the first put does not pay for it
        _created[name] = actor
        return cls(name, actor, config)

    @classmethod
    def connect(cls, name: str, prefetch: bool = False) -> "Channel":
        """Handle to an existing channel.

        Args:
            name: The channel's name.
            prefetch: Consumer read-ahead: after each ``get`` the next request is already
                issued, hiding the queue round trip in consumer loops. Outstanding read-aheads
                are withdrawn (items returned to the queue) when a worker method returns, or by
                :func:`~rlinf_embodied.runtime.inflight.release_prefetched` in the driver.

        Raises:
            ValueError: If no channel with this name exists (in this Ray namespace).
        """
        try:
            actor = ray.get_actor(_ACTOR_PREFIX + name)
        except ValueError as err:
            raise ValueError(
                f"No channel named {name!r}; create it first with Channel.create({name!r})."
            ) from err
        return cls(name, actor, ray.get(actor.config.remote()), prefetch)

    def with_prefetch(self, prefetch: bool = True) -> "Channel":
        """A handle to the same channel with consumer read-ahead on or off (see :meth:`connect`)."""
        return Channel(self.name, self._actor, self._config(), prefetch)

    def _config(self) -> dict:
        return dict(
            device=self.device,
            maxsize=self.maxsize,
            inline_bytes=self._inline_bytes,
            instance=self._instance,
        )

    def __reduce__(self):
        return (Channel, (self.name, self._actor, self._config(), self.prefetch))

    # ---- producer side ---------------------------------------------------------------------

    def put(
        self, item: Any, key: Hashable | None = None, weight: float = 1.0, timeout: float | None = None
    ) -> None:
        """Enqueue ``item``; blocks while the channel is full.

        A key bound by its consumer (:meth:`bind`) goes straight to that process (see
        :mod:`rlinf_embodied.runtime.transports`); the put returns once the item is on its way.
        Other items go through the queue actor; without a timeout that put is pipelined, with at
        most ``PUT_PIPELINE`` puts of this process unacknowledged (see
        :func:`~rlinf_embodied.runtime.inflight.flush_puts`).
        Items from one process keep their order per key.

        Args:
            item: Any picklable structure; tensors may be on CPU or an accelerator.
            key: Route to consumers calling ``get(key)``; None for balanced dealing.
            weight: Load of the item (env steps, tokens) used to balance unkeyed consumers.
            timeout: Seconds to wait for room; None waits as long as needed. With a timeout
                the put is synchronous.

        Raises:
            ChannelTimeout: If no room was free within ``timeout``.
            RuntimeError: If the process bound to ``key`` is gone (the message names the
                channel and the key).
        """
        address = self._route(key)
        if address is not None:
            if not self._put_direct(item, key, address, timeout):
                raise self._full_error(timeout)
            return
        ref = self.put_async(item, key, weight, timeout)
        if timeout is None:
            inflight.pipeline_put(self.name, ref)
            return
        if not ray.get(ref):
            raise self._full_error(timeout)

    def _full_error(self, timeout: float | None) -> ChannelTimeout:
        return ChannelTimeout(
            f"Channel {self.name!r} stayed full ({self.maxsize} items) for {timeout} s; "
            f"consume faster, raise maxsize or the timeout."
        )

    def put_async(
        self, item: Any, key: Hashable | None = None, weight: float = 1.0, timeout: float | None = None
    ) -> ray.ObjectRef:
        """Non-blocking :meth:`put`; the payload is already on its way on return (a bound key's
        item has been handed to its transport).

        Returns:
            An ObjectRef (awaitable, usable with ``ray.wait``) of a bool: True once enqueued,
            False if ``timeout`` expired first.
        """
        address = self._route(key)
        if address is not None:
            return ray.put(self._put_direct(item, key, address, timeout))
        inflight.note_put(self.name)
        seq = next(_put_seq[self._instance])
        return self._actor.put.remote(self._pack(item, weight), key, _producer_id(), seq, timeout)

    def _route(self, key: Hashable | None):
        """The bound consumer's address of ``key`` (looked up once per process), or None."""
        if key is None:
            return None
        slot = (self._instance, key)
        if slot not in _routes:
            _routes[slot] = ray.get(self._actor.route.remote(key))
        return _routes[slot]

    def _put_direct(self, item: Any, key: Hashable, address, timeout: float | None) -> bool:
        inflight.note_put(self.name)
        for attempt in range(2):
            kind = router.choose(_node_id(), address, transport_override[0])
            payload = self._stage(item) if kind != LOCAL or self.device == "cpu" else item
            try:
                return router.sender.send(self.name, self._instance, address, kind, key, payload, timeout)
            except ConsumerGone as err:
                fresh = ray.get(self._actor.route.remote(key))  # a restarted consumer re-binds
                if attempt or fresh is None or fresh == address:
                    raise RuntimeError(
                        f"Channel {self.name!r}: the consumer bound to key {key!r} (process "
                        f"{address.pid}) cannot be reached ({err}); the item is lost. Restart the "
                        f"consumer (it binds the key again) or delete the channel."
                    ) from err
                _routes[(self._instance, key)] = address = fresh
        return False  # not reached

    def _stage(self, item: Any) -> Any:
        """Accelerator tensors to host (restored on the consumer's device unless device='cpu')."""
        item, moved = dev.staged_to_host(item)
        return _HostStaged(item) if moved and self.device != "cpu" else item

    def _pack(self, item: Any, weight: float) -> Entry:
        item = self._stage(item)
        if dev.payload_nbytes(item, unknown=self._inline_bytes + 1) <= self._inline_bytes:
            return Entry(True, item, weight)
        return Entry(False, [ray.put(item)], weight)

    def bind(self, key: Hashable, caller_reads: bool = False) -> None:
        """Receive the items of ``key`` in this process, directly from their producers.

        Call it in the consumer before anyone puts to ``key`` (e.g. in a worker's
        ``__init__``); producers then skip the queue actor and the object store (the transport
        follows placement, see :mod:`rlinf_embodied.runtime.transports`). A restarted consumer
        may bind the key again. Items wait in this process until :meth:`get`; with a maxsize,
        at most maxsize items of this channel wait here and producers block beyond that.

        Args:
            key: The key whose items come here.
            caller_reads: The thread that calls ``get`` reads the producers' sockets itself
                (no reader thread and hand-off: the fast path of a request/reply loop). Items
                then wait in the kernel's socket buffers until a ``get`` (a few MiB per producer;
                beyond that producers block), so use it where the consumer always comes back
                for its items soon; every key of a channel bound in one process is bound the
                same way.

        Raises:
            ValueError: If ``key`` is None (unkeyed items are dealt by the queue), items of it
                already went through the queue, or another key of the channel was bound here
                with the other ``caller_reads``.
        """
        if key is None:
            raise ValueError(f"Channel {self.name!r}: bind a key; unkeyed items are dealt by the queue.")
        ep = endpoint()
        ep.expect(self._instance, self.maxsize, caller_reads)
        error = ray.get(self._actor.bind.remote(key, ep.address))
        if error:
            raise ValueError(error)
        _bound.add((self._instance, key))

    # ---- consumer side ---------------------------------------------------------------------

    def get(
        self, key: Hashable | None = None, timeout: float | None = None, consumer: str | None = None
    ) -> Any:
        """Dequeue the next item for ``key`` (FIFO), or a weight-balanced unkeyed item.

        Args:
            key: The key given to ``put``; None takes unkeyed items.
            timeout: Seconds to wait for an item; None waits forever.
            consumer: Identity for balancing; defaults to the calling actor (or driver process).

        Raises:
            ChannelTimeout: If no item arrived within ``timeout``.
        """
        if (self._instance, key) in _bound:
            return self._take_bound(key, timeout)
        slot, pending = self._slot(key, consumer)
        if pending is None:
            entry = ray.get(self._actor.get.remote(key, slot[2], timeout))  # queue-side timeout
        else:
            try:
                entry = ray.get(pending.ref, timeout=timeout)
            except ray.exceptions.GetTimeoutError:
                entry = self._keep_read_ahead(slot, pending)
        self._accept(slot, entry, timeout)
        return self._restore(entry.data if entry.inline else ray.get(entry.data[0]))

    async def get_async(
        self, key: Hashable | None = None, timeout: float | None = None, consumer: str | None = None
    ) -> Any:
        """Awaitable :meth:`get` for async actors and asyncio code."""
        if (self._instance, key) in _bound:
            return await asyncio.to_thread(self._take_bound, key, timeout)
        slot, pending = self._slot(key, consumer)
        if pending is None:
            entry = await self._actor.get.remote(key, slot[2], timeout)
        else:
            try:
                entry = await asyncio.wait_for(asyncio.shield(pending.ref), timeout)
            except asyncio.TimeoutError:
                entry = self._keep_read_ahead(slot, pending)
        self._accept(slot, entry, timeout)
        return self._restore(entry.data if entry.inline else await entry.data[0])

    def get_batch(self, key: Hashable, max_items: int = 1 << 30, timeout: float | None = None) -> list:
        """Wait for the next item of ``key``, then return it with every further item of that key
        that has already arrived (at most ``max_items``), oldest first: requests that arrive
        together can be answered together. Through the queue (an unbound key) it returns one.

        Raises:
            ChannelTimeout: If no item arrived within ``timeout``.
        """
        if (self._instance, key) not in _bound:
            return [self.get(key=key, timeout=timeout)]
        items = endpoint().take_many(self._instance, key, max_items, timeout)
        if not items:
            raise ChannelTimeout(f"No item arrived on channel {self.name!r} within {timeout} s.")
        return [self._restore(item) for item in items]

    def _take_bound(self, key: Hashable, timeout: float | None) -> Any:
        ok, item = endpoint().take(self._instance, key, timeout)
        if not ok:
            raise ChannelTimeout(f"No item arrived on channel {self.name!r} within {timeout} s.")
        return self._restore(item)

    def _slot(self, key, consumer) -> tuple[tuple, inflight.ReadAhead | None]:
        """The (channel, key, consumer) slot of a get and its outstanding read-ahead, if any."""
        slot = (self.name, key, consumer or _consumer_id())
        return slot, inflight.read_ahead.pop(slot, None)

    @staticmethod
    def _keep_read_ahead(slot, pending: inflight.ReadAhead) -> None:
        inflight.read_ahead[slot] = pending  # still outstanding: the next get waits for it
        return None

    def _accept(self, slot, entry: Entry | None, timeout: float | None) -> None:
        """Raise on timeout; with prefetch, issue the next request before fetching the payload,
        so its round trip overlaps the fetch and the caller's work."""
        if entry is None:
            raise ChannelTimeout(f"No item arrived on channel {self.name!r} within {timeout} s.")
        if self.prefetch:
            request_id = inflight.new_request_id()
            _, key, consumer = slot
            ref = self._actor.get.remote(key, consumer, None, request_id)
            inflight.read_ahead[slot] = inflight.ReadAhead(self._actor, request_id, ref)

    @staticmethod
    def _restore(item: Any) -> Any:
        if isinstance(item, _HostStaged):
            return dev.to_worker_device(item.tree, dev.process_devices())
        return item

    def register(self, consumer: str | None = None) -> None:
        """Join the balanced (unkeyed) consumers before the first ``get``."""
        ray.get(self._actor.register.remote(consumer or _consumer_id()))

    def delete(self) -> None:
        """Destroy the channel (its queue actor and queued items); handles stop working."""
        _created.pop(self.name, None)
        router.sender.forget(self._instance)
        ray.kill(self._actor, no_restart=True)

    # ---- introspection ---------------------------------------------------------------------

    def qsize(self) -> int:
        """Items currently held by the queue (keyed, unassigned and assigned-but-not-taken),
        counting every put this process has made, plus the items of keys bound by this process
        that wait here (other processes' bound keys are theirs to count)."""
        inflight.flush_puts()
        here = endpoint().held(self._instance) if has_endpoint() else 0
        return ray.get(self._actor.qsize.remote()) + here

    def hop_profile(self) -> dict:
        """Per-message times of the items this process received on its bound keys of this
        channel since the last call: ``messages`` and summed seconds ``encode_s``, ``wire_s``,
        ``decode_s``, ``handoff_s`` (see :meth:`.transports.endpoint.Endpoint.hop_profile`)."""
        if not has_endpoint():
            return {"messages": 0, "encode_s": 0.0, "wire_s": 0.0, "decode_s": 0.0, "handoff_s": 0.0}
        return endpoint().hop_profile(self._instance)

    def loads(self) -> dict[str, float]:
        """Total weight dealt to each registered unkeyed consumer."""
        return ray.get(self._actor.loads.remote())

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, maxsize={self.maxsize}, device={self.device!r})"


_consumer_cache: list[str] = []
_node_cache: list[str] = []
_routes: dict[tuple[str, Hashable], Any] = {}  # (instance, key) -> consumer address or None
_bound: set[tuple[str, Hashable]] = set()  # (instance, key) this process consumes directly
transport_override: list[str | None] = [None]
"""``["remote"]`` makes same-node bound keys use the cross-node path (TCP); tests, benchmarks."""


def _node_id() -> str:
    if not _node_cache:
        _node_cache.append(ray.get_runtime_context().get_node_id())
    return _node_cache[0]
_put_seq: dict[str, itertools.count] = collections.defaultdict(itertools.count)


def _producer_id() -> str:
    return ray.get_runtime_context().get_worker_id()


def _consumer_id() -> str:
    if not _consumer_cache:
        actor_id = ray.get_runtime_context().get_actor_id()
        _consumer_cache.append(actor_id or f"driver-{os.getpid()}")
    return _consumer_cache[0]


def delete_channels(channels: list) -> None:
    """Delete each of ``channels`` (:meth:`Channel.delete`: its queue actor) and empty the
    list; best effort: a channel whose node is gone went with it."""
    for ch in channels:
        try:
            ch.delete()
        except Exception:  # noqa: BLE001 - a lost node took the actor with it
            pass
    channels.clear()
