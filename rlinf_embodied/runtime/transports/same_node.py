"""Same node, other process: a Unix-domain socket per (channel, producer, consumer), large
buffers in shared memory.

Buffers of at least ``SHM_MIN_BYTES`` are written to a ``memfd`` shared-memory file whose
descriptor rides with the message (``SCM_RIGHTS``), so the consumer maps the producer's copy
instead of reading it through the socket; smaller ones travel in the stream (the framing is
:mod:`~rlinf_embodied.runtime.transports.wire`).
"""

from __future__ import annotations

import os
import socket

from rlinf_embodied.runtime.transports.base import Address
from rlinf_embodied.runtime.transports.wire import MAX_FDS, StreamConnection

SHM_MIN_BYTES = 256 * 1024
"""Buffers of at least this many bytes travel in shared memory on one node (below it the two
socket copies cost less than creating and mapping a memfd; see benchmarks/bench_channel.py)."""


class UnixConnection(StreamConnection):
    """A connection to a consumer on this node, through its endpoint's abstract Unix socket.

    Raises:
        ConsumerGone: If the consumer cannot be reached.
    """

    def __init__(self, address: Address, channel: str, instance: str) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        super().__init__(sock, "\0" + address.unix, channel, instance)

    def _place(self, buffers: list[memoryview]) -> tuple[list[int], list[memoryview], list[int]]:
        """Buffers of at least ``SHM_MIN_BYTES`` (up to ``MAX_FDS`` of them) in shared memory,
        the rest in the stream."""
        descs, stream, fds = [], [], []
        for buf in buffers:
            n = buf.nbytes
            if n >= SHM_MIN_BYTES and len(fds) < MAX_FDS:
                fds.append(_to_memfd(buf))
                descs.append(n << 1 | 1)
            else:
                stream.append(buf)
                descs.append(n << 1)
        return descs, stream, fds


def _to_memfd(buf: memoryview) -> int:
    fd = os.memfd_create("rlinf-channel", os.MFD_CLOEXEC)
    view, done = buf.cast("B"), 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], done)
    return fd
