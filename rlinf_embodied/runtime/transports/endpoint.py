"""The receiving side of the direct paths: each process's :class:`Endpoint` (listening sockets,
reader threads, per-(channel, key) inboxes), started by the first bind.

Readers deliver into the inboxes at once, so a producer never waits for its consumer to call
``get`` (a bounded channel makes readers stop reading while the consumer's inbox is full, which
backs the producer up). A consumer that always comes back for its items (a request/reply loop)
can bind with ``caller_reads``: then the thread waiting in ``get`` reads the sockets itself, one
wake-up per message instead of a reader thread's wake-up and its hand-off, and items wait in the
kernel's socket buffers (``SOCKET_BUFFER_BYTES``) until it asks.
"""

from __future__ import annotations

import collections
import os
import pickle
import select
import socket
import threading
import time
import uuid
from typing import Any, Hashable

from rlinf_embodied.runtime.transports.base import Address
from rlinf_embodied.runtime.transports.wire import HELLO, SOCKET_BUFFER_BYTES, StreamReader


class Endpoint:
    """This process's receiving side: listeners, reader threads and the inboxes.

    Use :func:`endpoint` (one per process).
    """

    def __init__(self, node_id: str, host: str) -> None:
        self.token = uuid.uuid4().hex
        name = f"rlinf-channel-{os.getpid()}-{self.token[:12]}"
        self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._unix.bind("\0" + name)
        self._unix.listen(128)
        self._tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._tcp.bind((host, 0))
        self._tcp.listen(128)
        self.address = Address(node_id, os.getpid(), self.token, name, host, self._tcp.getsockname()[1])
        self._cond = threading.Condition()
        self._inbox: dict[tuple[str, Hashable], collections.deque] = collections.defaultdict(collections.deque)
        self._held: dict[str, int] = collections.defaultdict(int)  # items per channel instance
        self._maxsize: dict[str, int] = {}
        self._errors: dict[str, str] = {}  # instance -> why a reader gave up on its stream
        self._callers: dict[str, _CallerReads] = {}  # instances whose consumers read the sockets
        self._profile: dict[str, list] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
        for listener in (self._unix, self._tcp):
            threading.Thread(target=self._accept, args=(listener,), daemon=True,
                             name="rlinf-channel-accept").start()

    def expect(self, instance: str, maxsize: int, caller_reads: bool = False) -> None:
        """Register a channel instance whose items this process receives.

        Args:
            instance: The channel instance.
            maxsize: Items of it that may wait here (<= 0: unbounded); with ``caller_reads``
                the kernel's socket buffers bound what waits instead.
            caller_reads: Its connections get no reader thread: the thread that waits in
                :meth:`take` reads them itself (one wake-up per message instead of two), so
                items wait in the socket until a consumer asks.

        Raises:
            ValueError: If the instance was registered here with the other ``caller_reads``.
        """
        with self._cond:
            if instance in self._maxsize and (instance in self._callers) != caller_reads:
                raise ValueError(
                    f"Channel instance {instance} is already received here with caller_reads="
                    f"{not caller_reads}; bind every key of a channel in one process the same way.")
            self._maxsize[instance] = maxsize
            if caller_reads and instance not in self._callers:
                self._callers[instance] = _CallerReads()

    def deliver(self, instance: str, key: Hashable, item: Any, stamp: tuple | None = None) -> None:
        """Add an item to the inbox (waits while the channel's share here is full); ``stamp``
        (see :meth:`StreamReader.message`) feeds :meth:`hop_profile`."""
        with self._cond:
            callers = self._callers.get(instance)
            if callers is None:
                limit = self._maxsize.get(instance, 0)
                self._cond.wait_for(lambda: limit <= 0 or self._held[instance] < limit)
            self._inbox[(instance, key)].append((item, self._note(instance, stamp)))
            self._held[instance] += 1
            self._cond.notify_all()
            if callers is not None and callers.reading:
                callers.wake()

    def take(self, instance: str, key: Hashable, timeout: float | None) -> tuple[bool, Any]:
        """(True, item) in arrival order, or (False, None) after ``timeout`` seconds."""
        slot = (instance, key)
        with self._cond:
            if not self._wait(instance, slot, timeout):
                return False, None
            item, ready = self._inbox[slot].popleft()
            self._held[instance] -= 1
            self._profile[instance][4] += time.perf_counter() - ready
            self._cond.notify_all()
            return True, item

    def take_many(self, instance: str, key: Hashable, limit: int,
                  timeout: float | None) -> list:
        """Every item of the slot waiting now (at most ``limit``), after waiting for the first
        up to ``timeout`` seconds; [] if none came."""
        slot = (instance, key)
        with self._cond:
            if not self._wait(instance, slot, timeout):
                return []
            callers = self._callers.get(instance)
            if callers is not None and not callers.reading:  # what else has arrived is in the sockets
                self._read_here(instance, None, None)
            box = self._inbox[slot]
            now, prof = time.perf_counter(), self._profile[instance]
            items = []
            for _ in range(min(limit, len(box))):
                item, ready = box.popleft()
                prof[4] += now - ready
                items.append(item)
            self._held[instance] -= len(items)
            self._cond.notify_all()
            return items

    def _wait(self, instance: str, slot: tuple, timeout: float | None) -> bool:
        """Wait (holding ``self._cond``) until ``slot`` has an item; False after ``timeout``.

        Raises:
            RuntimeError: If a stream of the instance could not be decoded.
        """
        box = self._inbox[slot]
        if box:
            return True
        callers = self._callers.get(instance)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not box:
            self._raise_failed(instance)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if callers is not None and not callers.reading:
                self._read_here(instance, slot, deadline)
            else:
                self._cond.wait(left)
        self._raise_failed(instance)
        return True

    def _read_here(self, instance: str, slot: tuple | None, deadline: float | None) -> None:
        """Read a caller-read instance's connections in this thread (called holding
        ``self._cond``, released while reading) until ``slot`` has an item or ``deadline``
        passes; with ``slot`` None, only what has arrived already."""
        callers = self._callers[instance]
        callers.reading = True
        self._cond.release()
        try:
            while True:
                for stream in list(callers.streams):  # started messages first: poll cannot see them
                    while stream in callers.streams and stream.end > stream.start:
                        self._read_one(instance, callers, stream)
                if slot is not None and self._inbox[slot] or instance in self._errors:
                    return
                if slot is None:
                    left = 0.0
                else:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready = callers.poll(left)
                if not ready:
                    if slot is None or left is not None and deadline - time.monotonic() <= 0:
                        return
                for stream in ready:
                    if stream is None:
                        callers.clear_wake()
                    elif stream in callers.streams:
                        self._read_one(instance, callers, stream)
        finally:
            self._cond.acquire()
            callers.reading = False
            self._cond.notify_all()  # another thread waiting on this instance may read now

    def _read_one(self, instance: str, callers: "_CallerReads", stream: "StreamReader") -> None:
        """One message of a caller-read connection into the inbox (the connection is dropped
        at its end, or failed like a reader thread's if it cannot be decoded)."""
        try:
            key, item, stamp = stream.message()
        except (ConnectionError, EOFError, OSError):
            callers.drop(stream)
            return
        except Exception as err:  # noqa: BLE001 - an undecodable item: fail the consumer's gets
            callers.drop(stream)
            with self._cond:
                self._errors[instance] = self._undecodable(stream.channel, err)
                self._cond.notify_all()
            return
        with self._cond:
            self._inbox[(instance, key)].append((item, self._note(instance, stamp)))
            self._held[instance] += 1
            self._cond.notify_all()

    def _note(self, instance: str, stamp: tuple | None) -> float:
        """Add a received message's stamp to the instance's profile; returns its ready time."""
        if stamp is None:  # handed over in this process
            return time.perf_counter()
        sent, encode_s, arrived, decoded = stamp
        prof = self._profile[instance]
        prof[0] += 1
        prof[1] += encode_s
        prof[2] += arrived - sent - encode_s
        prof[3] += decoded - arrived
        return decoded

    def hop_profile(self, instance: str) -> dict:
        """Where the time of the instance's items received from other processes went since the
        last call (and reset): ``messages``, and summed seconds ``encode_s`` (producer),
        ``wire_s`` (sent to arrival here: system call, wake-up, any wait in the socket),
        ``decode_s`` (read and unpickle) and ``handoff_s`` (decoded to taken by a consumer,
        same-process items included)."""
        with self._cond:
            n, enc, wire, dec, hand = self._profile.pop(instance, [0, 0.0, 0.0, 0.0, 0.0])
        return {"messages": int(n), "encode_s": enc, "wire_s": wire, "decode_s": dec, "handoff_s": hand}

    @staticmethod
    def _undecodable(channel: str, err: Exception) -> str:
        return (f"Channel {channel!r}: an item from another process could not be decoded "
                f"({type(err).__name__}: {err}); items of its classes must be importable in the "
                f"consumer.")

    def _raise_failed(self, instance: str) -> None:
        if instance in self._errors:
            raise RuntimeError(self._errors[instance])

    def held(self, instance: str) -> int:
        """Items of a channel instance waiting in this process (for a caller-read instance,
        what has arrived in its sockets is read first)."""
        with self._cond:
            callers = self._callers.get(instance)
            if callers is not None and not callers.reading:
                self._read_here(instance, None, None)
            return self._held[instance]

    def maxsize(self, instance: str) -> int:
        """Items of a channel instance that may wait here (<= 0: unbounded; see :meth:`expect`)."""
        return self._maxsize.get(instance, 0)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
            threading.Thread(target=self._read, args=(conn,), daemon=True,
                             name="rlinf-channel-reader").start()

    def _read(self, conn: socket.socket) -> None:
        channel, instance = "?", None
        stream = StreamReader(conn)
        try:
            (n,) = HELLO.unpack(stream.read(HELLO.size))
            channel, instance = pickle.loads(stream.read(n))
            stream.channel = channel
            with self._cond:
                callers = self._callers.get(instance)
                if callers is not None:  # its consumers read it (see expect)
                    callers.add(stream)
                    return
            while True:
                key, item, stamp = stream.message()
                self.deliver(instance, key, item, stamp)
        except (ConnectionError, EOFError, OSError):
            pass  # the producer closed the connection or exited
        except Exception as err:  # noqa: BLE001 - an undecodable item: fail the consumer's gets
            if instance is not None:
                with self._cond:
                    self._errors[instance] = self._undecodable(channel, err)
                    self._cond.notify_all()
        stream.close()


