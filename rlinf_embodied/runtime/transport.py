"""Direct data paths of a channel, chosen by where producer and consumer run (paper section 3.5).

Ray stays the control plane: a consumer *binds* a key of a channel to its process (the channel's
queue actor records the binding, metadata only), and a producer looks the binding up once. From
then on items of that key skip the queue actor and the object store:

* same process: the object itself is handed over (no copy, no serialisation);
* same node, other process: one Unix-domain socket per (channel, producer, consumer); tensors
  and arrays travel as pickle protocol-5 out-of-band buffers: up to ``SHM_MIN_BYTES`` through the
  socket, larger ones in a ``memfd`` shared-memory file whose descriptor is passed along
  (``SCM_RIGHTS``), so the consumer maps the producer's copy instead of copying it again;
* other node: a TCP connection to the consumer's node, buffers inline (the same framing).

Accelerator tensors are staged to host memory by the channel before they get here and restored
onto the consumer's device after (:mod:`rlinf_embodied.runtime.device`), so this module only
ever sees host memory and is device-agnostic.

Each process has at most one :class:`Endpoint` (started by the first bind): a listening socket
pair and one reader thread per incoming connection. Readers deliver into per-(channel, key)
inboxes at once, so a producer never waits for its consumer to call ``get`` (a bounded channel
makes readers stop reading while the consumer's inbox is full, which backs the producer up).
A consumer that always comes back for its items (a request/reply loop) can bind with
``caller_reads``: then the thread waiting in ``get`` reads the sockets itself, one wake-up per
message instead of a reader thread's wake-up and its hand-off, and items wait in the kernel's
socket buffers (``SOCKET_BUFFER_BYTES``) until it asks.
"""

from __future__ import annotations

import array
import collections
import copyreg
import dataclasses
import functools
import io
import mmap
import os
import pickle
import select
import socket
import struct
import sys
import threading
import time
import uuid
from typing import Any, Hashable

SHM_MIN_BYTES = 256 * 1024
"""Buffers of at least this many bytes travel in shared memory on one node (below it the two
socket copies cost less than creating and mapping a memfd; see benchmarks/bench_channel.py)."""

MAX_FDS = 64
"""Shared-memory buffers per message; further buffers of the message go through the socket."""

SOCKET_BUFFER_BYTES = 4 << 20
"""Requested kernel socket buffer (capped by net.core.wmem_max / rmem_max)."""

LOCAL = "local"
SAME_NODE = "same_node"
REMOTE = "remote"

_HEADER = struct.Struct("<IQdd")  # buffers, meta length, send time, encode s; then one <Q per buffer:
# its length << 1 | kind (0: in the stream, 1: shared memory)
_HELLO = struct.Struct("<I")


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


def choose(producer_node: str, consumer: Address, force: str | None = None) -> str:
    """The transport between a producer on ``producer_node`` and ``consumer``.

    Returns:
        ``"local"`` (same process), ``"same_node"`` or ``"remote"``; ``force`` (tests,
        benchmarks) overrides a same-node choice with ``"remote"`` (TCP on one machine).
    """
    if consumer.pid == os.getpid() and consumer.token == _endpoint_token():
        return LOCAL
    if force == REMOTE or consumer.node_id != producer_node:
        return REMOTE
    return SAME_NODE


# ---- serialisation ---------------------------------------------------------------------------


def _tensor_from_buffer(buf, code: int, shape: tuple):
    """A tensor over ``buf``'s bytes (no copy): dtype ``_dtypes()[code]``, shape ``shape``."""
    import torch

    dtype, np_dtype = _dtypes()[code]
    if np_dtype is not None:  # through numpy: fewer and cheaper calls than torch.frombuffer
        import numpy as np

        return torch.from_numpy(np.frombuffer(buf, np_dtype).reshape(shape))
    if not len(buf):
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype).view(shape)


