"""The M2Flow runtime on Ray (paper sections 3.2-3.5, 4): cluster, workers, channels, device
locks and placement. It knows nothing about robots or models.

Importing this package imports Ray; ``import rlinf_embodied`` alone does not.
"""

from rlinf_embodied.runtime.calls import (
    CallHandle,
    CallTiming,
    RemoteError,
    WorkerDiedError,
    wait_all,
)
from rlinf_embodied.runtime.channel import Channel, ChannelTimeout, delete_channels
from rlinf_embodied.runtime.cluster import AttachError, Cluster
from rlinf_embodied.runtime.device import Device
from rlinf_embodied.runtime.device_lock import DeviceLock, LockEvent
from rlinf_embodied.runtime.inflight import flush_puts, release_prefetched
from rlinf_embodied.runtime.placement import GroupPlacement, PlacementError, PlacementPlan
from rlinf_embodied.runtime.worker import PerRank, Worker, WorkerGroup

__all__ = [
    "CallHandle",
    "CallTiming",
    "Channel",
    "ChannelTimeout",
    "AttachError",
    "Cluster",
    "Device",
    "DeviceLock",
    "GroupPlacement",
    "LockEvent",
    "PerRank",
    "PlacementError",
    "PlacementPlan",
    "RemoteError",
    "Worker",
    "WorkerDiedError",
    "WorkerGroup",
    "delete_channels",
    "flush_puts",
    "release_prefetched",
    "wait_all",
]