class _CallerReads:
    """The connections of one caller-read channel instance (see :meth:`Endpoint.expect`) and
    an eventfd that wakes the thread reading them (a new connection, a same-process item)."""

    def __init__(self) -> None:
        self.streams: list[StreamReader] = []
        self.reading = False
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._poller: Any = None

    def add(self, stream: "StreamReader") -> None:
        self.streams.append(stream)
        self._poller = None
        self.wake()

    def drop(self, stream: "StreamReader") -> None:
        if stream in self.streams:
            self.streams.remove(stream)
            self._poller = None
        stream.close()

    def wake(self) -> None:
        os.eventfd_write(self._wake, 1)

    def clear_wake(self) -> None:
        try:
            os.eventfd_read(self._wake)
        except BlockingIOError:
            pass

    def poll(self, timeout: float | None) -> list:
        """Streams readable within ``timeout`` s (None stands for the wake-up eventfd)."""
        if self._poller is None:
            self._poller = select.poll()
            self._by_fd = {self._wake: None}
            self._poller.register(self._wake, select.POLLIN)
            for stream in self.streams:
                fd = stream.conn.fileno()
                self._by_fd[fd] = stream
                self._poller.register(fd, select.POLLIN)
        ms = None if timeout is None else max(0, int(-(-timeout * 1000 // 1)))
        return [self._by_fd[fd] for fd, _ in self._poller.poll(ms) if fd in self._by_fd]


_endpoint: list[Endpoint] = []
_endpoint_lock = threading.Lock()


def endpoint() -> Endpoint:
    """This process's endpoint, started on first use (needs Ray initialised)."""
    with _endpoint_lock:
        if not _endpoint:
            import ray

            ctx = ray.get_runtime_context()
            _endpoint.append(Endpoint(ctx.get_node_id(), ray.util.get_node_ip_address()))
        return _endpoint[0]


def has_endpoint() -> bool:
    """Whether this process has started its endpoint (bound a key)."""
    return bool(_endpoint)


def endpoint_token() -> str | None:
    """This process's endpoint token, or None before its first bind."""
    return _endpoint[0].token if _endpoint else None