def _reduce_tensor(obj):
    """Pickle reduction of a dense CPU tensor: its bytes out of band, dtype code and shape in
    band. Other tensors (accelerator, autograd, quantized, conjugate/negative views, sparse)
    keep torch's own reduction."""
    try:
        if not obj.is_contiguous():
            obj = obj.contiguous()
        array = obj.numpy()  # raises for everything but a dense CPU tensor of a numpy dtype
    except (RuntimeError, TypeError):
        torch = sys.modules["torch"]
        if (obj.device.type != "cpu" or obj.layout != torch.strided or obj.requires_grad
                or obj.is_quantized or obj.is_conj() or obj.is_neg()):
            return obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        array = obj.reshape(-1).view(torch.uint8).numpy()  # bfloat16 and other non-numpy dtypes
    return _tensor_from_buffer, (pickle.PickleBuffer(array), _dtype_codes()[obj.dtype], tuple(obj.shape))


@functools.cache
def _dtype_tables() -> tuple[tuple, dict]:
    """((torch dtype, numpy dtype or None) per code, code per torch dtype); called only once
    torch is imported (a tensor is being encoded or decoded)."""
    import numpy as np
    import torch

    names = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8",
             "bool", "complex64", "complex128", "bfloat16", "uint16", "uint32", "uint64",
             "float8_e4m3fn", "float8_e5m2")
    found = [getattr(torch, n) for n in names if hasattr(torch, n)]
    numpy_kind = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
                  torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16,
                  torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_,
                  torch.complex64: np.complex64, torch.complex128: np.complex128}
    return tuple((d, numpy_kind.get(d)) for d in found), {d: i for i, d in enumerate(found)}


def _dtypes() -> tuple:
    """(torch dtype, numpy dtype or None) per code."""
    return _dtype_tables()[0]


def _dtype_codes() -> dict:
    return _dtype_tables()[1]


_pickle_tables: list = []


def _dispatch_table() -> dict | None:
    """copyreg's reductions plus :func:`_reduce_tensor` for ``torch.Tensor`` (None until torch
    is imported: then no item can hold a tensor). Built once, on the first call after torch
    is imported (not cached before: a None result must not stick)."""
    if not _pickle_tables:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        table = copyreg.dispatch_table.copy()
        table[torch.Tensor] = _reduce_tensor
        _pickle_tables.append(table)
    return _pickle_tables[0]


def encode(item: Any) -> tuple[bytes, list[memoryview]]:
    """``item`` -> (pickle stream, out-of-band buffers). Falls back to cloudpickle in band.

    Pickle protocol 5; dense CPU tensors and numpy arrays go out of band (their memory, no
    copy): a tensor is rebuilt over the received bytes with ``torch.frombuffer``. Only exact
    ``torch.Tensor`` instances take that path (a C dispatch-table lookup, so every other object
    is pickled at C speed).
    """
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    try:
        pickler = pickle.Pickler(out, protocol=5, buffer_callback=buffers.append)
        table = _dispatch_table()
        if table is not None:
            pickler.dispatch_table = table
        pickler.dump(item)
    except (pickle.PicklingError, TypeError, AttributeError):
        from ray import cloudpickle

        return cloudpickle.dumps(item, protocol=5), []
    return out.getvalue(), [b.raw() for b in buffers]


def decode(meta: bytes, buffers: list) -> Any:
    """Inverse of :func:`encode`."""
    return pickle.loads(meta, buffers=buffers)


# ---- sending ---------------------------------------------------------------------------------


class _Connection:
    """One producer -> consumer stream of one channel (messages keep their order)."""

    def __init__(self, address: Address, transport: str, channel: str, instance: str) -> None:
        self.transport = transport
        if transport == SAME_NODE:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = "\0" + address.unix
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            target = (address.host, address.port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        try:
            sock.connect(target)
        except OSError as err:
            sock.close()
            raise ConsumerGone(str(err)) from err
        hello = pickle.dumps((channel, instance))
        _send(sock, [_HELLO.pack(len(hello)), hello])
        self.sock = sock
        self.lock = threading.Lock()

    def send(self, key: Hashable, item: Any, timeout: float | None) -> bool:
        """Send one message; False if nothing could be sent within ``timeout`` (full consumer)."""
        t0 = time.perf_counter()
        meta, buffers = encode((key, item))
        shm = self.transport == SAME_NODE
        descs, stream, fds = [], [], []
        for buf in buffers:
            n = buf.nbytes
            if shm and n >= SHM_MIN_BYTES and len(fds) < MAX_FDS:
                fds.append(_to_memfd(buf))
                descs.append(n << 1 | 1)
            else:
                stream.append(buf)
                descs.append(n << 1)
        head = _HEADER.pack(len(buffers), len(meta), t0, time.perf_counter() - t0) + struct.pack(f"<{len(descs)}Q", *descs)
        try:
            with self.lock:
                return _send(self.sock, [head, meta, *stream], fds, timeout)
        except OSError as err:
            raise ConsumerGone(str(err)) from err
        finally:
            for fd in fds:
                os.close(fd)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _to_memfd(buf: memoryview) -> int:
    fd = os.memfd_create("rlinf-channel", os.MFD_CLOEXEC)
    view, done = buf.cast("B"), 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], done)
    return fd


