"""Real multi-node Ray on one machine: a head raylet plus worker raylets, each with its own
resources, so placement spans nodes and a node can be killed (tests, benchmarks, trying the
elastic path without a second machine). Built on :class:`ray.cluster_utils.Cluster`.

A real cluster needs none of this: start Ray on each machine (``ray start --head`` on one,
``ray start --address=<head>:6379`` on the others) and set ``cluster.address`` (docs/elastic.md).
"""

from __future__ import annotations

import socket
import time
from typing import Dict, List, Optional

__all__ = ["LocalMultiNodeCluster"]

FAST_FAILURE_DETECTION = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
"""Head node settings: a killed node is declared dead after about 2 s (Ray's defaults take
tens of seconds), so tests and benchmarks see a preemption quickly."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _own_ports() -> Dict[str, int]:
    """Ports every raylet of this cluster gets for itself: the defaults (e.g. the dashboard
    agent's 52365) clash with any other Ray instance on the machine."""
    return {k: _free_port() for k in ("dashboard_agent_listen_port", "metrics_agent_port",
                                      "metrics_export_port", "runtime_env_agent_port")}


class LocalMultiNodeCluster:
    """A head node, ``preemptible_nodes`` preemptible worker nodes and ``reserved_nodes``
    reserved ones on this machine; the driver connects.

    Args:
        head_cpus: Ray CPUs of the head (the reserved node: driver, actor, reserved workers).
        preemptible_nodes: worker nodes to start, each advertising ``resource``.
        reserved_nodes: worker nodes without it (they get device ids: placed groups may run
            there, see :class:`~rlinf_embodied.runtime.Cluster`).
        node_cpus: Ray CPUs of each worker node (workers use ``num_cpus=0``; this only sizes
            Ray's own pools).
        resource: custom resource marking the worker nodes (``elastic.preemptible_resource``).
        namespace: Ray namespace of the driver.
        start_retries: extra attempts when a raylet fails to start (it waits a fixed 15-30 s
            for its agents, which a loaded machine can exceed).

    Implements :class:`~rlinf_embodied.elastic.pool.NodeProvider` (``kill_node``,
    ``restore_node``). Use as a context manager; it shuts Ray and every node down on exit.
    """

    def __init__(self, head_cpus: int = 2, preemptible_nodes: int = 1, node_cpus: int = 2,
                 resource: str = "preemptible", namespace: str = "rlinf_embodied",
                 start_retries: int = 2, reserved_nodes: int = 0) -> None:
        import ray
        from ray.cluster_utils import Cluster

        if ray.is_initialized():
            raise RuntimeError("Ray is already initialised in this process; call ray.shutdown() "
                               "(or run in a fresh process) before starting a local multi-node cluster.")
        self.node_cpus, self.resource, self.retries = node_cpus, resource, start_retries
        self.killed: List[str] = []
        for attempt in range(start_retries + 1):
            try:
                self._cluster = Cluster(initialize_head=True, connect=False, head_node_args=dict(
                    num_cpus=head_cpus, include_dashboard=False, _system_config=FAST_FAILURE_DETECTION,
                    **_own_ports()))
                break
            except Exception:  # noqa: BLE001 - raylet start timed out: retry on fresh ports
                if attempt == start_retries:
                    raise
                time.sleep(1.0)
        self._nodes = {}
        self.reserved = []
        try:
            for _ in range(reserved_nodes):
                self.reserved.append(self._add({}).node_id)
            for _ in range(preemptible_nodes):
                self.restore_node()
            ray.init(address=self._cluster.address, namespace=namespace, log_to_driver=False)
        except BaseException:
            self._cluster.shutdown()
            raise
        self.head_node_id = ray.get_runtime_context().get_node_id()

    @property
    def address(self) -> str:
        """The head's GCS address (what ``cluster.address`` would be set to)."""
        return self._cluster.address

    def worker_node_ids(self) -> List[str]:
        """Node ids of the live preemptible worker nodes, in start order."""
        return list(self._nodes)

    def _add(self, resources: dict):
        for attempt in range(self.retries + 1):
            try:
                node = self._cluster.add_node(num_cpus=self.node_cpus, resources=resources,
                                              **_own_ports())
                break
            except Exception:  # noqa: BLE001
                if attempt == self.retries:
                    raise
                time.sleep(1.0)
        self._cluster.wait_for_nodes()
        return node

    def restore_node(self) -> str:
        """Start one worker node (with ``resource``) and wait until it is alive; returns its id."""
        node = self._add({self.resource: 1})
        self._nodes[node.node_id] = node
        return node.node_id

    def kill_node(self, node_id: str) -> None:
        """Kill a worker node's raylet and every process on it (no graceful drain)."""
        node = self._nodes.pop(node_id, None)
        if node is None:
            raise KeyError(f"{node_id} is not a live worker node of this cluster "
                           f"(live: {self.worker_node_ids()}); the head cannot be killed.")
        self._cluster.remove_node(node, allow_graceful=False)
        self.killed.append(node_id)

    def shutdown(self) -> None:
        """Disconnect the driver and stop every node."""
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self._cluster.shutdown()

    def __enter__(self) -> "LocalMultiNodeCluster":
        return self

    def __exit__(self, *exc) -> Optional[bool]:
        self.shutdown()
        return None
