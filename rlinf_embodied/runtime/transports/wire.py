"""The framing of the socket transports: one message per item, written by a
:class:`StreamConnection` and read by a :class:`StreamReader`.

A connection opens with a hello (the channel's name and instance). Each message is a header
(``HEADER``: buffer count, pickle length, send time, encode seconds), one descriptor per
out-of-band buffer (its length << 1 | kind; kind 0: the bytes follow in the stream, kind 1: a
shared-memory file whose descriptor rode with the message's first byte, ``SCM_RIGHTS``), the
pickle stream (:mod:`~rlinf_embodied.runtime.transports.codec`) and the in-stream buffers.
Which buffers go to shared memory is the sending transport's choice
(:class:`~rlinf_embodied.runtime.transports.same_node.UnixConnection`); the reader maps
whatever descriptors arrive.
"""

from __future__ import annotations

import array
import collections
import mmap
import os
import pickle
import socket
import struct
import threading
import time
from typing import Any, Hashable

from rlinf_embodied.runtime.transports.base import ConsumerGone, Connection
from rlinf_embodied.runtime.transports.codec import decode, encode

MAX_FDS = 64
"""Shared-memory buffers per message; further buffers of the message go through the socket."""

SOCKET_BUFFER_BYTES = 4 << 20
"""Requested kernel socket buffer (capped by net.core.wmem_max / rmem_max)."""

HEADER = struct.Struct("<IQdd")  # buffers, meta length, send time, encode s; then one <Q per buffer:
# its length << 1 | kind (0: in the stream, 1: shared memory)
HELLO = struct.Struct("<I")


class StreamConnection(Connection):
    """A connection over a stream socket (Unix or TCP); every buffer goes through the socket
    unless a subclass places some elsewhere (:meth:`_place`).

    Args:
        sock: The unconnected socket (its options set by the subclass).
        target: What ``sock.connect`` takes (an abstract Unix name, a (host, port) pair).
        channel: The channel's name; ``instance``: its instance, both sent in the hello.

    Raises:
        ConsumerGone: If the consumer cannot be reached.
    """

    def __init__(self, sock: socket.socket, target: Any, channel: str, instance: str) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        try:
            sock.connect(target)
        except OSError as err:
            sock.close()
            raise ConsumerGone(str(err)) from err
        hello = pickle.dumps((channel, instance))
        send_parts(sock, [HELLO.pack(len(hello)), hello])
        self.sock = sock
        self.lock = threading.Lock()

    def _place(self, buffers: list[memoryview]) -> tuple[list[int], list[memoryview], list[int]]:
        """Where each out-of-band buffer travels: (descriptor per buffer, buffers for the
        stream, shared-memory file descriptors, which the caller closes once sent)."""
        return [buf.nbytes << 1 for buf in buffers], list(buffers), []

    def send(self, key: Hashable, item: Any, timeout: float | None) -> bool:
        """Send one message; False if nothing could be sent within ``timeout`` (full consumer)."""
        t0 = time.perf_counter()
        meta, buffers = encode((key, item))
        descs, stream, fds = self._place(buffers)
        head = HEADER.pack(len(buffers), len(meta), t0, time.perf_counter() - t0) + struct.pack(f"<{len(descs)}Q", *descs)
        try:
            with self.lock:
                return send_parts(self.sock, [head, meta, *stream], fds, timeout)
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


def send_parts(sock: socket.socket, parts: list, fds: list[int] = (), timeout: float | None = None) -> bool:
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


class StreamReader:
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
        nbuf, meta_len, sent, encode_s = HEADER.unpack_from(self.buf, self._need(HEADER.size))
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