def _send(sock: socket.socket, parts: list, fds: list[int] = (), timeout: float | None = None) -> bool:
    """Write ``parts`` (fds ride with the first byte). With ``timeout``, give up (False) only if
    not a byte went out in time; once the message has started it is always finished."""
    views = [p if isinstance(p, memoryview) else memoryview(p) for p in parts if len(p)]
    if timeout is None and not fds:  # the common case: one blocking call writes it all
        sent = sock.sendmsg(views[:64])
        total = sum(v.nbytes for v in views)
        if sent == total:
            return True
        views = [v.cast("B") for v in views]
        _advance(views, sent)
        while views:
            _advance(views, sock.sendmsg(views[:64]))
        return True
    views = [v.cast("B") for v in views]
    first = True
    sock.settimeout(timeout)
    try:
        while views:
            try:
                if first and fds:
                    sent = socket.send_fds(sock, views[:1], list(fds))
                else:
                    sent = sock.sendmsg(views[:64])
            except (socket.timeout, BlockingIOError):
                if first:
                    return False
                raise
            if first and sent:
                first = False
                sock.settimeout(None)
            _advance(views, sent)
    finally:
        sock.settimeout(None)
    return True


def _advance(views: list[memoryview], sent: int) -> None:
    """Drop the first ``sent`` bytes of ``views`` (byte-format views)."""
    while sent:
        if sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        else:
            views[0] = views[0][sent:]
            sent = 0


