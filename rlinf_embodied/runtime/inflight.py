"""What this process has in flight on its channels, and how it is settled.

* Puts through a channel's queue actor are pipelined: up to ``PUT_PIPELINE`` of them wait
  for their acknowledgement while the producer goes on; :func:`flush_puts` waits for all.
* Gets of a prefetching consumer are read ahead: the next request is issued before the caller
  asks; :func:`release_prefetched` withdraws those still outstanding.
* The names of the channels put into since the last look (:func:`take_recent_puts`) tell the
  device lock whose consumers should get the devices next.

A worker settles all three when its method returns and when it releases its devices
(:mod:`rlinf_embodied.runtime.worker`); :class:`~rlinf_embodied.runtime.channel.Channel` adds
to them.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
from typing import Any, Hashable

import ray

PUT_PIPELINE = 4
"""Puts a producer process may have in flight before ``put`` waits for the oldest to be
accepted. Hides the queue actor's round trip (so a channel moves data about as fast as plain
``ray.put``/``ray.get``, see benchmarks/bench_channel.py); back-pressure still holds, a producer
runs at most this many items past a full channel."""

_recent_puts: set[str] = set()
_in_flight: collections.deque = collections.deque()  # (channel name, ack) of unacknowledged puts


def note_put(name: str) -> None:
    """Record that this process put into channel ``name`` (see :func:`take_recent_puts`)."""
    _recent_puts.add(name)


def take_recent_puts() -> set[str]:
    """Names of the channels this process put into since the last call (and forget them).

    The device lock uses it to hand the device to consumers of what was just produced.
    """
    names = set(_recent_puts)
    _recent_puts.difference_update(names)
    return names


def pipeline_put(name: str, ack: ray.ObjectRef) -> None:
    """Track the acknowledgement of a put into channel ``name``; wait for the oldest ones while
    more than ``PUT_PIPELINE`` are unacknowledged.

    Raises:
        RuntimeError: If a channel died or was deleted before accepting a put.
    """
    _in_flight.append((name, ack))
    while len(_in_flight) > PUT_PIPELINE:
        _await_ack(*_in_flight.popleft())


def flush_puts() -> None:
    """Wait until every ``put`` this process made has been accepted by its channel.

    Worker methods and device-lock releases call it, so a worker's puts are in their channels
    once its method returns or its devices are handed over.
    """
    while _in_flight:
        _await_ack(*_in_flight.popleft())


def _await_ack(name: str, ack: ray.ObjectRef) -> None:
    try:
        ray.get(ack)
    except ray.exceptions.RayActorError as err:
        raise RuntimeError(
            f"Channel {name!r} was deleted or died before accepting a put; the item is lost. "
            f"Delete a channel only after its producers' methods have returned."
        ) from err


@dataclasses.dataclass
class ReadAhead:
    """A get request issued before the consumer asked (``prefetch``), not yet consumed.

    Attributes:
        actor: The channel's queue actor.
        request_id: The request's id (see :func:`new_request_id`), to cancel it.
        ref: The pending result of the get: a queue entry, or None once cancelled.
    """

    actor: Any
    request_id: str
    ref: ray.ObjectRef


read_ahead: dict[tuple[str, Hashable, str], ReadAhead] = {}
"""This process's outstanding read-ahead gets by (channel name, key, consumer)."""
_request_ids = itertools.count()


def new_request_id() -> str:
    """A read-ahead request id, unique within the cluster (process id and a counter)."""
    return f"{os.getpid()}-{next(_request_ids)}"


def release_prefetched() -> None:
    """Withdraw this process's read-ahead requests, returning items they already took.

    Worker methods call it on return, so a prefetching consumer never strands an item.
    """
    while read_ahead:
        (_, key, consumer), pending = read_ahead.popitem()
        actor = pending.actor
        try:
            ray.get(actor.cancel.remote(pending.request_id))
            entry = ray.get(pending.ref)
            if entry is not None:
                ray.get(actor.unget.remote(entry, key, consumer))
        except ray.exceptions.RayActorError:
            pass  # the channel is gone, and its items with it
