"""Surviving the loss of a placed group's rank or node (``trainer.max_restarts``).

When an iteration fails, the runner asks which ranks of its placed groups (env, rollout,
actor) are gone (:func:`lost_ranks`). None: the failure is a bug and the run stops as before.
When its own Ray is gone (the cluster's head, :func:`ray_head_gone`, or the driver's node,
:func:`driver_node_gone`), nothing can start again from this process: it stops at once.
Some: the runner stops the groups, waits for reserved capacity that fits its placement
(:func:`wait_for_capacity`: a lost node coming back, or what is left), starts the groups again
from the newest complete checkpoint and runs the iterations since it again, as ``train
--resume`` would (so the result equals a run stopped and resumed there by hand). It does so at
most ``trainer.max_restarts`` times, the way Ray Train's ``FailureConfig(max_failures)`` and
torchrun's ``--max-restarts`` bound theirs; then, or when no capacity fits, it stops with
:class:`RunLostError`, whose message says why (the CLI adds the resume command).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Dict, List, Optional

import ray

from rlinf_embodied.runtime import RemoteError, WorkerDiedError

__all__ = [
    "RANK_LOSS_ERRORS", "RayGoneError", "RunLostError", "driver_node_gone", "exit_now",
    "lost_ranks", "ray_head_gone", "wait_for_capacity",
]

RANK_LOSS_ERRORS = (WorkerDiedError, RemoteError, ray.exceptions.RayActorError)
"""Errors after which the runner looks for lost ranks: a dead rank's call, or a surviving
rank's error (e.g. a collective whose peer died), or a Ray actor error."""

PING_TIMEOUT_S = 30.0
"""Seconds a rank may take to answer the liveness ping before it counts as lost."""

CAPACITY_POLL_S = 1.0
"""Seconds between looks at the cluster while a restart waits for capacity."""


class RunLostError(RuntimeError):
    """The run cannot go on: ``trainer.max_restarts`` is used up, or no reserved capacity
    fits the placement within ``trainer.restart_wait_s``."""


class RayGoneError(RunLostError):
    """The run's own Ray died under it (:func:`ray_head_gone`, :func:`driver_node_gone`). The
    command that catches it says what is saved and then exits with :func:`exit_now`: Ray's
    exit hooks would wait for the dead GCS until Ray's core worker aborts the process."""


def lost_ranks(groups: Dict[str, object], timeout: float = PING_TIMEOUT_S) -> List[str]:
    """``"<group>[rank r] on <node ip>"`` of every rank of ``groups`` (name -> WorkerGroup)
    that is gone (:meth:`~rlinf_embodied.runtime.WorkerGroup.lost_ranks`)."""
    out = []
    for name, group in groups.items():
        for r in group.lost_ranks(timeout):
            out.append(f"{name}[rank {r}] on {group.rank_devices[r][0].node_ip}")
    return out


def lost_nodes(groups: Dict[str, object]) -> List[str]:
    """Node ids that hosted ranks of ``groups`` and whose raylet is gone or that Ray lists as
    dead (to leave out of the device count before Ray itself notices)."""
    from rlinf_embodied.runtime.cluster import raylet_gone

    nodes = {n["NodeID"]: n for n in ray.nodes()}
    used = {devs[0].node_id for g in groups.values() for devs in g.rank_devices}
    return sorted(n for n in used if n not in nodes or not nodes[n].get("Alive")
                  or raylet_gone(nodes[n]))


def ray_head_gone(timeout: float = 0.5) -> Optional[str]:
    """Why no restart can help when the Ray cluster's head (its GCS) refuses connections, else
    None. Found with a TCP connect to the GCS address, not a Ray call: with the GCS gone every
    Ray call blocks, and Ray's core worker ends the process 60 s after losing it ("Failed to
    connect to GCS within 60 seconds"), so the run must say what is saved before then. A timeout
    is not taken as gone (a busy network); Ray's own detection covers it."""
    from rlinf_embodied.runtime.cluster import port_refused

    address = ray.get_runtime_context().gcs_address
    host, _, port = address.rpartition(":")
    if not port.isdigit() or not port_refused(host, int(port), timeout):
        return None
    return (f"the Ray cluster's head (GCS at {address}) is gone (`ray stop`, an OOM kill, a "
            f"crash), so no group can start again from this process")


def driver_node_gone(gone: List[str]) -> Optional[str]:
    """Why no restart can help when the driver's own Ray node is among ``gone`` (node ids), else
    None. The driver reaches Ray through its node's raylet; with that raylet dead (``ray stop``,
    an OOM kill, a crash) nothing can be placed from this process again, so waiting
    ``trainer.restart_wait_s`` for capacity only delays the error (measured: 308 s to the same
    message with the default 300 s)."""
    node = ray.get_runtime_context().get_node_id()
    if node not in gone:
        return None
    return (f"the Ray node this run's driver is on ({node[:12]}) is gone (its raylet was stopped "
            f"or killed: `ray stop`, an OOM kill, a crash), so no group can start again from this "
            f"process")


def wait_for_capacity(cluster, shape: Callable[[int], Optional[dict]], wanted: dict,
                      wait_s: float, exclude: List[str], log: Callable[[str], None] = print) -> None:
    """Refresh ``cluster`` until its reserved devices give the placement the ranks it had.

    Args:
        cluster: the run's :class:`~rlinf_embodied.runtime.Cluster` (refreshed in place).
        shape: devices -> the groups' ranks on that many devices, or None when the placement
            does not fit them (or its envs do not split over the ranks).
        wanted: the ranks the groups had before the loss.
        wait_s: seconds to wait for ``wanted``; after that any shape that fits is taken.
        exclude: node ids known to be gone (left out even while Ray still lists them).
        log: where the waiting is reported (once).

    Raises:
        RunLostError: when nothing fits after ``wait_s`` seconds (the message names the
            reserved devices there are).
    """
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            cluster.refresh(exclude)
            have = shape(cluster.num_devices)
        except RuntimeError:  # no reserved node alive at the moment
            have = None
        if have == wanted:
            return
        if time.monotonic() >= deadline:
            if have is not None:
                log(f"restart: the placement had ranks {wanted}; after trainer.restart_wait_s="
                    f"{wait_s:g} it goes on with {have} on the {cluster.num_devices} reserved "
                    f"device(s) left (training differs from the run before the loss)")
                return
            raise RunLostError(
                f"no reserved capacity fits the placement after waiting trainer.restart_wait_s="
                f"{wait_s:g} s: it needs ranks {wanted}, the cluster has {cluster.num_devices} "
                f"reserved device(s)")
        if not said:
            log(f"restart: waiting up to {wait_s:g} s for reserved capacity (the placement had "
                f"ranks {wanted}; {cluster.num_devices} reserved device(s) now)")
            said = True
        time.sleep(CAPACITY_POLL_S)


def exit_now(code: int) -> None:
    """Exit with ``code`` at once, after a run whose Ray cluster died under it
    (:class:`RayGoneError`): the processes this one started (an embedded Ray's agents, an env
    pool) are killed, and Ray's exit hooks are skipped, since they would wait for the dead
    GCS until Ray's core worker aborts the process 60 s later."""
    import psutil

    sys.stdout.flush()
    sys.stderr.flush()
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass
    os._exit(code)