# ---- receiving -------------------------------------------------------------------------------


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
        (see :meth:`_StreamReader.message`) feeds :meth:`hop_profile`."""
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

    def _read_one(self, instance: str, callers: "_CallerReads", stream: "_StreamReader") -> None:
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
        stream = _StreamReader(conn)
        try:
            (n,) = _HELLO.unpack(stream.read(_HELLO.size))
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
        self.streams: list[_StreamReader] = []
        self.reading = False
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._poller: Any = None

    def add(self, stream: "_StreamReader") -> None:
        self.streams.append(stream)
        self._poller = None
        self.wake()

    def drop(self, stream: "_StreamReader") -> None:
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


class _StreamReader:
    """Buffered reading of one connection: a small message arrives in one ``recvmsg`` (one
    system call, not one per header, buffer descriptor and buffer); buffers of at least
    ``DIRECT_BYTES`` are received straight into their destination. File descriptors passed
    along (``SCM_RIGHTS``, the shared-memory buffers) are kept in arrival order: a message's
    descriptors ride with its first byte, so they are always in hand when its header is."""

    CHUNK = 256 * 1024
    DIRECT_BYTES = 64 * 1024
    POOL_BYTES = 1 << 20
    """Stream buffers of a message that total at most this share one allocation."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = bytearray(self.CHUNK)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.fds: collections.deque[int] = collections.deque()
        self._anc = socket.CMSG_SPACE(MAX_FDS * 4)
        self.channel = "?"

    def _fill(self) -> None:
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end == len(self.buf):
            left = self.end - self.start
            self.view[:left] = self.view[self.start:self.end]
            self.start, self.end = 0, left
        got, anc, _, _ = self.conn.recvmsg_into([self.view[self.end:]], self._anc)
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self.fds.extend(fds)
        if not got:
            raise EOFError("connection closed")
        self.end += got

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes of the stream."""
        if n > self.CHUNK:
            return self._read_large(n)
        while self.end - self.start < n:
            self._fill()
        out = bytes(self.view[self.start:self.start + n])
        self.start += n
        return out

    def read_into(self, dest: memoryview) -> None:
        """Fill ``dest`` with the next ``len(dest)`` bytes of the stream."""
        have = min(len(dest), self.end - self.start)
        dest[:have] = self.view[self.start:self.start + have]
        self.start += have
        dest = dest[have:]
        if len(dest) >= self.DIRECT_BYTES:  # big: no detour through the buffer
            _recv_into(self.conn, dest)
            return
        while len(dest):
            self._fill()
            have = min(len(dest), self.end - self.start)
            dest[:have] = self.view[self.start:self.start + have]
            self.start += have
            dest = dest[have:]

    def _need(self, n: int) -> int:
        """Buffer the next ``n <= CHUNK`` bytes; returns their offset in ``self.buf``."""
        while self.end - self.start < n:
            self._fill()
        at = self.start
        self.start += n
        return at

    def message(self) -> tuple:
        """The next (key, item, stamp) of the stream; stamp: (send time, encode seconds,
        arrival time, decoded time), ``time.perf_counter`` values (one clock on one node).

        Buffers that came through the stream are received into one allocation (each at a
        16-byte aligned offset, so every dtype is aligned) unless they are large.
        """
        nbuf, meta_len, sent, encode_s = _HEADER.unpack_from(self.buf, self._need(_HEADER.size))
        arrived = time.perf_counter()
        descs = struct.unpack_from(f"<{nbuf}Q", self.buf, self._need(8 * nbuf)) if nbuf else ()
        if meta_len <= self.CHUNK:
            at = self._need(meta_len)
            meta = self.view[at:at + meta_len]
        else:
            meta = self._read_large(meta_len)
        in_stream = [d >> 1 for d in descs if not d & 1]
        block = sum(-(-n // 16) * 16 for n in in_stream)
        pooled = memoryview(bytearray(block)) if in_stream and block <= self.POOL_BYTES else None
        if isinstance(meta, memoryview) and self.end - self.start < sum(in_stream):
            meta = bytes(meta)  # reading the buffers moves the read buffer's contents
        buffers, offset = [], 0
        for d in descs:
            n = d >> 1
            if d & 1:
                while not self.fds:  # cannot happen: the descriptors came with the header
                    self._fill()
                fd = self.fds.popleft()
                try:
                    mm = mmap.mmap(fd, n, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                finally:
                    os.close(fd)
                buffers.append(memoryview(mm))
            elif pooled is not None:
                dest = pooled[offset:offset + n]
                offset += -(-n // 16) * 16
                buffers.append(dest)
            else:
                dest = memoryview(bytearray(n))
                buffers.append(dest)
        for d, buf in zip(descs, buffers):
            if not d & 1:
                self.read_into(buf)
        key, item = decode(meta, buffers)
        return key, item, (sent, encode_s, arrived, time.perf_counter())

    def _read_large(self, n: int) -> bytes:
        out = bytearray(n)
        self.read_into(memoryview(out))
        return bytes(out)

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.popleft())
        self.conn.close()


def _recv_into(conn: socket.socket, view: memoryview) -> None:
    while len(view):
        got = conn.recv_into(view)
        if not got:
            raise EOFError("connection closed")
        view = view[got:]


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


def _endpoint_token() -> str | None:
    return _endpoint[0].token if _endpoint else None


class Sender:
    """This process's outgoing connections, one per (channel instance, consumer endpoint)."""

    def __init__(self) -> None:
        self._conns: dict[tuple[str, str, str], _Connection] = {}
        self._lock = threading.Lock()

    def send(self, channel: str, instance: str, address: Address, transport: str, key: Hashable,
             item: Any, timeout: float | None) -> bool:
        """Deliver ``item`` to the bound consumer at ``address``.

        Returns:
            False if the consumer's share of a bounded channel stayed full for ``timeout`` s.

        Raises:
            ConsumerGone: the consumer cannot be reached (the connection is dropped).
        """
        if transport == LOCAL:
            ep = endpoint()
            if timeout is None:
                ep.deliver(instance, key, item)
                return True
            deadline = time.monotonic() + timeout
            while ep._maxsize.get(instance, 0) > 0 and ep.held(instance) >= ep._maxsize[instance]:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.001)
            ep.deliver(instance, key, item)
            return True
        slot = (instance, address.token, transport)
        with self._lock:
            conn = self._conns.get(slot)
            if conn is None:
                conn = self._conns[slot] = _Connection(address, transport, channel, instance)
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
