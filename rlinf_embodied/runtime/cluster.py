"""Cluster: start an embedded Ray or attach to a running one, and number its devices globally.

Paper section 4: RLinf uses Ray for cluster management but places workers on global device ids.
Here each node contributes its GPUs in order; a node without GPUs contributes
``num_cpu_devices`` CPU device slots, so placement plans behave the same on a laptop.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

import ray

from rlinf_embodied.runtime.device import CPU, GPU, RAY_GPU_RESOURCE, Device

DEFAULT_NUM_CPU_DEVICES = 3
"""CPU device slots per GPU-less node: three, so every shipped placement runs on a laptop or CI
machine (disaggregated needs one device per group: env, rollout, actor)."""


WORKER_NICENESS = "0"
"""Nice value of the embedded Ray's worker processes (``RAY_worker_niceness``; set that variable
yourself to override). Ray starts workers at nice 15 by default so that its driver stays
responsive, but here the workers do all the compute: at nice 15 any other process on the
machine (measured: a single-process baseline loop, a second job, a test run) takes the cores
from them first."""

_RAY_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"


def _local_token_notice(record: logging.LogRecord) -> bool:
    """Drop Ray's "Token authentication is enabled" notice, logged on every start of an
    embedded local Ray (auth stays on; only the notice goes)."""
    return "Token authentication is enabled" not in record.getMessage()


class Cluster:
    """The Ray cluster and its global device list.

    Args:
        address: Ray address to attach to (``"auto"``, ``"ray://..."``, ``"host:port"``). None
            starts an embedded local Ray, unless Ray is already initialised in this process, in
            which case that instance is used and left running on :meth:`shutdown`.
        num_cpus: CPUs of the embedded Ray; None uses the machine's CPU count. Ignored when
            attaching.
        num_cpu_devices: Device slots for each node without GPUs (>= 1).
        log_to_driver: Forward worker stdout/stderr to the driver. Keep True for interactive
            runs; benchmarks and tests turn it off to keep their output clean.
        namespace: Ray namespace of the embedded Ray or attached job; named channels and the
            device-lock service live in it.

    Raises:
        ValueError: If ``num_cpu_devices`` < 1.
        RuntimeError: If the cluster has no alive node.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: int | None = None,
        num_cpu_devices: int = DEFAULT_NUM_CPU_DEVICES,
        log_to_driver: bool = True,
        namespace: str = "rlinf_embodied",
    ) -> None:
        if num_cpu_devices < 1:
            raise ValueError(f"Set num_cpu_devices to at least 1 (got {num_cpu_devices}).")
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            init_kwargs = dict(namespace=namespace, log_to_driver=log_to_driver)
            if address is None:
                init_kwargs.update(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False)
                os.environ.setdefault("RAY_worker_niceness", WORKER_NICENESS)  # read by the raylet
                logging.getLogger(_RAY_TOKEN_LOGGER).addFilter(_local_token_notice)
            # "local" always starts a new embedded Ray: without it ray.init attaches to any
            # cluster a `ray start` left running on the machine (another user's, another job's).
            ray.init(address=address or "local", **init_kwargs)
        self.num_cpu_devices = num_cpu_devices
        self.devices: list[Device] = self._enumerate_devices()
        self._node_cpus = {n["NodeID"]: int(n["Resources"].get("CPU", 1)) for n in _alive_nodes()}

    def _enumerate_devices(self) -> list[Device]:
        nodes = _alive_nodes()
        if not nodes:
            raise RuntimeError("The Ray cluster has no alive node; check `ray status`.")
        here = ray.get_runtime_context().get_node_id()
        # The driver's node first, then a stable order, so device 0 is local when possible.
        nodes.sort(key=lambda n: (n["NodeID"] != here, n["NodeManagerAddress"], n["NodeID"]))
        devices: list[Device] = []
        for node in nodes:
            num_gpus = int(node["Resources"].get(RAY_GPU_RESOURCE, 0))
            kind, count = (GPU, num_gpus) if num_gpus else (CPU, self.num_cpu_devices)
            for local in range(count):
                devices.append(
                    Device(len(devices), node["NodeID"], node["NodeManagerAddress"], kind, local)
                )
        return devices

    @property
    def num_devices(self) -> int:
        """Number of global devices."""
        return len(self.devices)

    def device(self, global_id: int) -> Device:
        """The device with ``global_id``.

        Raises:
            IndexError: If the id is outside 0..num_devices-1.
        """
        if not 0 <= global_id < self.num_devices:
            raise IndexError(
                f"Device id {global_id} is outside this cluster's devices 0-{self.num_devices - 1}."
            )
        return self.devices[global_id]

    def node_cpus(self, node_id: str) -> int:
        """CPUs Ray reports for a node (used to size worker thread pools)."""
        return self._node_cpus.get(node_id, 1)

    def devices_of(self, ids: Sequence[int]) -> list[Device]:
        """The devices with the given global ids, in that order."""
        return [self.device(i) for i in ids]

    def describe(self) -> str:
        """One line per node: its ip and device ids."""
        by_node: dict[str, list[Device]] = {}
        for d in self.devices:
            by_node.setdefault(d.node_ip, []).append(d)
        lines = [f"cluster: {self.num_devices} devices on {len(by_node)} node(s)"]
        for ip, devs in by_node.items():
            lines.append(f"  {ip}: {devs[0].kind} devices {[d.global_id for d in devs]}")
        return "\n".join(lines)

    def shutdown(self) -> None:
        """Stop Ray if this Cluster started it; leave an attached or pre-existing Ray running."""
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()


def _alive_nodes() -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]
