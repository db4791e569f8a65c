"""Cluster: start an embedded Ray or attach to a running one, and number its devices globally.

Paper section 4: RLinf uses Ray for cluster management but places workers on global device ids.
Here each *reserved* node contributes its GPUs in order; a node without GPUs contributes
``num_cpu_devices`` CPU device slots, so placement plans behave the same on a laptop. Nodes that
advertise the preemptible resource (RLBoost's spot / spare capacity) get no device ids: placed
groups never run there, only the elastic rollout workers, which survive losing them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from typing import Iterator, Sequence

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
        preemptible_resource: Ray custom resource that marks preemptible nodes: such nodes get
            no device ids (empty: every node is reserved).

    Raises:
        ValueError: If ``num_cpu_devices`` < 1.
        RuntimeError: If the cluster has no alive reserved node.
        AttachError: attaching failed: nothing answers at ``address`` or Ray's token
            authentication refused it (the message names the fix).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: int | None = None,
        num_cpu_devices: int = DEFAULT_NUM_CPU_DEVICES,
        log_to_driver: bool = True,
        namespace: str = "rlinf_embodied",
        preemptible_resource: str = "",
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
            why = unreachable(address)
            if why is not None:  # ray.init retries an address nobody listens on for good
                raise AttachError(why)
            # An embedded Ray: a Ctrl-C is held while ray.init starts its processes (see
            # _ctrl_c_held), then Ray is stopped and the Ctrl-C goes on.
            held = _ctrl_c_held() if address is None else contextlib.nullcontext([])
            try:
                with held as interrupts:
                    ray.init(address=address or "local", **init_kwargs)
            except Exception as exc:  # noqa: BLE001 - say how to attach, not only Ray's words
                if not interrupts:  # (after a Ctrl-C, the Ctrl-C is what is reported)
                    hint = attach_hint(exc, address)
                    if hint is None:
                        raise
                    raise AttachError(hint) from exc
            if interrupts:  # ray.shutdown knows every process ray.init started now
                ray.shutdown()
                _deliver(interrupts[0])
        self.num_cpu_devices = num_cpu_devices
        self.preemptible_resource = preemptible_resource
        try:
            self.refresh()
        except BaseException:  # a Ctrl-C or no reserved node: stop the Ray this Cluster started
            self.shutdown()
            raise

    def refresh(self, exclude: Sequence[str] = ()) -> None:
        """Number the devices again from the nodes alive now, leaving out the node ids in
        ``exclude`` and nodes whose raylet is gone (:func:`raylet_gone`) while Ray still lists
        them as alive (for about 15 s after a node dies).

        Raises:
            RuntimeError: If no reserved node is alive.
        """
        nodes = [n for n in _alive_nodes() if n["NodeID"] not in set(exclude) and not raylet_gone(n)]
        self.preemptible_nodes = [n for n in nodes if is_preemptible(n, self.preemptible_resource)]
        """Alive nodes that advertise ``preemptible_resource`` (``ray.nodes()`` entries): no
        device ids, elastic workers only."""
        self.devices: list[Device] = []
        self.devices = self._enumerate_devices(
            [n for n in nodes if not is_preemptible(n, self.preemptible_resource)])
        self._node_cpus = {n["NodeID"]: int(n["Resources"].get("CPU", 1)) for n in nodes}

    def _enumerate_devices(self, nodes: list[dict]) -> list[Device]:
        if not nodes:
            raise RuntimeError(
                "The Ray cluster has no alive reserved node"
                + (f" (every node advertises {self.preemptible_resource!r}: "
                   f"{', '.join(node_label(n) for n in self.preemptible_nodes)})"
                   if self.preemptible_nodes else "")
                + "; placed groups run only on reserved nodes: start one without the "
                "preemptible resource, and check `ray status`.")
        here = ray.get_runtime_context().get_node_id()
        # The driver's node first, then a stable order, so device 0 is local when possible.
        nodes = sorted(nodes, key=lambda n: (n["NodeID"] != here, n["NodeManagerAddress"], n["NodeID"]))
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
        """One line per node: reserved nodes with their device ids, then the preemptible ones."""
        by_node: dict[str, list[Device]] = {}
        for d in self.devices:
            by_node.setdefault(d.node_id, []).append(d)
        pre = len(self.preemptible_nodes)
        lines = [f"cluster: {self.num_devices} devices on {len(by_node)} reserved node(s)"
                 + (f", {pre} preemptible node(s)" if pre else "")]
        for devs in by_node.values():
            lines.append(f"  reserved     {devs[0].node_ip} ({devs[0].node_id[:8]}): {devs[0].kind} "
                         f"devices {[d.global_id for d in devs]}")
        for n in self.preemptible_nodes:
            lines.append(f"  preemptible  {node_label(n)}: no placed groups, elastic workers only "
                         f"(advertises {self.preemptible_resource!r})")
        return "\n".join(lines)

    def placement_error(self, error: Exception) -> str:
        """``error`` (a placement that does not fit the reserved devices) as one line naming the
        reserved and preemptible nodes."""
        by_node: dict[str, list[int]] = {}
        for d in self.devices:
            by_node.setdefault(f"{d.node_ip} ({d.node_id[:8]})", []).append(d.global_id)
        reserved = "; ".join(f"{k} devices {v[0]}-{v[-1]}" if len(v) > 1 else f"{k} device {v[0]}"
                             for k, v in by_node.items())
        text = " ".join(str(error).split())
        if not self.preemptible_nodes:
            return f"{text} (reserved nodes: {reserved})"
        pre = ", ".join(node_label(n) for n in self.preemptible_nodes)
        return (f"{text} (reserved nodes: {reserved}; preemptible nodes, which take no placed "
                f"group: {pre})")

    def shutdown(self) -> None:
        """Stop Ray if this Cluster started it; leave an attached or pre-existing Ray running."""
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[list]:
    """Hold a SIGINT (Ctrl-C) that arrives in the ``with`` block, which starts an embedded Ray.

    Why: ``ray.init`` starts the GCS, the raylet (which starts the dashboard and runtime-env
    agents and idle workers), the log monitor, ...; but it records them (``ray.shutdown``'s
    list, also run at exit) only once they are all up. A KeyboardInterrupt raised before that
    loses the list: the GCS and the raylet die with this process (Ray starts them with
    PR_SET_PDEATHSIG), the raylet's children do not, and they linger a minute or more
    retrying the dead GCS (measured: ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent``
    ~65 s after a Ctrl-C during ``train``'s start-up).

    So while the block runs, SIGINT calls the handler that was installed (its message prints
    at once: the CLI's "Ctrl-C: stopping before training started") but what it raises is
    held; the yielded list receives it (None for SIG_DFL: the default action, re-delivered
    by :func:`_deliver`). The caller shuts Ray down and then delivers it. The wait is
    ``ray.init``'s own start-up (its waits time out). Outside the main thread, or with SIGINT
    ignored or set outside Python, nothing is held. SIGTERM is not held: ``ray.init`` installs
    its own SIGTERM handler first thing.
    """
    held: list = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    prev = signal.getsignal(signal.SIGINT)
    if not (callable(prev) or prev == signal.SIG_DFL):
        yield held
        return

    def hold(signum, frame) -> None:
        if not callable(prev):
            held.append(None)
            return
        try:
            prev(signum, frame)  # a handler that only sets a flag has had its effect
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt, SystemExit: held
            held.append(exc)

    signal.signal(signal.SIGINT, hold)
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, prev)


def _deliver(interrupt: BaseException | None) -> None:
    """Raise the exception :func:`_ctrl_c_held` held, or re-send SIGINT to this process (its
    default action, with the handler restored) when it held None."""
    if interrupt is not None:
        raise interrupt
    os.kill(os.getpid(), signal.SIGINT)
    raise KeyboardInterrupt  # reached only if the default action did not end the process


def _alive_nodes() -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def is_preemptible(node: dict, resource: str) -> bool:
    """Whether ``ray.nodes()`` entry ``node`` advertises the preemptible ``resource``."""
    return bool(resource) and node.get("Resources", {}).get(resource, 0) > 0


def node_label(node: dict) -> str:
    """``ip (node id prefix)`` of a ``ray.nodes()`` entry, as placement messages name nodes."""
    return f"{node['NodeManagerAddress']} ({node['NodeID'][:8]})"


def raylet_gone(node: dict, timeout: float = 0.2) -> bool:
    """Whether the raylet of ``ray.nodes()`` entry ``node`` is certainly gone: a TCP connect to
    its node-manager port is refused (the process no longer listens while its machine is up).

    The driver sees this within a fraction of a second, where Ray's own health checks take
    seconds (its task calls fail after ~3 s, the GCS declares the node dead after ~15 s with
    the defaults). A timeout or an unreachable host is *not* taken as gone (a busy or
    partitioned network); Ray's own detection covers those.
    """
    try:
        return port_refused(node["NodeManagerAddress"], int(node["NodeManagerPort"]), timeout)
    except (KeyError, ValueError):
        return False


def port_refused(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether a TCP connect to ``host:port`` is refused (nothing listens there while the host
    is up); a timeout or an unreachable host is not a refusal."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


class AttachError(RuntimeError):
    """Attaching to the Ray cluster at an address failed; the message says how to fix it."""


def unreachable(address: str | None, timeout_s: float = 5.0) -> str | None:
    """Why ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``) cannot be attached to, found by
    a TCP connection to its port within ``timeout_s``; None when it answers or is not a
    host-and-port address (None, ``auto``, ``local``). ``ray.init`` itself keeps retrying an
    address nobody listens on, logging "Failed to connect to GCS" every few seconds."""
    if address is None or address in ("auto", "local"):
        return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not (host and port.isdigit()):
        return None
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        return (f"cannot reach a Ray cluster at {address} ({reason}): start its head there "
                f"(`ray start --head --port {port}` on {host}), fix cluster.address, or leave "
                "it null for a Ray of this process.")
    return None


def attach_hint(exc: BaseException, address: str | None) -> str | None:
    """What to do when attaching to ``address`` failed with ``exc``, or None when there is
    nothing to add: Ray's token authentication (on by default for ``ray start --head`` since
    Ray 2.5x) needs ``RAY_AUTH_MODE=token`` and the head's token in the driver's environment."""
    chain, e = [], exc
    while e is not None and len(chain) < 5:  # Ray wraps the AuthenticationError in others
        chain.append(e)
        e = e.__cause__ or e.__context__
    lines = [ln.strip() for e in chain for ln in str(e).splitlines()]
    text = next((ln for ln in lines if "InvalidAuthToken" in ln or "AuthenticationError" in ln), None)
    if text is None:
        return None
    mode = os.environ.get("RAY_AUTH_MODE")
    return (f"cannot attach to the Ray cluster at {address}: {text[:200]}. The head "
            f"uses token authentication: set RAY_AUTH_MODE=token (now "
            f"{mode if mode is not None else 'unset'}) and make the head's token available "
            f"(copy its ~/.ray/auth_token here, or set RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN; "
            f"docs/elastic.md).")
