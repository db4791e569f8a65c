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
"""

from __future__ import annotations

import array
import collections
import dataclasses
import io
import mmap
import os
import pickle
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

_HEADER = struct.Struct("<IQ")  # number of buffers, meta length
_BUFFER = struct.Struct("<QB")  # buffer length, kind (0: in the stream, 1: shared memory)
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


def _rebuild_tensor(array, dtype, shape):
    """A tensor over ``array``'s memory (numpy array of the raw bytes or values, no copy)."""
    import torch

    if dtype is None:
        return torch.from_numpy(array)
    if not array.size:
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(array).view(dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    """Protocol 5; dense CPU tensors go out of band as numpy arrays over their memory (torch
    pickles them in band, a copy and a slow path)."""

    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        if torch is None or type(obj) is not torch.Tensor:
            return NotImplemented
        if (obj.device.type != "cpu" or obj.layout != torch.strided or obj.requires_grad
                or obj.is_quantized or obj.is_conj() or obj.is_neg()):
            return NotImplemented
        if not obj.is_contiguous():
            obj = obj.contiguous()
        if obj.dtype in _NUMPY_DTYPES(torch):  # numpy pickles the array out of band itself
            return _rebuild_tensor, (obj.numpy(), None, None)
        raw = obj.reshape(-1).view(torch.uint8).numpy()
        return _rebuild_tensor, (raw, obj.dtype, tuple(obj.shape))


_numpy_dtypes: list = []


def _NUMPY_DTYPES(torch) -> frozenset:  # noqa: N802 - a lazily built constant
    if not _numpy_dtypes:
        _numpy_dtypes.append(frozenset({
            torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
            torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128}))
    return _numpy_dtypes[0]


def encode(item: Any) -> tuple[bytes, list[memoryview]]:
    """``item`` -> (pickle stream, out-of-band buffers). Falls back to cloudpickle in band."""
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    try:
        _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(item)
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
        meta, buffers = encode((key, item))
        shm = self.transport == SAME_NODE
        descs, stream, fds = [], [], []
        for buf in buffers:
            n = buf.nbytes
            if shm and n >= SHM_MIN_BYTES and len(fds) < MAX_FDS:
                fds.append(_to_memfd(buf))
                descs.append(_BUFFER.pack(n, 1))
            else:
                stream.append(buf)
                descs.append(_BUFFER.pack(n, 0))
        head = _HEADER.pack(len(buffers), len(meta)) + b"".join(descs)
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
    views = [memoryview(p).cast("B") for p in parts if len(p)]
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
            while sent:
                if sent >= len(views[0]):
                    sent -= len(views[0])
                    views.pop(0)
                else:
                    views[0] = views[0][sent:]
                    sent = 0
    finally:
        sock.settimeout(None)
    return True


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
        for listener in (self._unix, self._tcp):
            threading.Thread(target=self._accept, args=(listener,), daemon=True,
                             name="rlinf-channel-accept").start()

    def expect(self, instance: str, maxsize: int) -> None:
        """Register a channel instance whose items this process receives."""
        self._maxsize[instance] = maxsize

    def deliver(self, instance: str, key: Hashable, item: Any) -> None:
        """Add an item to the inbox (waits while the channel's share here is full)."""
        with self._cond:
            limit = self._maxsize.get(instance, 0)
            self._cond.wait_for(lambda: limit <= 0 or self._held[instance] < limit)
            self._inbox[(instance, key)].append(item)
            self._held[instance] += 1
            self._cond.notify_all()

    def take(self, instance: str, key: Hashable, timeout: float | None) -> tuple[bool, Any]:
        """(True, item) in arrival order, or (False, None) after ``timeout`` seconds."""
        slot = (instance, key)
        with self._cond:
            if not self._cond.wait_for(lambda: self._inbox[slot] or instance in self._errors, timeout):
                return False, None
            self._raise_failed(instance)
            item = self._inbox[slot].popleft()
            self._held[instance] -= 1
            self._cond.notify_all()
            return True, item

    def take_many(self, instance: str, key: Hashable, limit: int,
                  timeout: float | None) -> list:
        """Every item of the slot waiting now (at most ``limit``), after waiting for the first
        up to ``timeout`` seconds; [] if none came."""
        slot = (instance, key)
        with self._cond:
            if not self._cond.wait_for(lambda: self._inbox[slot] or instance in self._errors, timeout):
                return []
            self._raise_failed(instance)
            box = self._inbox[slot]
            items = [box.popleft() for _ in range(min(limit, len(box)))]
            self._held[instance] -= len(items)
            self._cond.notify_all()
            return items

    def _raise_failed(self, instance: str) -> None:
        if instance in self._errors:
            raise RuntimeError(self._errors[instance])

    def held(self, instance: str) -> int:
        """Items of a channel instance waiting in this process."""
        with self._cond:
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
            while True:
                key, item = stream.message()
                self.deliver(instance, key, item)
        except (ConnectionError, EOFError, OSError):
            pass  # the producer closed the connection or exited
        except Exception as err:  # noqa: BLE001 - an undecodable item: fail the consumer's gets
            if instance is not None:
                with self._cond:
                    self._errors[instance] = (
                        f"Channel {channel!r}: an item from another process could not be decoded "
                        f"({type(err).__name__}: {err}); items of its classes must be importable "
                        f"in the consumer.")
                    self._cond.notify_all()
        finally:
            stream.close()


class _StreamReader:
    """Buffered reading of one connection: a small message arrives in one ``recvmsg`` (one
    system call, not one per header, buffer descriptor and buffer); buffers of at least
    ``DIRECT_BYTES`` are received straight into their destination. File descriptors passed
    along (``SCM_RIGHTS``, the shared-memory buffers) are kept in arrival order: a message's
    descriptors ride with its first byte, so they are always in hand when its header is."""

    CHUNK = 256 * 1024
    DIRECT_BYTES = 64 * 1024

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = bytearray(self.CHUNK)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.fds: collections.deque[int] = collections.deque()
        self._anc = socket.CMSG_SPACE(MAX_FDS * 4)

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

    def message(self) -> Any:
        """The next (key, item) of the stream."""
        import numpy as np

        nbuf, meta_len = _HEADER.unpack(self.read(_HEADER.size))
        descs = self.read(nbuf * _BUFFER.size)
        meta = self.read(meta_len)
        buffers = []
        for i in range(nbuf):
            n, kind = _BUFFER.unpack_from(descs, i * _BUFFER.size)
            if kind == 1:
                while not self.fds:  # cannot happen: the descriptors came with the header
                    self._fill()
                fd = self.fds.popleft()
                try:
                    mm = mmap.mmap(fd, n, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                finally:
                    os.close(fd)
                buffers.append(np.frombuffer(mm, dtype=np.uint8))
            else:
                buf = np.empty(n, dtype=np.uint8)
                self.read_into(memoryview(buf))
                buffers.append(buf)
        return decode(meta, buffers)

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
