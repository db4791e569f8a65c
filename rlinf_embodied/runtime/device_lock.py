"""DeviceLock: context switching of worker groups that share devices (paper section 3.3).

Workers placed on the same device take turns: a worker acquires the locks of all its devices
(all at once, so two multi-device workers cannot deadlock), onloads its state, works, offloads
and releases. The lock service is one Ray actor for the whole cluster.

Dependency-aware priority (paper section 3.3): waiters declare the channels they consume. When
a holder releases after putting into channel X, a waiter that consumes X gets the devices before
waiters that arrived earlier, so the child runs as soon as its parent has produced; otherwise
waiters are served in arrival order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Iterable, NamedTuple, Sequence

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

_SERVICE_NAME = "rlinf_device_lock"


class LockEvent(NamedTuple):
    """One entry of the lock trace."""

    time: float
    """Wall-clock seconds (time.time() on the lock service)."""
    device: int
    """Global device id."""
    worker: str
    """Worker name, ``"<group>[<rank>]"``."""
    event: str
    """``"request"``, ``"acquire"`` or ``"release"``."""


@dataclasses.dataclass
class _Waiter:
    worker: str
    devices: tuple[int, ...]
    consumes: frozenset[str]
    seq: int
    granted: asyncio.Future
    party: str


class _LockService:
    """The lock actor (async): holders, waiters, and the event trace."""

    def __init__(self) -> None:
        self._holder: dict[int, str] = {}  # device -> holding party
        self._members: dict[int, set[str]] = {}  # device -> workers of the holding party
        self._produced: dict[int, set[str]] = {}  # device -> channels the party put into
        self._last_products: dict[int, frozenset[str]] = {}
        self._waiters: list[_Waiter] = []
        self._seq = 0
        self._trace: list[LockEvent] = []

    async def acquire(
        self,
        worker: str,
        devices: Sequence[int],
        consumes: Sequence[str],
        timeout: float | None,
        share: str | None = None,
    ) -> bool:
        granted = asyncio.get_running_loop().create_future()
        party = f"share:{share}" if share else worker
        waiter = _Waiter(worker, tuple(devices), frozenset(consumes), self._seq, granted, party)
        self._seq += 1
        self._record(waiter.devices, worker, "request")
        self._waiters.append(waiter)
        self._grant()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.granted), timeout)
            return True
        except asyncio.TimeoutError:
            if waiter.granted.done():  # granted in the same instant: keep it
                return True
            self._waiters.remove(waiter)
            return False

    async def release(self, worker: str, devices: Sequence[int], produced: Sequence[str]) -> None:
        for d in devices:
            if worker not in self._members.get(d, ()):
                raise RuntimeError(
                    f"{worker} released device {d}, held by {self._holder.get(d)}; release only "
                    f"devices acquired through the same worker's device_lock()."
                )
        for d in devices:
            self._members[d].discard(worker)
            self._produced.setdefault(d, set()).update(produced)
            if not self._members[d]:  # the last member of the party leaves: the device is free
                del self._holder[d], self._members[d]
                self._last_products[d] = frozenset(self._produced.pop(d))
        self._record(devices, worker, "release")
        self._grant()

    async def evict(self, workers: Sequence[str]) -> None:
        """Forget ``workers`` (their processes are gone): free the devices they held, cancel
        their waits, and hand the devices on."""
        gone = set(workers)
        for d in [d for d, members in self._members.items() if members & gone]:
            self._members[d] -= gone
            if not self._members[d]:
                del self._holder[d], self._members[d]
                self._produced.pop(d, None)
        for w in [w for w in self._waiters if w.worker in gone]:
            self._waiters.remove(w)
            if not w.granted.done():
                w.granted.cancel()
        self._grant()

    def _grant(self) -> None:
        """Hand free devices to waiters: consumers of what was just produced first, then FIFO."""

        def priority(w: _Waiter) -> tuple[bool, int]:
            fed = any(w.consumes & self._last_products.get(d, frozenset()) for d in w.devices)
            return (not fed, w.seq)

        for waiter in sorted(self._waiters, key=priority):
            # A device is available when free, or held by the waiter's own sharing party.
            if any(self._holder.get(d, waiter.party) != waiter.party for d in waiter.devices):
                continue
            if waiter.party == waiter.worker and any(d in self._holder for d in waiter.devices):
                continue
            for d in waiter.devices:
                self._holder[d] = waiter.party
                self._members.setdefault(d, set()).add(waiter.worker)
            self._waiters.remove(waiter)
            self._record(waiter.devices, waiter.worker, "acquire")
            waiter.granted.set_result(True)

    def _record(self, devices: Iterable[int], worker: str, event: str) -> None:
        now = time.time()
        self._trace.extend(LockEvent(now, d, worker, event) for d in devices)

    def trace(self) -> list[tuple]:
        return [tuple(e) for e in self._trace]

    async def clear_trace(self) -> None:
        self._trace.clear()

    def num_waiters(self, device: int | None = None) -> int:
        return sum(device is None or device in w.devices for w in self._waiters)

    def holder(self, device: int) -> str | None:
        members = self._members.get(device)
        return ",".join(sorted(members)) if members else None


_ServiceActor = ray.remote(num_cpus=0)(_LockService)


class DeviceLock:
    """Handle to the cluster's device-lock service (created on first use, named, picklable).

    Workers normally use ``with self.device_lock(consumes=[...]):`` (see ``Worker``), which wraps
    :meth:`acquire`, ``onload()``, ``offload()`` and :meth:`release`.
    """

    def __init__(self, actor) -> None:
        self._actor = actor

    @classmethod
    def connect(cls) -> "DeviceLock":
        """The lock service of this Ray namespace, created (owned by the caller) if absent."""
        # Detached: the service must outlive whichever process created it first (a worker may
        # connect before the driver does); it ends with the Ray cluster or its namespace's jobs.
        # On the creator's node (the driver's, normally; hard: a soft affinity may spill to
        # another node): Ray's default could put it on any node, and losing that node would
        # take every group's device locks with it.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        actor = _ServiceActor.options(
            name=_SERVICE_NAME, get_if_exists=True, max_concurrency=4096, lifetime="detached",
            scheduling_strategy=here,
        ).remote()
        return cls(actor)

    def acquire(
        self,
        worker: str,
        devices: Sequence[int],
        consumes: Sequence[str] = (),
        timeout: float | None = None,
        share: str | None = None,
    ) -> None:
        """Block until ``worker`` holds every device in ``devices``.

        Args:
            worker: Holder name (unique per worker process).
            devices: Global device ids, taken all at once.
            consumes: Channel names this worker reads; gives priority after their producers.
            timeout: Seconds to wait; None waits forever.
            share: Name of a sharing party: workers acquiring with the same ``share`` may hold
                the devices together (e.g. env and rollout workers that step and generate in
                lockstep during a rollout); the devices are free again when the last member
                releases. None holds them exclusively.

        Raises:
            TimeoutError: If the devices stayed busy for ``timeout`` seconds.
        """
        if not ray.get(
            self._actor.acquire.remote(worker, list(devices), list(consumes), timeout, share)
        ):
            raise TimeoutError(
                f"{worker} waited {timeout} s for devices {list(devices)}; another worker holds "
                f"them (see DeviceLock.trace()) - raise the timeout or fix the holder."
            )

    def release(self, worker: str, devices: Sequence[int], produced: Iterable[str] = ()) -> None:
        """Release ``devices``; ``produced`` names the channels put into while holding them.

        Raises:
            RuntimeError: (from the service) if ``worker`` does not hold the devices.
        """
        ray.get(self._actor.release.remote(worker, list(devices), sorted(produced)))

    def evict(self, workers: Sequence[str], timeout: float = 30.0) -> None:
        """Free whatever ``workers`` (``"<group>[<rank>]"`` names of killed processes) held or
        waited for, so that workers started in their place are not blocked by them."""
        ray.get(self._actor.evict.remote(list(workers)), timeout=timeout)

    def trace(self) -> list[LockEvent]:
        """Every request/acquire/release so far, in order."""
        return [LockEvent(*e) for e in ray.get(self._actor.trace.remote())]

    def clear_trace(self) -> None:
        """Forget the trace (e.g. between tests)."""
        ray.get(self._actor.clear_trace.remote())

    def num_waiters(self, device: int | None = None) -> int:
        """Workers waiting (for ``device``, or for any device)."""
        return ray.get(self._actor.num_waiters.remote(device))

    def holder(self, device: int) -> str | None:
        """Name of the worker holding ``device``, or None."""
        return ray.get(self._actor.holder.remote(device))
